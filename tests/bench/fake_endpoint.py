"""A tiny SageMaker-runtime look-alike for the bench tests, run on a thread of the test process.

``POST /endpoints/{name}/invocations`` answers per ``behaviour``: "ok" (200), "fail" (500
InternalFailure), "model-error" (424 ModelError), "slow" (200 after ``delay_s``, or after a delay
drawn uniformly from ``delay_s``..``delay_max_s`` when that is set) or "drop" (closes
the connection without an answer, like a crashed endpoint); ``fail_after`` switches to
``after_behaviour`` ("fail" unless set) after that many requests. ``GET /ping`` and ``GET /metrics.json`` answer
like the local endpoint's. Keeps the headers of every request it saw. TCP_NODELAY on accepted
sockets, so no keep-alive request waits on Nagle's algorithm.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ERROR_SUFFIX = ":http://internal.amazon.com/coral/com.amazon.sagemaker/"


@dataclass
class FakeState:
    behaviour: str = "ok"
    delay_s: float = 0.0
    delay_max_s: float | None = None
    answered: int = 0  # invocations answered (any status), for recorded-vs-served checks
    fail_after: int | None = None
    after_behaviour: str = "fail"
    metrics: bool = True
    requests: int = 0
    metrics_requests: int = 0
    headers: list[dict] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: FakeState

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args) -> None:  # keep test output quiet
        return

    def _reply(self, status: int, body: bytes, headers: dict | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/ping":
            self._reply(200, b"")
        elif self.path == "/metrics.json" and self.state.metrics:
            with self.state.lock:
                count = self.state.requests
                self.state.metrics_requests += 1
            self._reply(200, json.dumps({"schema_version": 1, "counts": {"Invocations": count},
                                         "gauges": {"LoadedModelCount": 3}, "loaded_models": []}).encode(),
                        {"Content-Type": "application/json"})
        else:
            self._reply(404, b"{}")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        state = self.state
        with state.lock:
            state.requests += 1
            n = state.requests
            state.headers.append(dict(self.headers.items()))
            state.targets.append(self.headers.get("X-Amzn-SageMaker-Target-Model", ""))
        behaviour = state.behaviour
        if state.fail_after is not None and n > state.fail_after:
            behaviour = state.after_behaviour
        if behaviour == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if behaviour == "slow":
            high = state.delay_max_s if state.delay_max_s is not None else state.delay_s
            time.sleep(random.uniform(state.delay_s, high))
        if behaviour == "fail":
            body = json.dumps({"message": "injected failure"}).encode()
            self._reply(500, body, {"x-amzn-ErrorType": "InternalFailure" + ERROR_SUFFIX, "Content-Type": "application/json"})
        elif behaviour == "model-error":
            body = json.dumps({"Message": "bad input", "OriginalStatusCode": 400}).encode()
            self._reply(424, body, {"x-amzn-ErrorType": "ModelError" + ERROR_SUFFIX, "Content-Type": "application/json"})
        else:
            self._reply(200, b'{"outputs": []}', {"Content-Type": "application/json"})
        with state.lock:
            state.answered += 1


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):  # clients hang up when a run stops
            super().handle_error(request, client_address)


class FakeEndpoint:
    def __init__(self, **state) -> None:
        self.state = FakeState(**state)
        handler = type("Handler", (_Handler,), {"state": self.state})
        self.server = _Server(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "FakeEndpoint":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
