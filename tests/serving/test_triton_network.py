"""Nothing the toolkit starts is open to the network (issue 13): Triton's SageMaker port, which
Triton binds to 0.0.0.0 whatever it is told, lives in a network namespace of its own, reached
through a Unix socket only this user can open; ``mme serve`` and ``mme capacity`` listen on
loopback alone; where no namespace can be made, ``mme serve`` refuses unless told
``--triton-network host``, which exposes Triton and says so.

Every request these tests send goes to 127.0.0.1 or into a namespace they created."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Iterator

import boto3
import psutil
import pytest
import requests

from mme.process import child_env
from serving.triton.container_transport import NamespaceConnection, http_session, netns_address, netns_socket, netns_url
from serving.triton import netns
from serving.triton.config import free_ports
from serving.triton.netns import IsolationUnavailable, PrivateNetwork, namespace_support
from tests.conftest import serving_process
from tests.listening import Watch

ROOT = Path(__file__).resolve().parents[2]
ISOLATION = namespace_support()
needs_namespaces = pytest.mark.skipif(not ISOLATION.available, reason=f"no network namespaces here: {ISOLATION.problem}")

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def _serve_command(models: Path, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mme", "serve", "--models", str(models), "--port", str(port), "--server", "local",
            *extra]


@contextlib.contextmanager
def _serving(models: Path, port: int, stderr: Path, *extra: str) -> Iterator[subprocess.Popen]:
    """``mme serve`` running and answering /ping (tests.conftest.serving_process), its stderr in ``stderr``."""
    with open(stderr, "w") as err, serving_process(_serve_command(models, port, *extra), f"http://127.0.0.1:{port}/ping",
                                                   what="mme serve", timeout_s=90.0, cwd=ROOT, env=child_env(),
                                                   stdout=subprocess.DEVNULL, stderr=err, text=True) as process:
        yield process


def _invoke(url: str, packaged) -> None:
    runtime = boto3.client("sagemaker-runtime", endpoint_url=url, region_name="us-east-1",
                           aws_access_key_id="local", aws_secret_access_key="local")
    runtime.invoke_endpoint(EndpointName="local", TargetModel=packaged.manifest.tarball,
                            ContentType="application/json", Body=packaged.sample("json"))


@needs_namespaces
def test_serve_on_default_options_listens_on_loopback_only_and_triton_in_its_own_network(packaged_test_resnet,
                                                                                          tmp_path):
    port = free_ports(1)[0]
    watch = Watch()
    with _serving(packaged_test_resnet.directory, port, tmp_path / "stderr") as serve:
        url = f"http://127.0.0.1:{port}"
        _invoke(url, packaged_test_resnet)  # a python-backend stub runs from here on
        watch.look(serve.pid)
        container = requests.get(f"{url}/metrics.json", timeout=10).json()["container"]["url"]
    err = (tmp_path / "stderr").read_text()
    assert serve.returncode == 0, err
    assert {(s.ip, s.port) for s in watch.listening} == {("127.0.0.1", port)}  # the front, and nothing else
    assert watch.exposed == set()
    assert {"tritonserver", "triton_python_backend_stub"} <= set(watch.private.values())
    assert container.startswith("http+netns://")
    assert "Triton runs in a private network namespace" in err


@needs_namespaces
def test_tritons_socket_is_for_this_user_only(tmp_path):
    from serving.triton.config import TritonServerConfig
    from serving.triton.local import LocalTritonServer

    server = LocalTritonServer(TritonServerConfig(sagemaker_port=0, http_port=None, grpc_port=None,
                                                  metrics_port=None))
    with server:
        address = netns_address(server.sagemaker_url)
        assert address is not None and address[1] == server.config.sagemaker_port
        path = Path(address[0])
        assert stat.S_ISSOCK(path.stat().st_mode) and stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert server.pid in server.pids() and psutil.Process(server.pid).name() == "tritonserver"
        broker = psutil.Process(server.pid).parent()
        assert broker.pid not in server.pids()  # the broker's memory is not counted as Triton's
    assert not path.exists()


def test_triton_network_host_exposes_triton_and_says_so(packaged_test_resnet, tmp_path):
    port = free_ports(1)[0]
    watch = Watch()
    with _serving(packaged_test_resnet.directory, port, tmp_path / "stderr", "--triton-network", "host") as serve:
        watch.look(serve.pid)
    err = (tmp_path / "stderr").read_text()
    assert serve.returncode == 0, err
    exposed = {(s.process, s.ip) for s in watch.exposed}
    assert exposed == {("tritonserver", "0.0.0.0")}  # what the user asked for, seen as such
    assert watch.private == {}
    assert "listens on 0.0.0.0" in err and "--triton-network host" in err


@needs_namespaces
def test_capacity_listens_on_nothing_exposed(packaged_test_resnet, tmp_path):
    capacity = subprocess.Popen([sys.executable, "-m", "mme", "capacity", str(packaged_test_resnet.directory),
                                 "--server", "local", "--memory", "host", "--probe-copies", "1", "--no-verify",
                                 "--out", str(tmp_path)], cwd=ROOT, env=child_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watch = Watch()
    try:
        watch.follow(capacity.pid, until=lambda: capacity.poll() is not None, timeout_s=300)
        out, err = capacity.communicate(timeout=120)
    finally:
        if capacity.poll() is None:
            capacity.kill()
    assert capacity.returncode == 0, err
    assert "tritonserver" in watch.private.values()  # watched while Triton ran
    assert watch.exposed == set() and watch.listening == set()


def _fake_unshare(directory: Path) -> dict:
    """An environment whose ``unshare`` fails as it does where user namespaces are not allowed."""
    directory.mkdir()
    fake = directory / "unshare"
    fake.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    env = child_env()
    env["PATH"] = f"{directory}{os.pathsep}{env.get('PATH', os.defpath)}"
    return env


def test_without_namespaces_serve_refuses_and_says_how_to_get_isolation(packaged_test_resnet, tmp_path):
    port = free_ports(1)[0]
    serve = subprocess.Popen(_serve_command(packaged_test_resnet.directory, port), cwd=ROOT,
                             env=_fake_unshare(tmp_path / "bin"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = serve.communicate(timeout=120)
    finally:
        if serve.poll() is None:
            serve.kill()
    assert serve.returncode != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "Operation not permitted" in lines[0] and "private network namespace" in lines[0]
    assert "--triton-network host" in lines[0] and "--server docker" in lines[0]
    assert not [p for p in psutil.process_iter(["name"]) if p.info["name"] == "tritonserver"
                and p.ppid() == serve.pid]


def test_namespace_support_reports_why_it_is_unavailable(tmp_path, monkeypatch):
    env = _fake_unshare(tmp_path / "bin")
    monkeypatch.setenv("PATH", env["PATH"])
    namespace_support.cache_clear()
    try:
        support = namespace_support()
        assert not support.available and "Operation not permitted" in support.problem
        with pytest.raises(IsolationUnavailable, match="--triton-network host"):
            PrivateNetwork(tmp_path, {"sagemaker": 8080})
    finally:
        namespace_support.cache_clear()


@needs_namespaces
def test_a_socket_path_too_long_for_unix_sockets_is_refused_with_the_fix(tmp_path):
    deep = tmp_path / ("d" * 120)
    with pytest.raises(IsolationUnavailable, match="set TMPDIR to a shorter directory"):
        PrivateNetwork(deep, {"sagemaker": 8080})


ECHO_SERVER = textwrap.dedent("""
    import socket, sys
    server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
    connection, _ = server.accept()
    with connection:
        while data := connection.recv(1 << 16):
            connection.sendall(data)
    sys.exit(7)
""")


@needs_namespaces
def test_sockets_from_the_broker_reach_the_namespace_and_the_broker_exits_as_its_command(tmp_path):
    """A socket handed out by the broker of a namespace this test made connects to a server on
    that namespace's loopback (nothing listens on this machine's 127.0.0.1:9999), carries 8 MiB
    there and back directly; then the broker's exit status is its command's."""
    broker = tmp_path / "echo.sock"
    process = subprocess.Popen([*ISOLATION.prefix, sys.executable, "-I", str(netns.BROKER_SCRIPT),
                              f"--listen=echo={broker}:9999", "--", sys.executable, "-c", ECHO_SERVER, "9999"])
    try:
        body = os.urandom(8 << 20)
        deadline = time.monotonic() + 30
        while True:  # until the echo server listens in the namespace
            try:
                client = netns_socket(str(broker), 5.0)
                client.connect(("127.0.0.1", 9999))
                break
            except OSError:
                assert time.monotonic() < deadline, "the broker's namespace never had the echo server"
                time.sleep(0.1)
        assert client.family == socket.AF_INET
        # requests' connections take their sockets from the broker and set TCP_NODELAY as urllib3 does
        # (without it, every management call waited 40 ms for a delayed ACK).
        connection = NamespaceConnection("localhost", 9999, broker=str(broker))
        made = connection._new_conn()
        assert made.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        made.close()
        received = bytearray()
        with client:
            sender = threading.Thread(target=lambda: (client.sendall(body), client.shutdown(socket.SHUT_WR)))
            sender.start()
            while chunk := client.recv(1 << 20):
                received += chunk
            sender.join()
        assert bytes(received) == body
        assert process.wait(timeout=30) == 7
    finally:
        if process.poll() is None:
            process.kill()
    assert not broker.exists()


def test_the_broker_listen_option_and_the_netns_urls_are_checked():
    from serving.triton.netns_broker import parse_listen

    assert parse_listen("sagemaker=/tmp/x/s.sock:8080") == ("sagemaker", Path("/tmp/x/s.sock"), 8080)
    with pytest.raises(Exception, match="NAME=SOCKET:PORT"):
        parse_listen("sagemaker=/tmp/x/s.sock")
    url = netns_url(Path("/tmp/a b/s.sock"), 8080)
    assert url == "http+netns://%2Ftmp%2Fa%20b%2Fs.sock:8080"
    assert netns_address(url) == ("/tmp/a b/s.sock", 8080) and netns_address("http://127.0.0.1:8080") is None


def test_a_gone_broker_is_a_connection_error_not_a_hang(tmp_path):
    from serving.triton.container import ContainerClient, ping_status

    url = netns_url(tmp_path / "gone.sock", 8080)
    assert ping_status(url, timeout_s=1.0) is None
    with ContainerClient(url, timeout_s=1.0) as client:
        assert client.ping() is False
    with http_session() as session, pytest.raises(requests.ConnectionError, match="gone.sock"):
        session.get(f"{url}/ping", timeout=1.0)
