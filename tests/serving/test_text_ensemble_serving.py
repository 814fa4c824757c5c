"""A text ensemble (packaged tokenizer + encoder, ``mme package --with-tokenizer``) on the real
Triton: an unchanged boto3 call with the artifact's text sample gets the encoder's outputs, on a
real-time endpoint (no TargetModel) and on a multi-model endpoint (one tarball, one target)."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import numpy as np
import pytest
import requests
from botocore.exceptions import ClientError

from bench.in_process import kserve_arrays, model_call
from mme.cli import main
from mme.progress import Reporter
from packager.manifest import Manifest
from serving.runtime.local_endpoint import LocalEndpoint, LocalEndpointOptions
from tests.serving.conftest import decode_kserve, header_size_of

MODEL = "prajjwal1/bert-tiny"

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def client(url: str):
    return boto3.client("sagemaker-runtime", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id="test", aws_secret_access_key="test")


@pytest.fixture(scope="module")
def text_artifact(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("text-serving")
    code = main(["-q", "package", MODEL, "--no-pretrained", "--with-tokenizer", "--formats", "cpu-local",
                 "--seq-len", "32", "--max-batch-size", "4", "--out", str(out)])
    assert code == 0
    return out / "prajjwal1--bert-tiny" / "cpu-local"


def expected(directory: Path, body: bytes) -> np.ndarray:
    """last_hidden_state of the packaged tokenizer + encoder run in-process on ``body``."""
    call, _, pipeline = model_call(directory)
    assert pipeline == "packaged tokenizer + encoder"
    return call(kserve_arrays(body))[0]


def outputs(body: bytes, content_type: str) -> dict[str, np.ndarray]:
    size = header_size_of(content_type)
    if size is None:
        reply = json.loads(body)
        return {o["name"]: np.asarray(o["data"], dtype=np.float32).reshape(o["shape"]) for o in reply["outputs"]}
    return decode_kserve(body, size)


def test_real_time_endpoint_answers_text_with_the_encoders_outputs(text_artifact):
    manifest = Manifest.load(text_artifact)
    sample = (text_artifact / manifest.sample_request.json_file).read_bytes()
    options = LocalEndpointOptions(models=str(text_artifact), port=0, server_kind="local", mode="single",
                                   endpoint_name="text")
    with LocalEndpoint(options, Reporter(quiet=True)) as endpoint:
        sm = client(endpoint.url)
        # the artifact's sample, unchanged: the article's sentence as a BYTES tensor, no TargetModel
        reply = sm.invoke_endpoint(EndpointName="text", ContentType="application/json", Body=sample)
        got = outputs(reply["Body"].read(), reply["ContentType"])
        assert set(got) == {o.name for o in manifest.outputs} == {"last_hidden_state", "pooler_output"}
        np.testing.assert_allclose(got["last_hidden_state"], expected(text_artifact, sample), atol=1e-4)
        assert got["last_hidden_state"].shape == (1, 32, 128)

        binary = (text_artifact / manifest.sample_request.binary_file).read_bytes()
        reply = sm.invoke_endpoint(EndpointName="text", ContentType=manifest.sample_request.binary_content_type,
                                   Body=binary)
        got = outputs(reply["Body"].read(), reply["ContentType"])
        np.testing.assert_allclose(got["last_hidden_state"], expected(text_artifact, sample), atol=1e-4)

        texts = ["Héllo, wörld!", "中文 and more", ""]
        batch = json.dumps({"inputs": [{"name": "TEXT", "shape": [3, 1], "datatype": "BYTES", "data": texts}]}).encode()
        reply = sm.invoke_endpoint(EndpointName="text", ContentType="application/json", Body=batch)
        got = outputs(reply["Body"].read(), reply["ContentType"])
        assert got["last_hidden_state"].shape == (3, 32, 128) and got["pooler_output"].shape == (3, 128)
        np.testing.assert_allclose(got["last_hidden_state"], expected(text_artifact, batch), atol=1e-4)

        # token ids where text is expected: the container's 400, as the model's error
        wrong = json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "INT64", "data": [7]}]})
        with pytest.raises(ClientError) as caught:
            sm.invoke_endpoint(EndpointName="text", ContentType="application/json", Body=wrong)
        assert caught.value.response["Error"]["Code"] == "ModelError"
        assert "expects 'BYTES'" in caught.value.response["Error"]["Message"]
        assert requests.get(f"{endpoint.url}/targets", timeout=10).json()["model"] == manifest.model


def test_multi_model_endpoint_loads_the_ensemble_as_one_target(text_artifact):
    manifest = Manifest.load(text_artifact)
    sample = (text_artifact / manifest.sample_request.json_file).read_bytes()
    options = LocalEndpointOptions(models=str(text_artifact), port=0, server_kind="local", endpoint_name="text-mme")
    with LocalEndpoint(options, Reporter(quiet=True)) as endpoint:
        assert requests.get(f"{endpoint.url}/targets", timeout=10).json()["targets"] == [manifest.tarball]
        reply = client(endpoint.url).invoke_endpoint(EndpointName="text-mme", TargetModel=manifest.tarball,
                                                     ContentType="application/json", Body=sample)
        got = outputs(reply["Body"].read(), reply["ContentType"])
        np.testing.assert_allclose(got["last_hidden_state"], expected(text_artifact, sample), atol=1e-4)
        counts = requests.get(f"{endpoint.url}/metrics.json", timeout=10).json()["counts"]
        assert counts["ModelLoads"] == 1  # the ensemble and its two steps, loaded as one target
