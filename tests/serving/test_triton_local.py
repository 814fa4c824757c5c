"""The wheel's tritonserver (LocalTritonServer) serving the MME contract with a real model."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil
import pytest

from serving.triton.container import (
    ContainerClient,
    ModelAlreadyLoaded,
    ModelLoadFailed,
    ModelNotLoaded,
    ping_status,
)
from serving.monitor.memory import process_tree_memory
from serving.triton.config import TritonServerConfig, TritonStartupError
from serving.triton.local import LocalTritonServer
from tests.serving.conftest import STARTUP_TIMEOUT_S, decode_kserve, header_size_of

MODEL_NAME = "test-resnet-v1.tar.gz"
MIB = 1 << 20

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def new_server(**overrides) -> LocalTritonServer:
    fields = {"sagemaker_port": 0, "startup_timeout_s": STARTUP_TIMEOUT_S, "stop_grace_s": 10.0, **overrides}
    return LocalTritonServer(TritonServerConfig(**fields))


@pytest.fixture(scope="module")
def server():
    srv = new_server()
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    with ContainerClient(server.sagemaker_url, timeout_s=30, load_timeout_s=60) as c:
        yield c


@pytest.fixture(scope="module")
def loaded(server, client, packaged_test_resnet, tmp_path_factory) -> str:
    """test_resnet loaded once under MODEL_NAME for the invoke tests."""
    url = packaged_test_resnet.extract(tmp_path_factory.mktemp("v1"))
    client.load(MODEL_NAME, str(url))
    yield MODEL_NAME
    client.unload(MODEL_NAME)


def onnxruntime_logits(onnx_file: Path, inputs: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    return session.run(["logits"], inputs)[0]


def test_ping(server, client):
    assert client.ping()
    assert server.is_running() and server.returncode is None
    assert server.sagemaker_url != server.kserve_url


def test_it_runs_with_the_arguments_of_sagemakers_serve_script(server, loaded):
    """docker/sagemaker/serve @ e1db8a603 (triton-inference-server/server), MME defaults: the
    python backend's shared memory starts at 16 MiB per model, as in SageMaker's image."""
    argv = psutil.Process(server.pid).cmdline()
    assert argv[1:4] == ["--allow-sagemaker=true", "--allow-http=false", "--model-control-mode=explicit"]
    for flag in ("--model-namespacing=true", "--log-verbose=true", "--backend-config=python,shm-default-byte-size=16777216",
                 "--backend-config=python,shm-growth-byte-size=1048576", "--allow-http=true"):
        assert flag in argv
    assert server.notices == []  # the wheel's 2.51 has every flag serve passes by default
    regions = [p.stat().st_size for p in Path("/dev/shm").glob(f"{server.shm_prefix}*")]
    assert 16 * MIB in regions, regions


def test_duplicate_load_is_model_already_loaded(client, loaded, packaged_test_resnet, tmp_path):
    with pytest.raises(ModelAlreadyLoaded) as info:
        client.load(loaded, str(packaged_test_resnet.extract(tmp_path / "again")))
    assert info.value.status == 409 and info.value.message


def test_list_and_get_show_the_loaded_model(client, loaded):
    assert loaded in [m.name for m in client.list_models()]
    assert client.get_model(loaded).name == loaded


@pytest.mark.parametrize("kind", ["json", "binary"])
def test_invoke_matches_onnxruntime(client, loaded, packaged_test_resnet, kind):
    body = packaged_test_resnet.sample(kind)
    content_type = "application/json" if kind == "json" else packaged_test_resnet.binary_content_type
    inputs = decode_kserve(body, header_size_of(content_type))

    result = client.invoke(loaded, body, content_type)

    assert result.status == 200, result.body[:300]
    outputs = decode_kserve(result.body, header_size_of(result.content_type))
    expected = onnxruntime_logits(packaged_test_resnet.onnx_file, inputs)
    assert outputs["logits"].shape == expected.shape == (1, 1000)
    np.testing.assert_allclose(outputs["logits"], expected, atol=1e-4, rtol=0)


def test_invoke_unknown_model_is_404(client, packaged_test_resnet):
    result = client.invoke("no-such-model.tar.gz", packaged_test_resnet.sample("json"), "application/json")
    assert result.status == 404


def test_each_copy_adds_memory_and_unload_releases_it(server, client, packaged_test_resnet, tmp_path):
    before = process_tree_memory(server.pids())
    started = time.monotonic()
    client.load("test-resnet-v2.tar.gz", str(packaged_test_resnet.extract(tmp_path / "v2")))
    load_s = time.monotonic() - started
    after = process_tree_memory(server.pids())

    assert after.processes == before.processes + 1  # one python-backend stub per copy
    assert after.rss_bytes - before.rss_bytes > 20 * MIB
    assert after.uss_bytes is not None and after.uss_bytes > before.uss_bytes
    print(f"load {load_s:.2f} s, +{(after.rss_bytes - before.rss_bytes) / MIB:.0f} MiB RSS, "
          f"+{(after.uss_bytes - before.uss_bytes) / MIB:.0f} MiB USS")

    client.unload("test-resnet-v2.tar.gz")
    with pytest.raises(ModelNotLoaded):
        client.get_model("test-resnet-v2.tar.gz")
    assert process_tree_memory(server.pids()).processes == before.processes


def test_unload_unknown_model_is_model_not_loaded(client):
    with pytest.raises(ModelNotLoaded) as info:
        client.unload("never-loaded.tar.gz")
    assert info.value.status == 404


def test_load_of_missing_directory_fails_with_the_container_message(client, tmp_path):
    with pytest.raises(ModelLoadFailed) as info:
        client.load("missing.tar.gz", str(tmp_path / "does-not-exist"))
    assert info.value.status == 400
    assert "does-not-exist" in info.value.message


def test_config_at_url_root_is_refused_outside_opt_ml_models(client, packaged_test_resnet, tmp_path):
    # Triton accepts a url with config.pbtxt at its root only as /opt/ml/models/<hash>/model;
    # elsewhere the url must be the directory that holds the model directory.
    model_dir = packaged_test_resnet.extract(tmp_path / "x") / packaged_test_resnet.manifest.model
    with pytest.raises(ModelLoadFailed) as info:
        client.load("rooted.tar.gz", str(model_dir))
    assert info.value.status == 400


def test_stop_leaves_no_process_behind(packaged_test_resnet, tmp_path):
    srv = new_server()
    srv.start()
    try:
        with ContainerClient(srv.sagemaker_url) as c:
            c.load("a.tar.gz", str(packaged_test_resnet.extract(tmp_path / "a")))
        pids = srv.pids()
        assert len(pids) == 2 and srv.pid in pids
    finally:
        srv.stop()
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert srv.pids() == [] and not srv.is_running()
    assert not list(Path("/dev/shm").glob(f"{srv.shm_prefix}*"))


def _still_running(pids: list[int], within_s: float = 10.0) -> list[int]:
    """Those of ``pids`` still running (not exited, not a zombie waiting for init) after up to ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        running = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    running.append(pid)
            except psutil.NoSuchProcess:
                continue
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.1)


def test_killed_server_is_detected_and_restart_serves_again(packaged_test_resnet, tmp_path):
    srv = new_server()
    srv.start()
    try:
        url = srv.sagemaker_url
        with ContainerClient(url) as c:
            c.load("k.tar.gz", str(packaged_test_resnet.extract(tmp_path / "k")))
        pids = srv.pids()
        assert len(pids) == 2

        os.kill(srv.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while srv.is_running() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not srv.is_running()
        assert srv.returncode == -signal.SIGKILL

        srv.restart()

        assert srv.is_running() and srv.sagemaker_url == url
        assert not _still_running(pids)  # the orphaned stub too
        with ContainerClient(url) as c:
            assert c.ping()
            assert c.list_models() == []  # a replaced container starts empty
            c.load("k.tar.gz", str(packaged_test_resnet.extract(tmp_path / "k2")))
            result = c.invoke("k.tar.gz", packaged_test_resnet.sample("json"), "application/json")
            assert result.status == 200
    finally:
        srv.stop()


def test_startup_failure_reports_the_log_tail():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        srv = new_server(http_port=taken.getsockname()[1], network="host")  # a port of this host's network
        with pytest.raises(TritonStartupError) as info:
            srv.start()
    message = str(info.value)
    assert "exited with code 1" in message and "already in use" in message
    assert "\n" not in message
    assert srv.pids() == [] and not srv.is_running()


def test_in_its_own_network_a_port_taken_on_the_host_is_free():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        srv = new_server(sagemaker_port=taken.getsockname()[1], http_port=None, grpc_port=None, metrics_port=None)
        try:
            srv.start()
            assert ping_status(srv.sagemaker_url) == 200 and srv.sagemaker_url.startswith("http+netns://")
        finally:
            srv.stop()
