"""Faults around the local MME: a model that cannot load, Ctrl-C."""

from __future__ import annotations

import contextlib
import os
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
from serving.runtime.local_endpoint import LocalEndpoint, LocalEndpointOptions

BROKEN_CONFIG = 'backend: "python"\nmax_batch_size: 1\ninput { name: "X" data_type: TYPE_FP32 dims: [1] }\n' \
                'output { name: "Y" data_type: TYPE_FP32 dims: [1] }\ninstance_group { kind: KIND_CPU }\n'

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


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


def test_nothing_outlives_a_sigkilled_mme_serve(packaged_test_resnet):
    """SIGKILL of `mme serve` runs no handler of its: the broker that started Triton sees it gone
    and ends its process group (tritonserver and its python-backend stub) within seconds."""
    proc = serve_and_load(packaged_test_resnet, "-q", output=subprocess.DEVNULL)
    descendants: list[psutil.Process] = []
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
        names = [p.name() for p in descendants]
        assert any("tritonserver" in n for n in names) and len(descendants) >= 3, names  # broker, server, stub
        proc.kill()
        proc.wait(timeout=10)
        gone, still = psutil.wait_procs(descendants, timeout=10)
        assert not still, f"still running 10 s after SIGKILL: {[(p.pid, p.name()) for p in still]}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in descendants:  # only what this test started
            with contextlib.suppress(psutil.Error):
                p.kill()


def serve_and_load(packaged, *flags: str, output) -> subprocess.Popen:
    """`mme serve` of ``packaged`` in its own process, ready, with test_resnet.tar.gz loaded."""
    from serving.triton.config import free_ports

    port = free_ports(1)[0]
    proc = subprocess.Popen([sys.executable, "-m", "mme", *flags, "serve", "--models", str(packaged.directory),
                             "--port", str(port), "--server", "local", "--allow-unsigned"],
                            stdout=output, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                if requests.get(f"{url}/ping", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                assert time.monotonic() < deadline and proc.poll() is None, "mme serve did not start"
                time.sleep(0.2)
        reply = requests.post(f"{url}/endpoints/local/invocations", data=packaged.sample("json"), timeout=60,
                              headers={"Content-Type": "application/json", "X-Amzn-SageMaker-Target-Model": "test_resnet.tar.gz"})
        assert reply.status_code == 200, reply.text
    except BaseException:
        proc.kill()
        proc.communicate(timeout=30)
        raise
    return proc


def test_shutdown_does_not_wait_for_a_load_in_progress(tmp_path):
    """A stop (SIGTERM, Ctrl-C) during a 30 s load: requests waiting for it get 503 at once and
    Triton is not given a grace period it would spend finishing the load (Docker allows 10 s)."""
    from botocore.config import Config

    from tests.serving.python_models import echo_request, write_echo_tarball

    write_echo_tarball(tmp_path, "slow.tar.gz", load_s=30)
    ep = LocalEndpoint(LocalEndpointOptions(models=str(tmp_path), port=0, server_kind="local"), Reporter(quiet=True))
    ep.start_in_thread()
    stopped = False
    try:
        sm = boto3.client("sagemaker-runtime", endpoint_url=ep.url, region_name="us-east-1", aws_access_key_id="t",
                          aws_secret_access_key="t", config=Config(retries={"total_max_attempts": 1}, read_timeout=90))
        outcome: list = []

        def call() -> None:
            try:
                sm.invoke_endpoint(EndpointName="local", TargetModel="slow.tar.gz", ContentType="application/json",
                                   Body=echo_request())
                outcome.append("answered")
            except Exception as exc:  # noqa: BLE001 (the test looks at what it was)
                outcome.append(exc)

        import threading

        caller = threading.Thread(target=call)
        caller.start()
        deadline = time.monotonic() + 20
        while not ep.endpoint._loading and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # the load is under way inside Triton
        started = time.perf_counter()
        ep.stop()
        stopped = True
        took = time.perf_counter() - started
        caller.join(timeout=30)
    finally:
        if not stopped:
            ep.stop()
    assert took < 30, f"stop took {took:.1f} s: it waited for the 30 s load in progress"
    (result,) = outcome
    assert isinstance(result, sm.exceptions.ServiceUnavailable), result


def test_a_load_past_the_load_timeout_fails_clearly_and_the_model_is_served_once_loaded(tmp_path):
    """A hung or very slow initialize(): past --load-timeout its requests get InternalFailure with
    a message that names the model and the option; the container's late load is not lost."""
    from botocore.config import Config

    from tests.serving.python_models import echo_request, write_echo_tarball

    write_echo_tarball(tmp_path, "slow.tar.gz", load_s=5)
    options = LocalEndpointOptions(models=str(tmp_path), port=0, server_kind="local", load_timeout_s=1.5)
    with LocalEndpoint(options, Reporter(quiet=True)) as ep:
        sm = boto3.client("sagemaker-runtime", endpoint_url=ep.url, region_name="us-east-1", aws_access_key_id="t",
                          aws_secret_access_key="t", config=Config(retries={"total_max_attempts": 1}))

        def invoke():
            return sm.invoke_endpoint(EndpointName="local", TargetModel="slow.tar.gz", ContentType="application/json",
                                      Body=echo_request())

        with pytest.raises(sm.exceptions.InternalFailure, match=r"loading slow.tar.gz did not finish within 1.5 s \(--load-timeout\)"):
            invoke()
        time.sleep(6)  # Triton finishes the load it was given
        assert invoke()["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_the_memory_limit_is_hard_a_load_waits_for_a_busy_model(tmp_path):
    """Every loaded model busy and no room for another: the load waits until one is idle and
    unloads it, instead of loading past the limit; a load that cannot be avoided (nothing loaded,
    nothing busy) is counted as LoadsAboveThreshold."""
    import threading

    from tests.serving.python_models import echo_request, write_echo_tarball

    gate = tmp_path / "gate"
    models = tmp_path / "models"
    write_echo_tarball(models, "a.tar.gz", infer_gate=str(gate))
    write_echo_tarball(models, "b.tar.gz")

    def start(limit: int) -> LocalEndpoint:
        options = LocalEndpointOptions(models=str(models), port=0, server_kind="local", memory_limit_bytes=limit,
                                       memory="host")
        return LocalEndpoint(options, Reporter(quiet=True)).start_in_thread()

    def client(url):
        return boto3.client("sagemaker-runtime", endpoint_url=url, region_name="us-east-1", aws_access_key_id="t",
                            aws_secret_access_key="t")

    def invoke(url, target):
        return client(url).invoke_endpoint(EndpointName="local", TargetModel=target, ContentType="application/json",
                                           Body=echo_request())["ResponseMetadata"]["HTTPStatusCode"]

    gate.touch()
    probe = start(64 * 2**30)  # measure: the server alone, then with one model
    try:
        idle = probe.memory_used()
        invoke(probe.url, "a.tar.gz")
        one = probe.memory_used()
    finally:
        probe.stop()
    gate.unlink()
    limit = int((one + (one - idle) // 2) / 0.9)  # room for one model, not two
    ep = start(limit)
    try:
        busy = threading.Thread(target=invoke, args=(ep.url, "a.tar.gz"))
        busy.start()  # a loads, then holds its request at the gate
        deadline = time.monotonic() + 30
        while not any(e.inflight for e in ep.endpoint._loaded.values()):
            assert time.monotonic() < deadline, "a.tar.gz never got busy"
            time.sleep(0.1)
        second: list[int] = []
        waiting = threading.Thread(target=lambda: second.append(invoke(ep.url, "b.tar.gz")))
        waiting.start()
        time.sleep(3)
        assert not second and [m["target"] for m in ep.endpoint.loaded_models()] == ["a.tar.gz"]
        gate.touch()  # a finishes: b may now evict it
        busy.join(timeout=30)
        waiting.join(timeout=60)
        assert second == [200]
        counts = requests.get(f"{ep.url}/metrics.json", timeout=10).json()["counts"]
        assert counts["ModelEvictions"] == 1 and counts["LoadsAboveThreshold"] == 0
    finally:
        gate.touch()
        ep.stop()
    tiny = start(1)  # below the server alone: the first load cannot be avoided, and is counted
    try:
        assert invoke(tiny.url, "b.tar.gz") == 200
        assert requests.get(f"{tiny.url}/metrics.json", timeout=10).json()["counts"]["LoadsAboveThreshold"] == 1
    finally:
        tiny.stop()


def test_repeated_ctrl_c_still_leaves_nothing_behind(packaged_test_resnet):
    """Ctrl-C, then more Ctrl-Cs while it stops: the stop still completes, and Triton's work
    directory and its python-backend shared-memory segments are gone."""
    import glob
    import re

    proc = serve_and_load(packaged_test_resnet, output=subprocess.PIPE)
    try:
        triton = next(p for p in psutil.Process(proc.pid).children(recursive=True) if "tritonserver" in p.name())
        workdir = triton.cwd()
        prefix = re.search(r"shm-region-prefix-name=(\S+)", " ".join(triton.cmdline())).group(1)
        assert glob.glob(f"/dev/shm/{prefix}*"), "expected the loaded model's shared-memory segment"
        proc.send_signal(signal.SIGINT)
        for _ in range(4):
            time.sleep(0.25)
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 0, output
    assert "Traceback" not in output
    assert not os.path.exists(workdir), f"{workdir} left behind"
    assert not glob.glob(f"/dev/shm/{prefix}*"), "shared-memory segments left behind"
