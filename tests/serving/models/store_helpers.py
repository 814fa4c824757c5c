"""Helpers for tests/serving/models: hand-built tarballs, free ports, directory listings, a source
that watches the cache's downloads, threads started together."""

from __future__ import annotations

import contextlib
import gzip
import io
import tarfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from serving.runtime.errors_sagemaker import HttpReply
from serving.models.store import ModelSource, ObjectInfo, ObjectReader
from serving.triton.config import free_ports

T = TypeVar("T")

CONFIG = 'backend: "python"\nmax_batch_size: 4\n'
ENSEMBLE_CONFIG = """platform: "ensemble"
max_batch_size: 4
ensemble_scheduling {
  step { model_name: "pre" model_version: -1 input_map { key: "IN" value: "x" } output_map { key: "OUT" value: "y" } }
  step { model_name: "net" model_version: -1 input_map { key: "IN" value: "y" } output_map { key: "OUT" value: "z" } }
}
"""


@dataclass(frozen=True)
class Member:
    """One tar member to write: a file (data), directory, link or special file."""

    name: str
    data: bytes | None = None
    kind: bytes = tarfile.REGTYPE
    linkname: str = ""
    size: int | None = None  # header size override (lie about the size)


class Zeros:
    """A file of ``size`` zero bytes that is never held in memory (the body of a gzip bomb)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return b"\0" * n


def write_tarball(path: Path, members: list[Member], compress: bool = True) -> Path:
    """A tar.gz with exactly these members, in this order, nothing normalised away."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for m in members:
            info = tarfile.TarInfo(m.name)
            info.type = m.kind
            info.linkname = m.linkname
            info.mode = 0o755 if m.kind == tarfile.DIRTYPE else 0o644
            if m.kind == tarfile.REGTYPE:
                data = m.data or b""
                info.size = len(data) if m.size is None else m.size
                tar.addfile(info, io.BytesIO(data) if m.size is None else None)
            else:
                tar.addfile(info)
    payload = raw.getvalue()
    if compress:
        payload = gzip.compress(payload, compresslevel=1, mtime=0)
    path.write_bytes(payload)
    return path


def model_members(name: str = "tiny", config: str = CONFIG) -> list[Member]:
    return [
        Member(name, kind=tarfile.DIRTYPE),
        Member(f"{name}/config.pbtxt", config.encode()),
        Member(f"{name}/1", kind=tarfile.DIRTYPE),
        Member(f"{name}/1/model.py", b"class TritonPythonModel:\n    pass\n"),
    ]


def free_port() -> int:
    return free_ports(1)[0]


class WatchedSource(ModelSource):
    """A real source behind a wrapper that sees each download start (:meth:`on_download`, under
    a lock) and can make each one slow (``delay_s``)."""

    def __init__(self, inner: ModelSource, delay_s: float = 0.0) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.delay_s = delay_s
        self._lock = threading.Lock()

    def on_download(self, target: str) -> None:
        """Called as the download of ``target`` starts, one call at a time."""

    def list_targets(self) -> tuple[ObjectInfo, ...]:
        return self.inner.list_targets()

    def stat(self, target: str) -> ObjectInfo:
        return self.inner.stat(target)

    @contextlib.contextmanager
    def open(self, target: str) -> Iterator[ObjectReader]:
        with self._lock:
            self.on_download(target)
        time.sleep(self.delay_s)
        with self.inner.open(target) as reader:
            yield reader


def run_together(work: Callable[[int], T], threads: int = 8, timeout_s: float = 30.0) -> tuple[list[T], list[BaseException]]:
    """``work(i)`` on ``threads`` threads released at once (a barrier): what they returned and
    what they raised. AssertionError when a thread is still running after ``timeout_s``."""
    start = threading.Barrier(threads)
    results: list[T] = []
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            start.wait()
            results.append(work(index))
        except BaseException as exc:  # noqa: BLE001 (returned to the test)
            errors.append(exc)

    started = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join(timeout_s)
    assert not any(t.is_alive() for t in started), f"threads still running after {timeout_s:g} s"
    return results, errors


def tree(root: Path) -> list[str]:
    """Every path under root, relative, sorted (for 'nothing left behind' checks)."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


class ReplyHandler(BaseHTTPRequestHandler):
    """Answers every POST with its server's ``reply``, recording (path, headers, body)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # TCP_NODELAY: no 40 ms delayed-ACK stalls on keep-alive

    def do_POST(self) -> None:  # noqa: N802 (http.server naming)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        server: ReplyServer = self.server  # type: ignore[assignment]
        server.requests.append((self.path, dict(self.headers), body))
        reply = server.reply
        self.send_response(reply.status)
        for name, value in reply.headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        self.wfile.write(reply.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class ReplyServer(ThreadingHTTPServer):
    """A local HTTP server that sends one fixed reply (set ``reply``) to every request."""

    daemon_threads = True

    def __init__(self, reply: HttpReply | None = None) -> None:
        super().__init__(("127.0.0.1", 0), ReplyHandler)
        self.reply = reply
        self.requests: list = []
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> "ReplyServer":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()
        self.server_close()


def invoke_with_reply(reply: HttpReply, target: str = "model.tar.gz") -> tuple[Any, Exception]:
    """(client, exception): a real boto3 sagemaker-runtime client's InvokeEndpoint answered with
    ``reply`` by a local HTTP server, one attempt, as it would parse SageMaker's answer."""
    import boto3
    from botocore.config import Config

    with ReplyServer(reply) as server:
        client = boto3.client(
            "sagemaker-runtime", endpoint_url=server.url, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
            config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
        )
        try:
            client.invoke_endpoint(EndpointName="local", TargetModel=target, ContentType="application/json", Body=b"{}")
        except Exception as exc:  # noqa: BLE001 (returned to the test)
            return client, exc
        raise AssertionError(f"InvokeEndpoint succeeded against a {reply.status} reply")
