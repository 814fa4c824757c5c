"""Models are loaded the way SageMaker loads them (reference notes, "What SageMaker's MME front
end and Triton's SageMaker mode actually do"; Triton src/sagemaker_server.cc): named by the
hash of their cache directory ``<root>/<hash>/model``, the target in the
``X-Amzn-SageMaker-Target-Model`` header of every load, invoke and unload. So valid S3 object
names with ``/``, ``+`` or spaces are served (loaded under their own name, they answered 404
forever: Triton does not URL-decode ``/models/<name>/invoke``).

A name with a space loads on native backends, but the python backend of Triton releases
before 25.08 starts its stub through ``bash -c`` with the model name unquoted
(python_backend src/stub_launcher.cc, fixed in r25.08), so on the wheel's Triton 2.51 (and
SageMaker's images up to 25.04) such a python-backend model fails to load: the endpoint
answers ModelError, as SageMaker would, and says why on its console."""

from __future__ import annotations

import io
import shutil

import boto3
import numpy as np
import pytest
import requests

from mme.progress import Reporter
from serving.cache import cache_key
from serving.container import ContainerClient
from serving.local_endpoint import LocalEndpoint, LocalEndpointOptions
from tests.serving.conftest import decode_kserve, header_size_of

HARD_TARGET = "dir/a+b.tar.gz"
SPACE_TARGET = "dir/a b.tar.gz"


@pytest.fixture(scope="module")
def endpoint(packaged_test_resnet, tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    (models / "dir").mkdir()
    shutil.copy(packaged_test_resnet.tarball, models / HARD_TARGET)
    shutil.copy(packaged_test_resnet.tarball, models / SPACE_TARGET)
    cache = tmp_path_factory.mktemp("cache")
    options = LocalEndpointOptions(models=str(models), port=0, server_kind="local", cache_dir=cache)
    log = io.StringIO()
    with LocalEndpoint(options, Reporter(stream=log, quiet=True)) as ep:
        ep.test_log = log
        yield ep


def runtime(url: str):
    return boto3.client("sagemaker-runtime", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id="test", aws_secret_access_key="test")


def test_a_target_with_slash_plus_and_space_is_served_through_boto3(endpoint, packaged_test_resnet):
    sm = runtime(endpoint.url)
    body = packaged_test_resnet.sample("binary")
    for _ in range(2):  # the cold request and a warm one
        reply = sm.invoke_endpoint(EndpointName="local", TargetModel=HARD_TARGET,
                                   ContentType=packaged_test_resnet.binary_content_type, Body=body)
        logits = decode_kserve(reply["Body"].read(), header_size_of(reply["ContentType"]))["logits"]
        assert logits.shape == (1, 1000) and np.isfinite(logits).all()


def ready_models(endpoint) -> dict[str, str]:
    """Triton's own repository index (KServe port): model name -> state."""
    index = requests.post(f"{endpoint.server.kserve_url}/v2/repository/index", json={}, timeout=10).json()
    return {entry["name"]: entry.get("state", "") for entry in index}


def test_the_container_holds_it_under_its_hash_loaded_from_root_hash_model(endpoint):
    key = cache_key(HARD_TARGET)
    assert len(key) == 32 and key.isalnum()  # matches Triton 2.70+'s [0-9A-Za-z._]+
    loaded = endpoint.endpoint.loaded_models()
    assert [m["target"] for m in loaded] == [HARD_TARGET]
    assert loaded[0]["model_dir"] == str(endpoint.cache.root / key / "model")
    # Triton named the model after the header, and knows nothing under the hash.
    states = ready_models(endpoint)
    assert states.get(HARD_TARGET) == "READY", states
    assert key not in states
    # Its SageMaker port keys the model by the hash: one entry (listed empty, as Triton lists a
    # model whose hash is not a model name); a second load of the hash is a conflict.
    with ContainerClient(endpoint.server.sagemaker_url) as control:
        raw = control.session.get(f"{endpoint.server.sagemaker_url}/models", timeout=10).json()["models"]
        assert len(raw) == 1
        again = control.session.post(f"{endpoint.server.sagemaker_url}/models",
                                     json={"model_name": key, "url": loaded[0]["model_dir"]},
                                     headers={"X-Amzn-SageMaker-Target-Model": HARD_TARGET}, timeout=60)
        assert again.status_code == 409


def test_a_python_backend_target_with_a_space_fails_like_sagemakers_triton_and_says_why(endpoint):
    sm = runtime(endpoint.url)
    with pytest.raises(sm.exceptions.ModelError) as info:
        sm.invoke_endpoint(EndpointName="local", TargetModel=SPACE_TARGET, ContentType="application/json", Body=b"{}")
    assert info.value.response["OriginalStatusCode"] == 400
    assert ready_models(endpoint).get(SPACE_TARGET) != "READY"
    warning = [line for line in endpoint.test_log.getvalue().splitlines() if SPACE_TARGET in line and "WARNING" in line]
    assert warning and "space" in warning[0] and "25.08" in warning[0], endpoint.test_log.getvalue()


def test_unload_with_the_header_unloads_it_and_a_new_request_loads_it_again(endpoint, packaged_test_resnet):
    assert endpoint.call(endpoint.endpoint.unload(HARD_TARGET)) is True
    with ContainerClient(endpoint.server.sagemaker_url) as control:
        assert cache_key(HARD_TARGET) not in {m.name for m in control.list_models()}
    reply = requests.post(f"{endpoint.url}/endpoints/local/invocations",
                          headers={"X-Amzn-SageMaker-Target-Model": HARD_TARGET, "Content-Type": "application/json"},
                          data=packaged_test_resnet.sample("json"), timeout=60)
    assert reply.status_code == 200, reply.text[:300]
