"""The local MME end to end: a real boto3 client, the front, a real Triton (python backend)."""

from __future__ import annotations

import os
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import boto3
import numpy as np
import onnxruntime as ort
import pytest
import requests

from mme.progress import Reporter
from serving.runtime.local_endpoint import LocalEndpoint, LocalEndpointOptions
from tests.serving.conftest import decode_kserve, header_size_of

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def client(url: str):
    return boto3.client("sagemaker-runtime", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id="test", aws_secret_access_key="test")


@pytest.fixture(scope="module")
def models_dir(packaged_test_resnet, tmp_path_factory):
    """The artifact's tarball plus a corrupt one, as objects in a models directory."""
    root = tmp_path_factory.mktemp("models")
    shutil.copy(packaged_test_resnet.tarball, root / "test_resnet.tar.gz")
    data = packaged_test_resnet.tarball.read_bytes()
    (root / "broken.tar.gz").write_bytes(data[: len(data) // 2])
    return root


@pytest.fixture(scope="module")
def endpoint(models_dir):
    options = LocalEndpointOptions(models=str(models_dir), port=0, copies=8, server_kind="local")
    with LocalEndpoint(options, Reporter(quiet=True)) as ep:
        yield ep


def counts(ep) -> dict:
    return requests.get(f"{ep.url}/metrics.json", timeout=10).json()["counts"]


def test_boto3_invoke_returns_onnxruntime_logits(endpoint, packaged_test_resnet):
    sm = client(endpoint.url)
    body = packaged_test_resnet.sample("binary")
    reply = sm.invoke_endpoint(EndpointName="local", TargetModel="test_resnet-v1.tar.gz",
                               ContentType=packaged_test_resnet.binary_content_type, Body=body)
    assert reply["InvokedProductionVariant"] == "AllTraffic"
    got = decode_kserve(reply["Body"].read(), header_size_of(reply["ContentType"]))["logits"]
    x = decode_kserve(body, header_size_of(packaged_test_resnet.binary_content_type))["pixel_values"]
    session = ort.InferenceSession(str(packaged_test_resnet.onnx_file), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"pixel_values": x})
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_second_copy_loads_on_demand(endpoint, packaged_test_resnet):
    sm = client(endpoint.url)
    body = packaged_test_resnet.sample("json")
    sm.invoke_endpoint(EndpointName="local", TargetModel="test_resnet-v1.tar.gz", ContentType="application/json", Body=body)
    loads = counts(endpoint).get("ModelLoads", 0)
    sm.invoke_endpoint(EndpointName="local", TargetModel="test_resnet-v2.tar.gz", ContentType="application/json", Body=body)
    assert counts(endpoint)["ModelLoads"] == loads + 1
    loaded = {m["target"] for m in requests.get(f"{endpoint.url}/models", timeout=10).json()["models"]}
    assert {"test_resnet-v1.tar.gz", "test_resnet-v2.tar.gz"} <= loaded


def test_concurrent_first_requests_cause_one_load(endpoint, packaged_test_resnet):
    body = packaged_test_resnet.sample("json")
    before = counts(endpoint).get("ModelLoads", 0)

    def call(_):
        return client(endpoint.url).invoke_endpoint(
            EndpointName="local", TargetModel="test_resnet-v3.tar.gz", ContentType="application/json", Body=body)

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(call, range(8)))
    assert all(r["ResponseMetadata"]["HTTPStatusCode"] == 200 for r in replies)
    assert counts(endpoint)["ModelLoads"] == before + 1


def test_unknown_target_and_missing_target(endpoint, packaged_test_resnet):
    sm = client(endpoint.url)
    body = packaged_test_resnet.sample("json")
    with pytest.raises(sm.exceptions.ValidationError, match="no model 'nope.tar.gz'"):
        sm.invoke_endpoint(EndpointName="local", TargetModel="nope.tar.gz", ContentType="application/json", Body=body)
    with pytest.raises(sm.exceptions.ValidationError, match="TargetModel"):
        sm.invoke_endpoint(EndpointName="local", ContentType="application/json", Body=body)


def test_payload_over_the_real_time_limit(endpoint):
    """SageMaker answers 413 (aws/sagemaker-python-sdk#171); exactly the limit is accepted."""
    from botocore.exceptions import ClientError

    sm = client(endpoint.url)
    with pytest.raises(ClientError, match="HTTP content length exceeded 6291456 bytes") as info:
        sm.invoke_endpoint(EndpointName="local", TargetModel="test_resnet-v1.tar.gz",
                           ContentType="application/json", Body=b"x" * (6_291_456 + 1))
    assert info.value.response["Error"]["Code"] == "413"
    with pytest.raises(sm.exceptions.ModelError):  # at the limit: reaches the model, which refuses it
        sm.invoke_endpoint(EndpointName="local", TargetModel="test_resnet-v1.tar.gz",
                           ContentType="application/json", Body=b"x" * 6_291_456)


def test_corrupt_tarball_is_refused_without_poisoning_anything(endpoint, packaged_test_resnet):
    sm = client(endpoint.url)
    body = packaged_test_resnet.sample("json")
    for _ in range(2):  # refused each time: nothing half-extracted was cached
        with pytest.raises(sm.exceptions.ValidationError) as info:
            sm.invoke_endpoint(EndpointName="local", TargetModel="broken.tar.gz", ContentType="application/json", Body=body)
        message = info.value.response["Error"]["Message"]
        assert "broken.tar.gz" in message and message.endswith("Retrying will not help until this is fixed."), message
        assert ".download-" not in message  # the object, not the temporary file it was fetched into
    assert endpoint.cache.get("broken.tar.gz") is None
    reply = sm.invoke_endpoint(EndpointName="local", TargetModel="test_resnet-v1.tar.gz",
                               ContentType="application/json", Body=body)
    assert reply["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_model_error_from_the_container(endpoint):
    sm = client(endpoint.url)
    bad = b'{"inputs":[{"name":"pixel_values","shape":[1,3],"datatype":"FP32","data":[1,2,3]}]}'
    with pytest.raises(sm.exceptions.ModelError) as info:
        sm.invoke_endpoint(EndpointName="local", TargetModel="test_resnet-v1.tar.gz", ContentType="application/json", Body=bad)
    assert info.value.response["OriginalStatusCode"] == 400


def test_crashed_server_is_restarted_and_models_reload(endpoint, packaged_test_resnet):
    sm = client(endpoint.url)
    body = packaged_test_resnet.sample("json")
    sm.invoke_endpoint(EndpointName="local", TargetModel="test_resnet-v1.tar.gz", ContentType="application/json", Body=body)
    os.kill(endpoint.server.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while endpoint.server.is_running() is False and time.monotonic() < deadline:
        time.sleep(0.1)
    reply = sm.invoke_endpoint(EndpointName="local", TargetModel="test_resnet-v1.tar.gz",
                               ContentType="application/json", Body=body)
    assert reply["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert counts(endpoint)["ContainerRestarts"] >= 1


def test_lru_eviction_under_a_small_memory_limit(models_dir, packaged_test_resnet):
    # Room for the empty server and about two copies: cycling over five copies must evict,
    # and no request may fail.
    options = LocalEndpointOptions(models=str(models_dir), port=0, copies=5, server_kind="local",
                                   memory_limit_bytes=260 * 2**20, memory_threshold=0.9)
    body = packaged_test_resnet.sample("json")
    with LocalEndpoint(options, Reporter(quiet=True)) as ep:
        sm = client(ep.url)
        for i in [0, 1, 2, 3, 4, 0, 1]:
            reply = sm.invoke_endpoint(EndpointName="local", TargetModel=f"test_resnet-v{i}.tar.gz",
                                       ContentType="application/json", Body=body)
            assert reply["ResponseMetadata"]["HTTPStatusCode"] == 200
            snapshot = requests.get(f"{ep.url}/metrics.json", timeout=10).json()
            assert snapshot["gauges"]["MemoryUsedBytes"] <= 260 * 2**20
        assert snapshot["counts"]["ModelEvictions"] >= 3
        assert snapshot["counts"].get("Invocations.error", 0) == 0
        assert snapshot["gauges"]["LoadedModelCount"] < 5


def test_eviction_under_concurrent_load_fails_no_request(models_dir, packaged_test_resnet):
    # Six clients over four copies with room for about two: models are evicted and
    # reloaded while others serve, and a model with a request in flight is never unloaded.
    options = LocalEndpointOptions(models=str(models_dir), port=0, copies=4, server_kind="local",
                                   memory_limit_bytes=260 * 2**20, memory_threshold=0.9)
    body = packaged_test_resnet.sample("json")
    with LocalEndpoint(options, Reporter(quiet=True)) as ep:
        def calls(worker: int) -> list[int]:
            sm = client(ep.url)
            statuses = []
            for i in range(4):
                target = f"test_resnet-v{(worker + i) % 4}.tar.gz"
                reply = sm.invoke_endpoint(EndpointName="local", TargetModel=target,
                                           ContentType="application/json", Body=body)
                statuses.append(reply["ResponseMetadata"]["HTTPStatusCode"])
            return statuses

        with ThreadPoolExecutor(6) as pool:
            statuses = [s for worker in pool.map(calls, range(6)) for s in worker]
        snapshot = requests.get(f"{ep.url}/metrics.json", timeout=10).json()
    assert statuses == [200] * 24
    assert snapshot["counts"]["ModelEvictions"] >= 1
    assert snapshot["counts"].get("Invocations.model_error", 0) == 0
