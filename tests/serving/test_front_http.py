"""The front's HTTP behaviour on its real server (uvicorn's httptools protocol on a uvloop loop,
serving/runtime/http_server.py), in front of an endpoint that echoes: what a client sees on the
wire (routes, refusals before the body is read, chunked bodies past the limit, Expect:
100-continue, pipelining, keep-alive after a refusal) and a port in use said as a usage error."""

from __future__ import annotations

import socket
import uuid

import pytest
import requests

from mme.errors import UsageError
from serving.runtime import outcomes as out
from serving.runtime.endpoint import EndpointConfig
from serving.runtime.front import Front
from serving.runtime.http_server import HttpServer, bind_listener
from serving.runtime.local_endpoint import start_loop_thread, stop_loop_thread
from serving.runtime.metrics import EndpointMetrics

LIMIT = 1000  # bytes: the echo endpoint's payload limit
SIGNED = {"Authorization": "AWS4-HMAC-SHA256 Credential=k/20260101/us-east-1/sagemaker/aws4_request, "
                           "SignedHeaders=host;x-amz-date, Signature=" + "0" * 64,
          "X-Amzn-SageMaker-Target-Model": "echo.tar.gz", "Content-Type": "application/json"}


class EchoEndpoint:
    """What the front asks of an endpoint: its config and metrics, and invocations answered with the body."""

    def __init__(self) -> None:
        self.config = EndpointConfig(memory_limit_bytes=1 << 30, max_payload_bytes=LIMIT)
        self.metrics = EndpointMetrics()
        self.bodies: list[bytes] = []

    async def invoke(self, target, body, content_type, accept):
        self.bodies.append(body)
        return out.Invoked(body, content_type, model_s=0.001, hit=True)

    def snapshot(self) -> dict:
        return {"loaded": 0}

    def loaded_models(self) -> list:
        return []


@pytest.fixture(scope="module")
def front():
    endpoint = EchoEndpoint()
    server = HttpServer(Front(endpoint), bind_listener("127.0.0.1", 0))
    loop, thread = start_loop_thread(server.start, "test-front")
    try:
        yield f"http://127.0.0.1:{server.port}", endpoint
    finally:
        stop_loop_thread(loop, thread, server.stop)


def invocations(url: str) -> str:
    return f"{url}/endpoints/{EndpointConfig(memory_limit_bytes=1).endpoint_name}/invocations"


def test_an_invocation_is_answered_with_sagemaker_headers_and_a_fresh_request_id(front):
    url, endpoint = front
    with requests.Session() as session:
        replies = [session.post(invocations(url), data=b'{"x": %d}' % i, headers=SIGNED, timeout=10) for i in range(2)]
    assert [r.status_code for r in replies] == [200, 200]
    assert replies[1].content == b'{"x": 1}' and replies[1].headers["Content-Length"] == "8"
    assert replies[1].headers["X-Amzn-Invoked-Production-Variant"] == "AllTraffic"
    assert replies[1].headers["X-Mme-Cold"] == "0" and "Server" not in replies[1].headers
    ids = [uuid.UUID(r.headers["x-amzn-RequestId"]) for r in replies]
    assert ids[0] != ids[1] and {i.version for i in ids} == {4}


def test_refusals_come_before_the_body_and_the_connection_stays_usable(front):
    url, endpoint = front
    with requests.Session() as session:
        unsigned = session.post(invocations(url), data=b"{}", timeout=10)
        too_large = session.post(invocations(url), data=b"0" * (LIMIT + 1), headers=SIGNED, timeout=10)
        chunked = session.post(invocations(url), data=iter([b"0" * 600, b"0" * 600]), headers=SIGNED, timeout=10)
        exactly = session.post(invocations(url), data=b"1" * LIMIT, headers=SIGNED, timeout=10)
    assert unsigned.status_code == 403 and unsigned.json()["message"] == "Missing Authentication Token"
    assert too_large.status_code == 413 and chunked.status_code == 413
    assert exactly.status_code == 200 and exactly.content == b"1" * LIMIT
    assert b"0" * (LIMIT + 1) not in endpoint.bodies and b"0" * 1200 not in endpoint.bodies


def test_routes_other_methods_and_unknown_paths(front):
    url, _ = front
    assert requests.get(f"{url}/ping", timeout=10).status_code == 200
    assert requests.get(f"{url}/models", timeout=10).json() == {"models": []}
    assert requests.get(invocations(url), timeout=10).status_code == 405
    assert requests.post(f"{url}/ping", timeout=10).status_code == 405
    assert requests.get(f"{url}/nowhere", timeout=10).status_code == 404
    other = requests.post(f"{url}/endpoints/other/invocations", data=b"{}", headers=SIGNED, timeout=10)
    assert other.status_code == 400 and "Endpoint other of account" in other.json()["Message"]


def _head(body: bytes, extra: str = "") -> bytes:
    lines = [f"POST /endpoints/{EndpointConfig(memory_limit_bytes=1).endpoint_name}/invocations HTTP/1.1",
             "Host: x", f"Content-Length: {len(body)}", *[f"{k}: {v}" for k, v in SIGNED.items()]]
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


def _read_answers(sock: socket.socket, count: int) -> bytes:
    data = b""
    while data.count(b"HTTP/1.1 200") < count:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed after {data!r}"
        data += chunk
    return data


def test_expect_100_continue_and_pipelined_requests(front):
    url, _ = front
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(_head(b'{"a": 1}', "Expect: 100-continue\r\n"))
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue")  # the body is sent only now
        sock.sendall(b'{"a": 1}')
        assert _read_answers(sock, 1).endswith(b'{"a": 1}')
        sock.sendall(_head(b'{"b": 2}') + b'{"b": 2}' + _head(b'{"c": 3}') + b'{"c": 3}')  # two at once
        answers = _read_answers(sock, 2)
    assert answers.index(b'{"b": 2}') < answers.index(b'{"c": 3}')


def test_a_port_in_use_is_a_usage_error_that_names_the_fix():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UsageError, match=rf"port {port} on 127.0.0.1 is already in use: pass --port"):
            bind_listener("127.0.0.1", port)
    with pytest.raises(UsageError, match="not an address of this machine"):
        bind_listener("192.0.2.1", 0)  # TEST-NET-1: no machine's own
