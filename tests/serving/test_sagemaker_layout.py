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
import re
import shutil

import boto3
import numpy as np
import pytest

from mme.progress import Reporter
from serving.models.cache_entries import cache_key
from serving.triton.container import ContainerClient
from serving.runtime.local_endpoint import LocalEndpoint, LocalEndpointOptions
from tests.serving.conftest import decode_kserve, header_size_of

HARD_TARGET = "dir/a+b.tar.gz"
SPACE_TARGET = "dir/a b.tar.gz"

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


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


LOAD_EVENT = re.compile(r"successfully (loaded|unloaded) '(.*?)'")


def loaded_by_triton(endpoint) -> set[str]:
    """The names Triton has loaded and not unloaded since, from its log (SageMaker's image runs
    it with HTTP, hence the KServe repository index, off). With model namespacing on (serve's
    default) each reads ``<repository>::<name>``."""
    names: set[str] = set()
    for event, name in LOAD_EVENT.findall(endpoint.server.log_path.read_text(errors="replace")):
        (names.add if event == "loaded" else names.discard)(name)
    return names


def sagemaker_models(endpoint) -> dict[str, dict]:
    """``GET /models`` on the SageMaker port, keyed by the model hash; Triton lists an entry as an
    empty object when no model is named after the hash (which is always, under the target header)."""
    with ContainerClient(endpoint.server.sagemaker_url) as control:
        raw = control.session.get(f"{endpoint.server.sagemaker_url}/models", timeout=10).json()["models"]
        keys = [key for key in (cache_key(HARD_TARGET), cache_key(SPACE_TARGET))
                if control.session.get(f"{endpoint.server.sagemaker_url}/models/{key}", timeout=10).status_code == 200]
    assert len(raw) == len(keys), (raw, keys)
    return {key: control.get_model(key) for key in keys}


def load_hard_target(endpoint, packaged) -> None:
    """HARD_TARGET loaded, whichever of this module's tests ran before (their order is random)."""
    runtime(endpoint.url).invoke_endpoint(EndpointName="local", TargetModel=HARD_TARGET, Body=packaged.sample("binary"),
                                          ContentType=packaged.binary_content_type)


def test_the_container_holds_it_under_its_hash_loaded_from_root_hash_model(endpoint, packaged_test_resnet):
    load_hard_target(endpoint, packaged_test_resnet)
    key = cache_key(HARD_TARGET)
    assert len(key) == 32 and key.isalnum()  # matches Triton 2.70+'s [0-9A-Za-z._]+
    loaded = endpoint.endpoint.loaded_models()
    assert [m["target"] for m in loaded] == [HARD_TARGET]
    assert loaded[0]["model_dir"] == str(endpoint.cache.root / key / "model")
    # Triton named the model after the header, and knows nothing under the hash.
    names = loaded_by_triton(endpoint)
    assert f"{loaded[0]['model_dir']}::{HARD_TARGET}" in names, names
    assert not [name for name in names if name.endswith(f"::{key}")]
    # Its SageMaker port keys the model by the hash: one entry (listed empty, as Triton lists a
    # model whose hash is not a model name); a second load of the hash is a conflict.
    listed = sagemaker_models(endpoint)
    assert list(listed) == [key] and listed[key].url == loaded[0]["model_dir"]
    with ContainerClient(endpoint.server.sagemaker_url) as control:
        again = control.session.post(f"{endpoint.server.sagemaker_url}/models",
                                     json={"model_name": key, "url": loaded[0]["model_dir"]},
                                     headers={"X-Amzn-SageMaker-Target-Model": HARD_TARGET}, timeout=60)
        assert again.status_code == 409


def test_a_python_backend_target_with_a_space_fails_like_sagemakers_triton_and_says_why(endpoint):
    sm = runtime(endpoint.url)
    with pytest.raises(sm.exceptions.ModelError) as info:
        sm.invoke_endpoint(EndpointName="local", TargetModel=SPACE_TARGET, ContentType="application/json", Body=b"{}")
    assert info.value.response["OriginalStatusCode"] == 400
    assert not [name for name in loaded_by_triton(endpoint) if name.endswith(f"::{SPACE_TARGET}")]
    assert cache_key(SPACE_TARGET) not in sagemaker_models(endpoint)
    warning = [line for line in endpoint.test_log.getvalue().splitlines() if SPACE_TARGET in line and "WARNING" in line]
    assert warning and "space" in warning[0] and "25.08" in warning[0], endpoint.test_log.getvalue()


def test_unload_with_the_header_unloads_it_and_a_new_request_loads_it_again(endpoint, packaged_test_resnet):
    load_hard_target(endpoint, packaged_test_resnet)
    assert endpoint.call(endpoint.endpoint.unload(HARD_TARGET)) is True
    key = cache_key(HARD_TARGET)
    assert key not in sagemaker_models(endpoint)
    assert not [name for name in loaded_by_triton(endpoint) if name.endswith(f"::{HARD_TARGET}")]
    reply = runtime(endpoint.url).invoke_endpoint(EndpointName="local", TargetModel=HARD_TARGET,
                                                  ContentType="application/json", Body=packaged_test_resnet.sample("json"))
    assert reply["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert key in sagemaker_models(endpoint)
