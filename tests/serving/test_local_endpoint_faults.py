"""Faults around the local MME: a model that cannot load, Ctrl-C."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time

import boto3
import psutil
import pytest
import requests

from mme.fsutil import deterministic_tar_gz
from mme.progress import Reporter
from serving.local_endpoint import LocalEndpoint, LocalEndpointOptions

BROKEN_CONFIG = 'backend: "python"\nmax_batch_size: 1\ninput { name: "X" data_type: TYPE_FP32 dims: [1] }\n' \
                'output { name: "Y" data_type: TYPE_FP32 dims: [1] }\ninstance_group { kind: KIND_CPU }\n'


@pytest.fixture(scope="module")
def models_with_a_broken_one(packaged_test_resnet, tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    model = tmp_path_factory.mktemp("src") / "broken"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(BROKEN_CONFIG)
    (model / "1" / "model.py").write_text("class TritonPythonModel:\n    def initialize(self, args):\n"
                                          "        raise RuntimeError('weights file is missing')\n")
    deterministic_tar_gz(model, "broken", root / "broken.tar.gz")
    (root / "test_resnet.tar.gz").write_bytes(packaged_test_resnet.tarball.read_bytes())
    return root


def test_a_model_that_fails_to_load_fails_only_its_requests(models_with_a_broken_one, packaged_test_resnet):
    options = LocalEndpointOptions(models=str(models_with_a_broken_one), port=0, server_kind="local")
    body = packaged_test_resnet.sample("json")
    with LocalEndpoint(options, Reporter(quiet=True)) as ep:
        sm = boto3.client("sagemaker-runtime", endpoint_url=ep.url, region_name="us-east-1",
                          aws_access_key_id="t", aws_secret_access_key="t")
        with pytest.raises(sm.exceptions.ModelError) as info:
            sm.invoke_endpoint(EndpointName="local", TargetModel="broken.tar.gz", ContentType="application/json",
                               Body=b'{"inputs":[{"name":"X","shape":[1,1],"datatype":"FP32","data":[1]}]}')
        assert "weights file is missing" in info.value.response["OriginalMessage"]
        reply = sm.invoke_endpoint(EndpointName="local", TargetModel="test_resnet.tar.gz",
                                   ContentType="application/json", Body=body)
        assert reply["ResponseMetadata"]["HTTPStatusCode"] == 200
        assert [m["target"] for m in ep.endpoint.loaded_models()] == ["test_resnet.tar.gz"]


def test_ctrl_c_stops_everything(packaged_test_resnet, tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "mme", "serve", "--models", str(packaged_test_resnet.directory),
                             "--port", str(port), "--server", "local", "--copies", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{url}/ping", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.2)
        sm = boto3.client("sagemaker-runtime", endpoint_url=url, region_name="us-east-1",
                          aws_access_key_id="t", aws_secret_access_key="t")
        sm.invoke_endpoint(EndpointName="local", TargetModel="test_resnet-v1.tar.gz", ContentType="application/json",
                           Body=packaged_test_resnet.sample("json"))
        descendants = psutil.Process(proc.pid).children(recursive=True)
        assert any("tritonserver" in p.name() for p in descendants)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, output
        assert "Traceback" not in output
    finally:
        if proc.poll() is None:  # a failed assertion must not leave a server running
            tree = psutil.Process(proc.pid).children(recursive=True)
            proc.kill()
            proc.communicate(timeout=30)
            for child in tree:
                child.kill()
    gone, alive = psutil.wait_procs(descendants, timeout=10)
    assert not alive, f"orphans left: {[p.pid for p in alive]}"


@pytest.mark.parametrize("path", ["request", "watchdog"])
def test_a_dead_worker_is_unloaded_and_reloaded(tmp_path, path):
    """kill -9 of one model's python-backend stub (what the OOM killer does): Triton answers
    "Stub process ... is not healthy" for it from then on. The endpoint notices it on the failing
    request or in its watchdog, unloads the model and loads it again; requests succeed."""
    from tests.serving.python_models import echo_request, write_echo_tarball

    for target in ("a.tar.gz", "b.tar.gz"):
        write_echo_tarball(tmp_path, target)
    options = LocalEndpointOptions(models=str(tmp_path), port=0, server_kind="local")
    with LocalEndpoint(options, Reporter(quiet=True)) as ep:
        sm = boto3.client("sagemaker-runtime", endpoint_url=ep.url, region_name="us-east-1",
                          aws_access_key_id="t", aws_secret_access_key="t")

        def invoke(target: str) -> int:
            return sm.invoke_endpoint(EndpointName="local", TargetModel=target, ContentType="application/json",
                                      Body=echo_request())["ResponseMetadata"]["HTTPStatusCode"]

        assert invoke("a.tar.gz") == invoke("b.tar.gz") == 200
        (entry,) = [e for t, e in ep.endpoint._loaded.items() if t == "a.tar.gz"]
        assert entry.workers, "the stub of a.tar.gz was not found among Triton's processes"
        killed = time.perf_counter()
        for worker in entry.workers:
            worker.kill()
        if path == "watchdog":  # the watchdog unloads it before any request comes
            deadline = time.monotonic() + 10
            while "a.tar.gz" in [m["target"] for m in ep.endpoint.loaded_models()]:
                assert time.monotonic() < deadline, "the watchdog did not notice the dead worker"
                time.sleep(0.1)
        assert invoke("a.tar.gz") == 200
        recovered_s = time.perf_counter() - killed
        print(f"{path}: first success {recovered_s:.2f} s after the worker was killed")
        assert invoke("b.tar.gz") == 200  # the other model was never touched
        counts = requests.get(f"{ep.url}/metrics.json", timeout=10).json()["counts"]
    # Triton 2.51 may never finish unloading a model whose dead stub a request reached: then the
    # server is restarted and the other model reloads too.
    assert counts["ModelWorkerFailures"] == 1 and counts["ModelLoads"] == 3 + counts["ContainerRestarts"]
    assert recovered_s < 20


def test_triton_left_by_a_killed_mme_serve_is_stopped_by_the_next_start(packaged_test_resnet):
    """SIGKILL of `mme serve` cannot stop its Triton (no handler runs): the server and its workers
    live on under init. The next server start finds them by their owner tag and stops them."""
    from serving.triton.base import TritonServerConfig
    from serving.triton.local import LocalTritonServer
    with socket_port() as port:
        pass
    proc = subprocess.Popen([sys.executable, "-m", "mme", "-q", "serve", "--models", str(packaged_test_resnet.directory),
                             "--port", str(port), "--server", "local", "--allow-unsigned"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    leftovers: list[psutil.Process] = []
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{url}/ping", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                assert time.monotonic() < deadline and proc.poll() is None, "mme serve did not start"
                time.sleep(0.2)
        reply = requests.post(f"{url}/endpoints/local/invocations", data=packaged_test_resnet.sample("json"), timeout=60,
                              headers={"Content-Type": "application/json", "X-Amzn-SageMaker-Target-Model": "test_resnet.tar.gz"})
        assert reply.status_code == 200
        leftovers = psutil.Process(proc.pid).children(recursive=True)
        assert any("tritonserver" in p.name() for p in leftovers) and len(leftovers) >= 2  # server + stub
        proc.kill()
        proc.wait(timeout=10)
        time.sleep(0.5)
        assert all(p.is_running() for p in leftovers), "expected the orphans to outlive a SIGKILLed mme serve"
        with LocalTritonServer(TritonServerConfig(sagemaker_port=0, http_port=None, grpc_port=None,
                                                  metrics_port=None)) as server:
            assert {p.pid for p in leftovers} <= set(server.swept)
        gone, still = psutil.wait_procs(leftovers, timeout=10)
        assert not still
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in leftovers:
            with contextlib.suppress(psutil.Error):
                p.kill()


@contextlib.contextmanager
def socket_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]
