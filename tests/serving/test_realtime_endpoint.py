"""The local real-time (single-model) endpoint: Triton in SageMaker's single-model mode behind
the same front, a real boto3 client, no TargetModel."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import boto3
import numpy as np
import onnxruntime as ort
import pytest
import requests
from botocore.exceptions import ClientError

from mme.cli import main
from mme.errors import UsageError
from mme.progress import Reporter
from serving.runtime.local_endpoint import LocalEndpoint, LocalEndpointOptions
from serving.models.repository import prepare_repository
from serving.triton.config import TritonServerConfig
from serving.triton.sagemaker_serve import DEFAULT_MODEL_ENV, sagemaker_environment, serve_arguments

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def client(url: str):
    return boto3.client("sagemaker-runtime", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id="test", aws_secret_access_key="test")


@pytest.fixture(scope="module")
def realtime(packaged_test_resnet):
    options = LocalEndpointOptions(models=str(packaged_test_resnet.directory), port=0, server_kind="local",
                                   mode="single", endpoint_name="rt")
    with LocalEndpoint(options, Reporter(quiet=True)) as ep:
        yield ep


def json_logits(body: bytes) -> np.ndarray:
    (output,) = [o for o in json.loads(body)["outputs"] if o["name"] == "logits"]
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


def test_unchanged_boto3_call_without_target_model_gets_the_models_outputs(realtime, packaged_test_resnet):
    sample = json.loads(packaged_test_resnet.sample("json"))
    reply = client(realtime.url).invoke_endpoint(EndpointName="rt", ContentType="application/json",
                                                 Body=packaged_test_resnet.sample("json"))
    assert reply["InvokedProductionVariant"] == "AllTraffic"
    got = json_logits(reply["Body"].read())
    (pixels,) = sample["inputs"]
    x = np.asarray(pixels["data"], dtype=np.float32).reshape(pixels["shape"])
    session = ort.InferenceSession(str(packaged_test_resnet.onnx_file), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"pixel_values": x})
    np.testing.assert_allclose(got, want, atol=1e-4)
    # the model was loaded at start (Triton's --load-model), not by this request
    snapshot = requests.get(f"{realtime.url}/metrics.json", timeout=10).json()
    assert snapshot["mode"] == "single" and snapshot["counts"]["ModelLoads"] == 0
    assert snapshot["loaded_models"][0]["target"] == packaged_test_resnet.manifest.model
    assert requests.get(f"{realtime.url}/targets", timeout=10).json() == {
        "targets": [], "mode": "single", "model": packaged_test_resnet.manifest.model}


def test_a_target_model_gets_sagemakers_answer_for_a_real_time_endpoint(realtime, packaged_test_resnet):
    with pytest.raises(ClientError) as caught:
        client(realtime.url).invoke_endpoint(EndpointName="rt", TargetModel="test_resnet.tar.gz",
                                             ContentType="application/json", Body=packaged_test_resnet.sample("json"))
    error = caught.value.response["Error"]
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert error["Code"] == "ValidationError"
    assert error["Message"] == ("Endpoint rt is not a multi-model endpoint and does not support target model header.")
    with pytest.raises(ClientError) as other:
        client(realtime.url).invoke_endpoint(EndpointName="other", ContentType="application/json", Body=b"{}")
    assert other.value.response["Error"]["Code"] == "ValidationError"  # another endpoint's name, as on the MME


def test_a_bad_request_is_the_models_error_and_counted(realtime):
    before = requests.get(f"{realtime.url}/metrics.json", timeout=10).json()["counts"]
    with pytest.raises(ClientError) as caught:
        client(realtime.url).invoke_endpoint(EndpointName="rt", ContentType="application/json", Body=b'{"inputs": []}')
    assert caught.value.response["Error"]["Code"] == "ModelError"
    after = requests.get(f"{realtime.url}/metrics.json", timeout=10).json()["counts"]
    assert after["Invocations"] == before["Invocations"] + 1
    assert after["Invocation4XXErrors"] == before["Invocation4XXErrors"] + 1


def test_triton_killed_is_started_again_with_the_model(realtime, packaged_test_resnet):
    before = client(realtime.url).invoke_endpoint(EndpointName="rt", ContentType="application/json",
                                                  Body=packaged_test_resnet.sample("json"))
    os.kill(realtime.server.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while realtime.server.is_running() and time.monotonic() < deadline:
        time.sleep(0.05)
    reply = client(realtime.url).invoke_endpoint(EndpointName="rt", ContentType="application/json",
                                                 Body=packaged_test_resnet.sample("json"))
    np.testing.assert_allclose(json_logits(reply["Body"].read()), json_logits(before["Body"].read()), atol=1e-6)
    assert requests.get(f"{realtime.url}/metrics.json", timeout=10).json()["counts"]["ContainerRestarts"] >= 1


def test_serve_arguments_in_single_model_mode_are_serves():
    config = TritonServerConfig(default_model="ens")
    env = sagemaker_environment(config)
    assert "SAGEMAKER_MULTI_MODEL" not in env and env[DEFAULT_MODEL_ENV] == "ens"
    args = serve_arguments(env, model_repository="/opt/ml/model", default_model="ens")
    assert "--model-repository=/opt/ml/model" in args and args.index("--load-model=ens") > args.index(
        "--model-namespacing=true")
    assert "SAGEMAKER_MULTI_MODEL" in sagemaker_environment(TritonServerConfig())


def test_the_repository_is_chosen_as_serve_chooses_it(packaged_test_resnet, tmp_path):
    model = prepare_repository(str(packaged_test_resnet.directory), tmp_path / "a", {})
    assert model.default_model == packaged_test_resnet.manifest.model
    assert (model.repository / model.default_model / "config.pbtxt").is_file()
    with pytest.raises(UsageError, match="names no model directory"):
        prepare_repository(str(packaged_test_resnet.tarball), tmp_path / "b", {DEFAULT_MODEL_ENV: "nope"})
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.tar.gz", "b.tar.gz"):
        shutil.copy(packaged_test_resnet.tarball, two / name)
    with pytest.raises(UsageError, match="serves one model.tar.gz and .* holds 2 .*a.tar.gz, b.tar.gz"):
        prepare_repository(str(two), tmp_path / "c", {})


@pytest.mark.parametrize("argv, message", [
    (["--copies", "2"], "a real-time endpoint (--mode single) takes no TargetModel: drop --copies"),
    (["--models", "s3://bucket/prefix"], "--mode single serves a local model"),
])
def test_serve_single_refuses_in_one_line(packaged_test_resnet, capsys, argv, message):
    args = ["serve", "--mode", "single", "--models", str(packaged_test_resnet.directory), "--server", "local", *argv]
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
