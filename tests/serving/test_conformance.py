"""Conformance: an unchanged boto3 client sees the local MME answer as SageMaker answers.

One test per behaviour, each naming its source. Sources:
- REF: ../shared/reference.md, "What SageMaker's MME front end and Triton's SageMaker mode actually do"
- SMX290: aws/amazon-sagemaker-examples#290 (an unsigned request, the reply captured byte for byte)
- SDK171: aws/sagemaker-python-sdk#171 (413 "HTTP content length exceeded N bytes.")
- TRITON: triton-inference-server/server src/sagemaker_server.cc (a load blocks its HTTP thread)
Everything runs against the real Triton of the nvidia-pytriton wheel with python-backend echo
models whose load and inference take as long as each test needs (tests/serving/python_models.py).
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest
import requests
from botocore.config import Config
from botocore.exceptions import ClientError

from mme.progress import Reporter
from serving.models.cache_entries import cache_key
from serving.runtime.local_endpoint import LocalEndpoint, LocalEndpointOptions
from tests.serving.python_models import echo_request, write_echo_tarball

NAME, ACCOUNT, VARIANT = "conformance", "123456789012", "Blue"
WAIT_S, INVOKE_S = 2.0, 1.5  # the two 60-second rules, shortened

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def client(url: str, *, retries: int | None = 1):
    """boto3 as users run it; ``retries=None`` keeps botocore's default (legacy, 5 attempts)."""
    config = Config(read_timeout=120, retries=None if retries is None else {"total_max_attempts": retries})
    return boto3.client("sagemaker-runtime", endpoint_url=url, region_name="eu-west-1",
                        aws_access_key_id="test", aws_secret_access_key="test", config=config)


def invoke(sm, target: str, body: bytes | None = None, **kwargs):
    return sm.invoke_endpoint(EndpointName=NAME, TargetModel=target, ContentType="application/json",
                              Body=echo_request() if body is None else body, **kwargs)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("conformance-models")
    write_echo_tarball(root, "warm.tar.gz")
    write_echo_tarball(root, "other.tar.gz")
    write_echo_tarball(root, "slow-load.tar.gz", load_s=WAIT_S + 4)
    write_echo_tarball(root, "slow-infer.tar.gz", infer_s=3 * INVOKE_S)
    for i in range(3):
        write_echo_tarball(root, f"cold-{i}.tar.gz", load_s=2.0)
    return root


@pytest.fixture(scope="module")
def endpoint(models):
    """The shared endpoint: SageMaker's 60 s model wait, a short invocation timeout."""
    options = LocalEndpointOptions(models=str(models), port=0, server_kind="local", endpoint_name=NAME,
                                   account=ACCOUNT, variant_name=VARIANT, region="eu-west-1",
                                   invocation_timeout_s=INVOKE_S)
    with LocalEndpoint(options, Reporter(quiet=True)) as ep:
        warm_up(client(ep.url), "warm.tar.gz")
        yield ep


def warm_up(sm, target: str, timeout_s: float = 60.0) -> None:
    """Load ``target``: a slow first load (a busy CI host) answers 429 until it is ready."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            invoke(sm, target)
            return
        except sm.exceptions.ModelNotReadyException:
            if time.monotonic() > deadline:
                raise


def snapshot(ep) -> dict:
    return requests.get(f"{ep.url}/metrics.json", timeout=10).json()


def test_model_still_loading_after_the_wait_timeout_is_429_and_the_load_goes_on(models):
    """REF: a request whose target is still loading after 60 s gets 429 ModelNotReadyException
    while the load goes on; later requests find it loaded."""
    options = LocalEndpointOptions(models=str(models), port=0, server_kind="local", endpoint_name=NAME,
                                   model_wait_timeout_s=WAIT_S)
    with LocalEndpoint(options, Reporter(quiet=True)) as ep:
        sm = client(ep.url)
        start = time.perf_counter()
        with pytest.raises(sm.exceptions.ModelNotReadyException):
            invoke(sm, "slow-load.tar.gz")
        assert time.perf_counter() - start >= WAIT_S  # it waited the configured timeout first
        deadline = time.monotonic() + 30
        while "slow-load.tar.gz" not in [m["target"] for m in ep.endpoint.loaded_models()]:
            assert time.monotonic() < deadline, "the load did not go on after the 429"
            time.sleep(0.2)
        reply = invoke(sm, "slow-load.tar.gz")
        assert json.loads(reply["Body"].read())["outputs"][0]["data"] == [1.0, 2.0]
        counts = snapshot(ep)["counts"]
    assert counts["ModelLoads"] == 1 and counts["Invocation4XXErrors"] == 1  # one load, finished in the background


def test_invocation_not_answered_in_time_is_model_error_status_0_not_retried(endpoint):
    """REF: a container that does not answer within 60 s gives ModelError, OriginalStatusCode 0,
    SageMaker's wording; boto3 does not retry it (default retry configuration here)."""
    sm = client(endpoint.url, retries=None)
    before = snapshot(endpoint)["counts"].get("Invocations", 0)
    start = time.perf_counter()
    with pytest.raises(sm.exceptions.ModelError) as info:
        invoke(sm, "slow-infer.tar.gz")
    elapsed = time.perf_counter() - start
    error = info.value.response
    assert error["OriginalStatusCode"] == 0
    assert error["OriginalMessage"].startswith("Your invocation timed out while waiting for a response from container primary.")
    assert 'Received server error (0) from primary with message "Your invocation timed out' in error["Error"]["Message"]
    assert elapsed >= INVOKE_S  # answered at the timeout; one attempt: Invocations below
    assert snapshot(endpoint)["counts"]["Invocations"] == before + 1


def test_body_over_6_mib_is_413(endpoint):
    """SDK171 and REF: a body over 6 MiB gets HTTP 413, which botocore reports as code "413"."""
    sm = client(endpoint.url)
    with pytest.raises(ClientError) as info:
        invoke(sm, "warm.tar.gz", body=b"0" * (6 * 2**20 + 1))
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 413
    assert info.value.response["Error"]["Code"] == "413"
    assert info.value.response["Error"]["Message"] == "HTTP content length exceeded 6291456 bytes."


def test_another_endpoint_name_is_a_validation_error(endpoint):
    """REF: an unknown endpoint name is ValidationError "Endpoint X of account N not found."."""
    sm = client(endpoint.url)
    with pytest.raises(sm.exceptions.ValidationError) as info:
        sm.invoke_endpoint(EndpointName="other", TargetModel="warm.tar.gz", ContentType="application/json",
                           Body=echo_request())
    assert info.value.response["Error"]["Message"] == f"Endpoint other of account {ACCOUNT} not found."


def test_target_variant_is_checked_and_returned(endpoint):
    """InvokeEndpoint's TargetVariant names a production variant; the reply's
    InvokedProductionVariant names the one that answered (botocore's service model)."""
    sm = client(endpoint.url)
    assert invoke(sm, "warm.tar.gz", TargetVariant=VARIANT)["InvokedProductionVariant"] == VARIANT
    assert invoke(sm, "warm.tar.gz")["InvokedProductionVariant"] == VARIANT
    with pytest.raises(sm.exceptions.ValidationError):
        invoke(sm, "warm.tar.gz", TargetVariant="Green")


def test_unsigned_request_is_403_missing_authentication_token(endpoint, models):
    """SMX290: SageMaker Runtime answers an unsigned request 403 with MissingAuthenticationTokenException."""
    url = f"{endpoint.url}/endpoints/{NAME}/invocations"
    reply = requests.post(url, data=echo_request(), headers={"Content-Type": "application/json",
                                                              "X-Amzn-SageMaker-Target-Model": "warm.tar.gz"}, timeout=30)
    assert reply.status_code == 403
    assert reply.json() == {"message": "Missing Authentication Token"}
    assert reply.headers["x-amzn-ErrorType"].split(":")[0] == "MissingAuthenticationTokenException"
    options = LocalEndpointOptions(models=str(models), port=0, server_kind="local", allow_unsigned=True)
    with LocalEndpoint(options, Reporter(quiet=True)) as open_endpoint:
        reply = requests.post(f"{open_endpoint.url}/endpoints/local/invocations", data=echo_request(),
                              headers={"Content-Type": "application/json", "X-Amzn-SageMaker-Target-Model": "warm.tar.gz"},
                              timeout=60)
        assert reply.status_code == 200


def test_model_error_carries_the_containers_raw_body_and_the_endpoints_log_stream(endpoint):
    """REF: ModelError's OriginalMessage is the container's own body (Triton's {"error": ...});
    LogStreamArn names /aws/sagemaker/Endpoints/<endpoint> in the endpoint's account and region."""
    sm = client(endpoint.url)
    bad = json.dumps({"inputs": [{"name": "NOPE", "shape": [1], "datatype": "FP32", "data": [1.0]}]}).encode()
    with pytest.raises(sm.exceptions.ModelError) as info:
        invoke(sm, "warm.tar.gz", body=bad)
    error = info.value.response
    assert error["OriginalStatusCode"] == 400
    assert "error" in json.loads(error["OriginalMessage"])  # the raw body, not the string inside it
    assert error["LogStreamArn"] == f"arn:aws:logs:eu-west-1:{ACCOUNT}:log-group:/aws/sagemaker/Endpoints/{NAME}"
    assert f'from primary with message "{error["OriginalMessage"]}"' in error["Error"]["Message"]


def test_loads_of_different_targets_run_at_the_same_time(endpoint):
    """REF/TRITON: Triton loads models on its own threads; SageMaker does not serialise loads of
    different targets. Two cold 2-second loads together take about as long as one."""
    sm = client(endpoint.url)
    start = time.perf_counter()
    invoke(sm, "cold-0.tar.gz")
    one = time.perf_counter() - start
    with ThreadPoolExecutor(2) as pool:
        start = time.perf_counter()
        list(pool.map(lambda t: invoke(client(endpoint.url), t), ["cold-1.tar.gz", "cold-2.tar.gz"]))
        two = time.perf_counter() - start
    assert two < 1.5 * one, f"two loads took {two:.2f} s against {one:.2f} s for one"


def test_warm_requests_are_not_stalled_by_another_models_load(models):
    """TRITON: a load runs on the HTTP thread of its connection and holds every request on that
    thread; the front keeps warm requests off it. Warm requests during a 4-second load stay fast."""
    options = LocalEndpointOptions(models=str(models), port=0, server_kind="local", endpoint_name=NAME,
                                   model_wait_timeout_s=60)
    with LocalEndpoint(options, Reporter(quiet=True)) as ep:
        sms = [client(ep.url) for _ in range(4)]
        invoke(sms[0], "warm.tar.gz")
        latencies: list[float] = []
        stop = threading.Event()

        def warm(sm) -> None:
            while not stop.is_set():
                start = time.perf_counter()
                invoke(sm, "warm.tar.gz")
                latencies.append(time.perf_counter() - start)

        threads = [threading.Thread(target=warm, args=(sm,)) for sm in sms]
        for t in threads:
            t.start()
        time.sleep(0.3)
        invoke(client(ep.url), "slow-load.tar.gz")  # 6 s of load while the warm threads run
        stop.set()
        for t in threads:
            t.join()
    assert len(latencies) > 100
    # A stalled request would wait for the load (6 s, configured): none waited half of it.
    assert max(latencies) < 3.0, f"a warm request waited {max(latencies):.2f} s during another model's load"


def test_cloudwatch_metrics_names_and_meanings(endpoint):
    """REF (CloudWatch MME metrics): OverheadLatency is total minus ModelLatency, so it includes the
    load wait; ModelCacheHit is 0/1 per request (its average is the hit ratio); 4XX and 5XX are
    counted; the Prometheus exposition keeps CloudWatch's names (no ``_total``)."""
    from prometheus_client.parser import text_string_to_metric_families

    sm = client(endpoint.url)
    before = snapshot(endpoint)
    invoke(sm, "other.tar.gz")  # a miss: waits for its load
    invoke(sm, "other.tar.gz")  # a hit
    with pytest.raises(ClientError):
        invoke(sm, "warm.tar.gz", body=b"0" * (6 * 2**20 + 1))  # 413
    after = snapshot(endpoint)
    counts = {k: after["counts"].get(k, 0) - before["counts"].get(k, 0) for k in after["counts"]}
    assert counts["Invocations"] == 3 and counts["Invocation4XXErrors"] == 1
    assert counts["ModelCacheHit"] == 1 and counts["ModelCacheMiss"] == 1
    lat = after["latency_us"]
    assert lat["OverheadLatency"]["max"] >= lat["ModelLoadingWaitTime"]["max"] > 0
    hit = after["latency_us"]["ModelCacheHit"]
    assert hit["avg"] == pytest.approx(hit["sum"] / hit["count"], abs=1e-6)  # avg is kept to 6 decimals
    for gauge in ("CPUUtilization", "MemoryUtilization", "DiskUtilization", "LoadedModelCount"):
        assert after["gauges"][gauge] is not None and after["gauges"][gauge] >= 0
    names = {s.name for family in text_string_to_metric_families(requests.get(f"{endpoint.url}/metrics", timeout=10).text)
             for s in family.samples}
    assert {"Invocations", "Invocation4XXErrors", "ModelCacheHit"} <= names
    assert not [n for n in names if n.endswith("_total")]


def test_triton_runs_with_the_sagemaker_images_flags_and_settings(models):
    """REF (docker/sagemaker/serve): model namespacing on, python backend shared memory 16 MiB by
    default, SAGEMAKER_TRITON_* settings mapped onto flags."""
    import psutil

    options = LocalEndpointOptions(models=str(models), port=0, server_kind="local",
                                   sagemaker_env={"SAGEMAKER_TRITON_THREAD_COUNT": "12",
                                                  "SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE": "2097152"})
    with LocalEndpoint(options, Reporter(quiet=True)) as ep:
        argv = " ".join(psutil.Process(ep.server.pid).cmdline())
    for flag in ("--model-namespacing=true", "--backend-config=python,shm-default-byte-size=16777216",
                 "--backend-config=python,shm-growth-byte-size=2097152", "--sagemaker-thread-count=12",
                 "--allow-http=false"):
        assert flag in argv


def test_disk_limit_deletes_least_recently_used_unloaded_models(models, tmp_path):
    """REF/AWS MME docs: when the instance's disk fills, SageMaker deletes cached artifacts of
    models that are not loaded, least recently used first."""
    options = LocalEndpointOptions(models=str(models), port=0, server_kind="local", endpoint_name=NAME,
                                   # an echo model's files (about 2 KB) fit; its entry as du counts it (about 24 KB) does not
                                   cache_dir=tmp_path / "cache", disk_limit_bytes=8192)
    with LocalEndpoint(options, Reporter(quiet=True)) as ep:
        sm = client(ep.url)
        invoke(sm, "warm.tar.gz")
        invoke(sm, "other.tar.gz")
        cached = {e.target for e in ep.cache.entries()}
        assert cached == {"warm.tar.gz", "other.tar.gz"}  # both loaded: nothing may go
        ep.call(ep.endpoint.unload("warm.tar.gz"))
        invoke(sm, "cold-0.tar.gz")
        cached = {e.target for e in ep.cache.entries()}
        assert "warm.tar.gz" not in cached and {"other.tar.gz", "cold-0.tar.gz"} <= cached
        assert not (ep.cache.root / cache_key("warm.tar.gz")).exists()
