"""What SageMaker's MME front end does, in front of a real Triton container.

On the first request for a target: fetch the tarball (local directory or S3) into the
cache, verify and extract it safely, load it through the container's ``POST /models`` the
way SageMaker does: named by the hash of its cache directory (``<root>/<hash>/model``), the
target in the ``X-Amzn-SageMaker-Target-Model`` header of every load, invoke and unload.
Concurrent first requests cause one load while the others wait. When a load would cross
the memory threshold, or the container answers 507, the least recently used models are
unloaded first. A model that fails to load fails its own requests only. A container that
dies is restarted and its models reload on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import aiohttp

from mme.progress import Reporter
from serving import errors_sagemaker as sm
from serving.cache import CachedModel, ModelCache, cache_key
from serving.container import (
    TARGET_HEADER,
    ContainerClient,
    ContainerOutOfMemory,
    ModelAlreadyLoaded,
    ModelLoadFailed,
    ModelNotLoaded,
)
from serving.metrics import EndpointMetrics
from serving.store import InvalidTargetName, validate_target_name
from serving.triton.base import TritonServer

MAX_PAYLOAD_BYTES = 6_291_456  # InvokeEndpoint's real-time limit
MAX_ATTEMPTS = 4  # loads (or a container restart) one request may wait for


@dataclass(frozen=True)
class EndpointConfig:
    memory_limit_bytes: int
    memory_threshold: float = 0.9
    max_payload_bytes: int = MAX_PAYLOAD_BYTES
    region: str = "us-east-1"
    account: str = "000000000000"
    invoke_timeout_s: float = 120.0


@dataclass
class LoadedEntry:
    """Book-keeping for one loaded model (mutable: last use and in-flight count change)."""

    target: str
    cached: CachedModel
    footprint_bytes: int
    load_seconds: float
    inflight: int = 0
    invocations: int = 0


class LoadFailed(Exception):
    """The container refused a model: its requests fail with ModelError, others go on."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class MultiModelEndpoint:
    def __init__(self, cache: ModelCache, server: TritonServer, config: EndpointConfig,
                 memory_probe: Callable[[], int], reporter: Reporter | None = None) -> None:
        self.cache = cache
        self.server = server
        self.config = config
        self.memory_probe = memory_probe
        self.reporter = reporter or Reporter(quiet=True)
        self.metrics = EndpointMetrics()
        self.control = ContainerClient(server.sagemaker_url)
        self._loaded: OrderedDict[str, LoadedEntry] = OrderedDict()
        self._loading: dict[str, asyncio.Future] = {}
        self._control_lock = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=256, keepalive_timeout=60)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=self.config.invoke_timeout_s)
        )
        self._record_memory()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        self.control.close()

    # -- state -----------------------------------------------------------------------------
    @property
    def limit(self) -> int:
        return self.config.memory_limit_bytes

    def loaded_models(self) -> list[dict]:
        return [
            {"target": e.target, "footprint_bytes": e.footprint_bytes, "load_seconds": round(e.load_seconds, 3),
             "invocations": e.invocations, "model_dir": str(e.cached.model_dir)}
            for e in self._loaded.values()
        ]

    def _record_memory(self) -> int:
        used = self.memory_probe()
        self.metrics.memory(used, self.limit, len(self._loaded))
        return used

    def snapshot(self) -> dict:
        self._record_memory()
        return {**self.metrics.snapshot(), "loaded_models": self.loaded_models(),
                "memory_threshold": self.config.memory_threshold,
                "container": {"kind": type(self.server).__name__, "pid": self.server.pid,
                              "url": self.server.sagemaker_url}}

    # -- invocations -----------------------------------------------------------------------
    async def invoke(self, target: str | None, body: bytes, content_type: str, accept: str | None) -> sm.HttpReply:
        start = time.perf_counter()
        if not target:
            return sm.validation_error("This is a multi-model endpoint: set TargetModel (X-Amzn-SageMaker-Target-Model).")
        try:
            target = validate_target_name(target)
        except InvalidTargetName as exc:
            return sm.validation_error(str(exc))
        if len(body) > self.config.max_payload_bytes:
            return sm.validation_error(
                f"Received payload size {len(body)} bytes exceeds the limit of {self.config.max_payload_bytes} bytes."
            )
        restarted = False
        total_wait = 0.0
        hit = True
        for _ in range(MAX_ATTEMPTS):
            try:
                attempt_hit, wait_s = await self._ensure_loaded(target)
            except LoadFailed as exc:
                self._finish(target, "model_error", 0.0, start, 0.0, False)
                return self._model_error(exc.status, exc.message)
            except Exception as exc:  # store and extraction errors carry their SageMaker code
                self._finish(target, "error", 0.0, start, 0.0, False)
                return sm.reply_for_exception(exc)
            hit = hit and attempt_hit
            total_wait += wait_s
            entry = self._loaded.get(target)
            if entry is None:
                continue  # evicted between its load and this request: load it again
            entry.inflight += 1  # an entry with requests in flight is never evicted
            entry.invocations += 1
            model_start = time.perf_counter()
            try:
                status, headers, data = await self._forward(target, body, content_type, accept)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                if not restarted and not self.server.is_running():
                    restarted = True
                    await self._recover()
                    continue
                self._finish(target, "error", 0.0, start, total_wait, hit)
                return sm.service_unavailable(f"The serving container did not answer: {exc}")
            finally:
                entry.inflight -= 1
            model_s = time.perf_counter() - model_start
            if status == 200:
                self._finish(target, "ok", model_s, start, total_wait, hit)
                return sm.invocation_reply(data, headers.get("Content-Type", "application/json"))
            self._finish(target, "model_error", model_s, start, total_wait, hit)
            return self._model_error(status, _message(data))
        self._finish(target, "error", 0.0, start, total_wait, False)
        return sm.model_not_ready(f"Model {target} was unloaded to make room before it could serve; retry the request.")

    def _finish(self, target: str, outcome: str, model_s: float, start: float, wait_s: float, hit: bool) -> None:
        total = time.perf_counter() - start
        self.metrics.request(target, outcome, model_s * 1e6, total * 1e6, wait_s * 1e6, hit)

    def _model_error(self, status: int, message: str) -> sm.HttpReply:
        return sm.model_error(status, message, endpoint_name="local", region=self.config.region,
                              account=self.config.account)

    async def _forward(self, target: str, body: bytes, content_type: str, accept: str | None):
        headers = {"Content-Type": content_type}
        if accept:
            headers["Accept"] = accept
        headers[TARGET_HEADER] = target
        url = f"{self.server.sagemaker_url}/models/{cache_key(target)}/invoke"
        if self._session is None:
            raise RuntimeError("MultiModelEndpoint.start() was not called")
        async with self._session.post(url, data=body, headers=headers) as response:
            return response.status, response.headers, await response.read()

    # -- loading and eviction ----------------------------------------------------------------
    async def _ensure_loaded(self, target: str) -> tuple[bool, float]:
        if target in self._loaded:
            self._loaded.move_to_end(target)
            return True, 0.0
        start = time.perf_counter()
        pending = self._loading.get(target)
        if pending is None:
            pending = asyncio.get_running_loop().create_future()
            self._loading[target] = pending
            try:
                await self._load(target)
                pending.set_result(None)
            except BaseException as exc:
                pending.set_exception(exc)
                pending.exception()  # retrieved: waiters (if any) re-raise it themselves
                raise
            finally:
                self._loading.pop(target, None)
        else:
            await asyncio.shield(pending)
        return False, time.perf_counter() - start

    async def _load(self, target: str) -> None:
        cached = await asyncio.to_thread(self.cache.fetch, target)
        async with self._control_lock:
            while True:
                await self._make_room()
                before = self.memory_probe()
                started = time.perf_counter()
                try:
                    await asyncio.to_thread(self.control.load, cached.container_name,
                                            self.server.model_url(cached.model_dir), target=target)
                except ModelAlreadyLoaded:
                    pass  # the container kept it (e.g. across a front restart): serve it as loaded
                except ContainerOutOfMemory as exc:
                    if not await self._evict_one():
                        raise LoadFailed(507, f"out of memory loading {target} with nothing left to unload: {exc}") from None
                    continue
                except ModelLoadFailed as exc:
                    self.reporter.info(f"  load {target} failed: {exc}")
                    if any(ch.isspace() for ch in target):
                        self.reporter.warn(
                            f"{target}: Triton names the model after its target, and the python backend of Triton "
                            "releases before 25.08 cuts model names at spaces (python_backend stub_launcher), so "
                            "python-backend models cannot load under such a name there, on SageMaker too; rename the object"
                        )
                    raise LoadFailed(exc.status, str(exc)) from None
                load_s = time.perf_counter() - started
                footprint = max(0, self.memory_probe() - before)
                self._loaded[target] = LoadedEntry(target, cached, footprint, load_s)
                fresh = not cached.cache_hit
                self.metrics.model_loaded(load_s, cached.download_seconds if fresh else None,
                                          cached.extract_seconds if fresh else None)
                used = self._record_memory()
                self.reporter.info(
                    f"  loaded {target} in {load_s:.2f} s (+{footprint / 2**20:.0f} MiB; "
                    f"{len(self._loaded)} loaded, {100 * used / self.limit:.1f}% of the memory limit)"
                )
                return

    def _estimate_footprint(self) -> int:
        sizes = [e.footprint_bytes for e in self._loaded.values() if e.footprint_bytes > 0]
        return max(sizes) if sizes else 0

    async def _make_room(self) -> None:
        budget = self.config.memory_threshold * self.limit
        while self._loaded and self.memory_probe() + self._estimate_footprint() > budget:
            if not await self._evict_one():
                return

    async def _evict_one(self) -> bool:
        """Unload the least recently used model with no request in flight; False when every
        loaded model is serving (then the load goes ahead and the container has the last word)."""
        victim = next((t for t, e in self._loaded.items() if e.inflight == 0), None)
        if victim is None:
            return False
        # Out of the table first: a request for it from now on loads it again (and waits for
        # the control lock this eviction holds) instead of reaching a model being unloaded.
        del self._loaded[victim]
        started = time.perf_counter()
        with contextlib.suppress(ModelNotLoaded):  # already gone is as good as unloaded
            await asyncio.to_thread(self.control.unload, cache_key(victim), target=victim)
        unload_s = time.perf_counter() - started
        self.metrics.model_unloaded(unload_s, evicted=True)
        used = self._record_memory()
        self.reporter.info(f"  evicted {victim} (least recently used) in {unload_s:.2f} s; {used / 2**20:.0f} MiB used")
        return True

    async def unload(self, target: str) -> bool:
        async with self._control_lock:
            if target not in self._loaded:
                return False
            started = time.perf_counter()
            self._loaded.pop(target, None)
            with contextlib.suppress(ModelNotLoaded):
                await asyncio.to_thread(self.control.unload, cache_key(target), target=target)
            self.metrics.model_unloaded(time.perf_counter() - started, evicted=False)
            self._record_memory()
            return True

    # -- faults ----------------------------------------------------------------------------------
    async def _recover(self) -> None:
        async with self._control_lock:
            if self.server.is_running():
                return
            self.reporter.warn(
                f"the Triton server exited (code {self.server.returncode}); restarting it, models reload on demand"
            )
            self._loaded.clear()
            await asyncio.to_thread(self.server.restart)
            self.metrics.restarted()
            self._record_memory()

    async def watchdog(self, interval_s: float = 1.0) -> None:
        """Detect a crashed server between requests too."""
        while True:
            await asyncio.sleep(interval_s)
            if not self.server.is_running():
                await self._recover()


def _message(data: bytes) -> str:
    """Triton's error bodies are {"error": "..."}; anything else is shown as text."""
    try:
        parsed = json.loads(data)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and "error" in parsed:
        return str(parsed["error"])
    return data[:500].decode("utf-8", "replace")
