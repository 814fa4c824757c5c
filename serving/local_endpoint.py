"""A whole local MME: Triton server + model cache + endpoint + HTTP front, started and
stopped together. ``mme serve`` runs it in the foreground; tests and ``mme capacity``
run it on a background thread."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import psutil
from aiohttp import web

from mme.errors import UsageError
from mme.progress import Reporter
from serving.cache import ModelCache
from serving.copies import CopiesSource
from serving.endpoint import EndpointConfig, MultiModelEndpoint
from serving.front import build_app
from serving.memory import gpu_memory, process_tree_memory
from serving.store import source_from_uri
from serving.triton.base import TritonServerConfig
from serving.triton.docker import DockerTritonServer
from serving.triton.factory import create_server


@dataclass(frozen=True)
class LocalEndpointOptions:
    models: str  # directory or s3://bucket/prefix holding <name>.tar.gz objects
    host: str = "127.0.0.1"
    port: int = 8080  # 0: any free port
    memory_threshold: float = 0.9
    memory_limit_bytes: int | None = None  # default: the GPU's memory, or this host's RAM
    copies: int = 0  # answer for <stem>-v1..vN.tar.gz from <stem>.tar.gz
    server_kind: str = "auto"
    cache_dir: Path | None = None
    s3_endpoint_url: str | None = None

    def check(self) -> None:
        if not 0 < self.memory_threshold <= 1:
            raise UsageError(f"--memory-threshold must be in (0, 1] (got {self.memory_threshold})")
        if self.memory_limit_bytes is not None and self.memory_limit_bytes <= 0:
            raise UsageError(f"--memory-limit must be a positive number of bytes (got {self.memory_limit_bytes})")
        if not 0 <= self.port < 65536:
            raise UsageError(f"--port must be between 0 and 65535 (got {self.port})")


def _check_engines(models: str) -> None:
    """Refuse, before anything starts, TensorRT engines built for another TensorRT than the
    serving release (``MME_TRITON_RELEASE``, else the default) runs: they would fail to load."""
    import json
    import os

    from mme.versions import release
    from packager.compat import check_plan_compatible

    manifest = Path(models) / "manifest.json"
    if not models.startswith("s3://") and manifest.is_file():
        check_plan_compatible(json.loads(manifest.read_text()), release(os.environ.get("MME_TRITON_RELEASE")))


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop (libuv): the front's per-request cost is what the endpoint adds to latency."""
    import uvloop

    return uvloop.new_event_loop()


class LocalEndpoint:
    def __init__(self, options: LocalEndpointOptions, reporter: Reporter | None = None) -> None:
        options.check()
        _check_engines(options.models)
        self.options = options
        self.reporter = reporter or Reporter(quiet=True)
        source = source_from_uri(options.models, endpoint_url=options.s3_endpoint_url)
        if options.copies:
            source = CopiesSource(source, options.copies)
        self._tmp = None
        cache_dir = options.cache_dir
        if cache_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="mme-cache-")
            cache_dir = Path(self._tmp.name)
        self.cache = ModelCache(cache_dir, source)
        self.server = create_server(options.server_kind, TritonServerConfig(sagemaker_port=0, grpc_port=None, metrics_port=None))
        self.endpoint: MultiModelEndpoint | None = None
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._watchdog: asyncio.Task | None = None

    @property
    def url(self) -> str:
        return f"http://{self.options.host}:{self.port}"

    def memory_used(self) -> int:
        if isinstance(self.server, DockerTritonServer):
            reading = gpu_memory()
            if reading is not None:
                return reading.used_bytes
        return process_tree_memory(self.server.pids()).rss_bytes

    def _memory_limit(self) -> int:
        if self.options.memory_limit_bytes:
            return self.options.memory_limit_bytes
        if isinstance(self.server, DockerTritonServer):
            reading = gpu_memory()
            if reading is not None:
                return reading.total_bytes
        return psutil.virtual_memory().total

    async def _start_async(self) -> None:
        config = EndpointConfig(memory_limit_bytes=self._memory_limit(), memory_threshold=self.options.memory_threshold)
        self.endpoint = MultiModelEndpoint(self.cache, self.server, config, self.memory_used, self.reporter)
        await self.endpoint.start()
        self._runner = web.AppRunner(build_app(self.endpoint), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.options.host, self.options.port, backlog=1024)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self._watchdog = asyncio.get_running_loop().create_task(self.endpoint.watchdog())

    async def _stop_async(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        if self._runner is not None:
            await self._runner.cleanup()
        if self.endpoint is not None:
            await self.endpoint.close()

    def start_in_thread(self) -> "LocalEndpoint":
        """Start everything; the HTTP front runs on a daemon thread's event loop."""
        self.server.start()
        self._loop = new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._start_async())
            except BaseException as exc:  # reported to the starting thread below
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="mme-endpoint", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self.server.stop()
            raise failure[0]
        return self

    def call(self, coro):
        """Run a coroutine on the endpoint's loop from another thread."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def stop(self) -> None:
        try:
            if self._loop is not None and self._thread is not None and self._thread.is_alive():
                self.call(self._stop_async())
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(timeout=10)
        finally:
            self.server.stop()
            if self._tmp is not None:
                self._tmp.cleanup()

    def __enter__(self) -> "LocalEndpoint":
        return self.start_in_thread()

    def __exit__(self, *exc_info) -> None:
        self.stop()
