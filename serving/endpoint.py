"""What SageMaker's MME front end does, in front of a real Triton container.

On the first request for a target: fetch the tarball (local directory or S3) into the
cache, verify and extract it safely, load it through the container's ``POST /models`` the
way SageMaker does: named by the hash of its cache directory (``<root>/<hash>/model``), the
target in the ``X-Amzn-SageMaker-Target-Model`` header of every load, invoke and unload.

The rules SageMaker applies (sources in ../shared/reference.md, "What SageMaker's MME front
end and Triton's SageMaker mode actually do"):
- a request whose target is still downloading or loading after ``model_wait_timeout_s``
  (60 s) gets 429 ModelNotReadyException; the load goes on and later requests find it loaded;
- an invocation the container has not answered in ``invocation_timeout_s`` (60 s) gets
  ModelError with OriginalStatusCode 0;
- concurrent first requests for one target cause one load; loads of different targets run
  at the same time (Triton loads on its own threads); when a load would cross the memory
  threshold, or the container answers 507, the least recently used idle models are unloaded
  first, and a model with requests in flight is never unloaded;
- a model that fails to load fails its own requests only; a container that dies is restarted
  and its models reload on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import aiohttp
import psutil
import requests

from mme.errors import with_retry_advice
from mme.progress import Reporter
from serving import errors_sagemaker as sm
from serving.cache import CachedModel, ModelCache, cache_key
from serving.container import (
    LOAD_TIMEOUT_S,
    ContainerClient,
    ContainerOutOfMemory,
    ModelAlreadyLoaded,
    ModelLoadFailed,
    ModelNotLoaded,
)
from serving.forward import Forwarder, InvocationTimedOut
from serving.instance_metrics import InstanceSampler
from serving.metrics import EndpointMetrics
from serving.store import InvalidTargetName, validate_target_name
from serving.triton.base import TritonServer, alive

MAX_PAYLOAD_BYTES = 6_291_456  # InvokeEndpoint's real-time limit
MAX_ATTEMPTS = 4  # loads (or a container restart) one request may wait for
# Triton's python backend answers this for a model whose stub process died (OOM killer, crash).
DEAD_WORKER_MARKERS = (b"Stub process", b"is not healthy")
EVICT_UNLOAD_TIMEOUT_S = 30.0  # an eviction's unload past this restarts the server (measured: 2 s each)
DEAD_UNLOAD_TIMEOUT_S = 5.0  # then the server is restarted (see _drop_dead_model)
SAGEMAKER_TIMEOUT_S = 60.0  # both of SageMaker's 60-second rules


@dataclass(frozen=True)
class EndpointConfig:
    memory_limit_bytes: int
    memory_threshold: float = 0.9
    max_payload_bytes: int = MAX_PAYLOAD_BYTES
    region: str = "us-east-1"
    account: str = sm.DEFAULT_ACCOUNT
    endpoint_name: str = sm.DEFAULT_ENDPOINT
    variant_name: str = sm.DEFAULT_VARIANT
    model_wait_timeout_s: float = SAGEMAKER_TIMEOUT_S
    invocation_timeout_s: float = SAGEMAKER_TIMEOUT_S
    allow_unsigned: bool = False
    load_timeout_s: float = LOAD_TIMEOUT_S  # a load not finished by then fails its requests


@dataclass
class LoadedEntry:
    """Book-keeping for one loaded model (mutable: last use and in-flight count change)."""

    target: str
    cached: CachedModel
    footprint_bytes: int
    load_seconds: float
    inflight: int = 0
    invocations: int = 0
    footprint_shared: bool = False  # other loads ran at the same time: the footprint is an upper bound
    workers: tuple[psutil.Process, ...] = ()  # its own worker processes (python-backend stubs), where seen

    def workers_dead(self) -> bool:
        """It had worker processes and none of them is alive any more."""
        return bool(self.workers) and not any(alive(p) for p in self.workers)


class LoadFailed(Exception):
    """The container refused a model: its requests fail with ModelError, others go on."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(body)
        self.status = status
        self.body = body


class LoadTimedOut(Exception):
    """The container did not finish loading a model within the load timeout."""

    sagemaker_error = "InternalFailure"
    retryable = True  # the container's load goes on; a later request finds it loaded


class EndpointClosing(Exception):
    """The endpoint is shutting down: loads in progress were abandoned."""


class ModelStillLoading(Exception):
    """The target was not loaded within the model wait timeout (its load goes on)."""


class MultiModelEndpoint:
    def __init__(self, cache: ModelCache, server: TritonServer, config: EndpointConfig,
                 memory_probe: Callable[[], int], reporter: Reporter | None = None,
                 metrics: EndpointMetrics | None = None, instance_sampler: InstanceSampler | None = None) -> None:
        self.cache = cache
        self.server = server
        self.config = config
        self.memory_probe = memory_probe
        self.reporter = reporter or Reporter(quiet=True)
        self.metrics = metrics or EndpointMetrics()
        self.instance_sampler = instance_sampler  # CPU, memory, disk and GPU utilisation of the instance
        self._loaded: OrderedDict[str, LoadedEntry] = OrderedDict()
        self._loading: dict[str, asyncio.Task] = {}
        self._unloading: set[str] = set()  # Triton may still read their files
        self._reserved_bytes = 0  # estimated footprints of the loads in the container now
        self._active_loads = 0  # loads admitted to the container and not finished
        # Evictions and admissions; never held during a load. Notified when a load finishes.
        self._room = asyncio.Condition()
        self._recover_lock = asyncio.Lock()
        self._server_ready = asyncio.Event()  # cleared while a crashed server is restarted
        self._server_ready.set()
        self._forwarder: Forwarder | None = None
        self._closing = False
        self._room_waiters = 0  # loads waiting for room (then an idle model notifies them)
        self._over_threshold: set[str] = set()  # loads admitted with no way to make room
        # Footprint per target: the last clean measurement (no other load or unload alongside);
        # a measurement disturbed by others only ever raises it.
        self._footprints: dict[str, int] = {}
        self._evictions: dict[str, int] = {}  # models being evicted -> bytes expected to leave
        self._eviction_tasks: set[asyncio.Task] = set()
        self._unloads_done = 0  # unloads finished, to tell whether one ran during a measurement
        self.abandoned_loads = 0  # loads still running when the shutdown began

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        self._forwarder = Forwarder(self.server.sagemaker_url, self.config.invocation_timeout_s,
                                    loads_in_flight=lambda: len(self._loading), on_idle=lambda _: self._model_idle())
        self._record_memory()

    def begin_shutdown(self) -> None:
        """Stop waiting for loads in progress: their requests get 503 at once, so a shutdown
        does not wait for a slow load (Docker gives 10 s, Kubernetes 30 s before SIGKILL)."""
        self._closing = True
        self.abandoned_loads += len(self._loading)
        for task in list(self._loading.values()):
            task.cancel()

    async def close(self) -> None:
        self.begin_shutdown()
        if self._forwarder is not None:
            await self._forwarder.close()

    # -- state -----------------------------------------------------------------------------
    @property
    def limit(self) -> int:
        return self.config.memory_limit_bytes

    def in_use(self, target: str) -> bool:
        """Loaded, loading or unloading: its cached files must stay on disk (called from the
        cache's fetch threads: membership tests only)."""
        return target in self._loaded or target in self._loading or target in self._unloading

    def loaded_models(self) -> list[dict]:
        return [
            {"target": e.target, "footprint_bytes": e.footprint_bytes, "footprint_shared": e.footprint_shared,
             "load_seconds": round(e.load_seconds, 3),
             "invocations": e.invocations, "model_dir": str(e.cached.model_dir)}
            for e in self._loaded.values()
        ]

    def _record_memory(self) -> int:
        used = self.memory_probe()
        self.metrics.memory(used, self.limit, len(self._loaded))
        return used

    def snapshot(self) -> dict:
        self._record_memory()
        if self.instance_sampler is not None:
            self.metrics.instance(self.instance_sampler.sample())
        return {**self.metrics.snapshot(), "loaded_models": self.loaded_models(),
                "loading_models": sorted(self._loading), "memory_threshold": self.config.memory_threshold,
                "endpoint": {"name": self.config.endpoint_name, "variant": self.config.variant_name},
                "container": {"kind": type(self.server).__name__, "pid": self.server.pid,
                              "url": self.server.sagemaker_url}}

    # -- invocations -----------------------------------------------------------------------
    async def invoke(self, target: str | None, body: bytes, content_type: str, accept: str | None) -> sm.HttpReply:
        start = time.perf_counter()
        reply, model_s, wait_s, hit = await self._invoke(target, body, content_type, accept, start)
        total_us = (time.perf_counter() - start) * 1e6
        self.metrics.request(target or "", reply.status, model_us=model_s * 1e6, total_us=total_us,
                             wait_us=wait_s * 1e6, hit=hit)
        return reply

    async def _invoke(self, target, body, content_type, accept, start) -> tuple[sm.HttpReply, float, float, bool | None]:
        """The reply, the container's time, the load wait and whether the model was loaded (None: not asked)."""
        if not target:
            return sm.validation_error("This is a multi-model endpoint: set TargetModel (X-Amzn-SageMaker-Target-Model)."), 0.0, 0.0, None
        try:
            target = validate_target_name(target)
        except InvalidTargetName as exc:
            return sm.validation_error(with_retry_advice(exc)), 0.0, 0.0, None
        if len(body) > self.config.max_payload_bytes:
            return sm.payload_too_large(self.config.max_payload_bytes), 0.0, 0.0, None
        deadline = start + self.config.model_wait_timeout_s
        restarted = worker_recovered = False
        wait_s = 0.0
        hit = True
        for _ in range(MAX_ATTEMPTS):
            try:
                attempt_hit, attempt_wait = await self._ensure_loaded(target, deadline)
            except ModelStillLoading:
                return self._not_ready(target), 0.0, time.perf_counter() - start, False
            except EndpointClosing:
                return (sm.service_unavailable(f"The endpoint is shutting down; {target} was still loading. Retry."),
                        0.0, time.perf_counter() - start, False)
            except LoadFailed as exc:
                return self._model_error(exc.status, exc.body), 0.0, time.perf_counter() - start, False
            except Exception as exc:  # store and extraction errors carry their SageMaker code
                return sm.reply_for_exception(exc), 0.0, time.perf_counter() - start, False
            hit = hit and attempt_hit
            wait_s += attempt_wait
            entry = self._loaded.get(target)
            if entry is None:
                continue  # evicted between its load and this request: load it again
            entry.inflight += 1  # an entry with requests in flight is never evicted
            entry.invocations += 1
            model_start = time.perf_counter()
            try:
                status, headers, data = await self._forwarder.invoke(target, body, content_type, accept)
            except InvocationTimedOut:
                return self._timed_out(), time.perf_counter() - model_start, wait_s, hit
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                if not restarted and await self._server_died():
                    restarted = True  # retried once on the restarted server
                    await self._recover()
                    continue
                return sm.service_unavailable(f"The serving container did not answer: {exc}. Retrying can help."), 0.0, wait_s, hit
            finally:
                entry.inflight -= 1
                if not entry.inflight:
                    self._model_idle()
            model_s = time.perf_counter() - model_start
            if status != 200 and not worker_recovered and all(marker in data for marker in DEAD_WORKER_MARKERS):
                worker_recovered = True  # once per request: unload the dead model, load it again
                await self._drop_dead_model(target, entry)
                continue
            if status == 200:
                return (sm.invocation_reply(data, headers.get("Content-Type", "application/json"),
                                            variant=self.config.variant_name), model_s, wait_s, hit)
            return self._model_error(status, data.decode("utf-8", "replace")), model_s, wait_s, hit
        return sm.model_not_ready(f"Model {target} was unloaded to make room before it could serve; retry the request."), 0.0, wait_s, False

    def _model_error(self, status: int, raw_body: str) -> sm.HttpReply:
        return sm.model_error(status, raw_body, endpoint_name=self.config.endpoint_name, region=self.config.region,
                              account=self.config.account)

    def _timed_out(self) -> sm.HttpReply:
        return sm.invocation_timed_out(endpoint_name=self.config.endpoint_name, region=self.config.region,
                                       account=self.config.account)

    def _not_ready(self, target: str) -> sm.HttpReply:
        return sm.model_not_ready(
            f"Model {target} is not ready: it has been downloading or loading for more than "
            f"{self.config.model_wait_timeout_s:g} s and is still loading. Retry the request."
        )

    # -- loading and eviction ----------------------------------------------------------------
    async def _ensure_loaded(self, target: str, deadline: float) -> tuple[bool, float]:
        """(already loaded, seconds waited). Raises ModelStillLoading past ``deadline``; the
        load itself runs as its own task and is never cancelled by a waiting request."""
        if target in self._loaded:
            self._loaded.move_to_end(target)
            return True, 0.0
        start = time.perf_counter()
        task = self._loading.get(target)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._load(target), name=f"load {target}")
            self._loading[target] = task
            task.add_done_callback(lambda done, t=target: self._load_finished(t, done))
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=max(0.0, deadline - time.perf_counter()))
        except TimeoutError:
            raise ModelStillLoading(target) from None
        except asyncio.CancelledError:
            if self._closing and task.cancelled():
                raise EndpointClosing(target) from None
            raise
        return False, time.perf_counter() - start

    def _load_finished(self, target: str, task: asyncio.Task) -> None:
        if self._loading.get(target) is task:
            del self._loading[target]
        if not task.cancelled():
            task.exception()  # retrieved here: waiters, if any, get it through their own await

    async def _load(self, target: str) -> None:
        cached = await asyncio.to_thread(self.cache.fetch, target)
        restarts = 0
        while True:
            await self._server_ready.wait()  # a load during a restart would only fail
            reserved = await self._admit(target)
            overlapped = self._active_loads > 1 or bool(self._unloading)
            unloads_before = self._unloads_done
            before = self.memory_probe()
            started = time.perf_counter()
            try:
                await asyncio.to_thread(self._container_load, cached, target)
            except ModelAlreadyLoaded:
                pass  # the container kept it (e.g. across a front restart): serve it as loaded
            except ContainerOutOfMemory as exc:
                async with self._room:
                    eviction = self._start_eviction()
                if eviction is None:
                    raise LoadFailed(507, exc.body) from None
                await eviction
                continue
            except ModelLoadFailed as exc:
                self._report_load_failure(target, exc)
                raise LoadFailed(exc.status, exc.body) from None
            except requests.ConnectionError:
                if restarts or not await self._server_died():
                    raise
                restarts += 1  # the server crashed under this load: load again on the restarted one
                await self._recover()
                continue
            finally:
                overlapped = overlapped or self._active_loads > 1 or bool(self._unloading)
                await self._release(reserved)
            load_s = time.perf_counter() - started
            footprint = max(0, self.memory_probe() - before)
            overlapped = overlapped or self._unloads_done != unloads_before
            workers = await asyncio.to_thread(self._worker_processes, target)
            self._loaded[target] = LoadedEntry(target, cached, footprint, load_s, footprint_shared=overlapped,
                                               workers=workers)
            # Memory freed by an unload alongside would make this one look small, and a small
            # estimate lets too many loads in at once: a disturbed measurement never lowers it.
            self._footprints[target] = max(footprint, self._footprints.get(target, 0)) if overlapped else footprint
            fresh = not cached.cache_hit
            self.metrics.model_loaded(load_s, cached.download_seconds if fresh else None,
                                      cached.extract_seconds if fresh else None)
            used = self._record_memory()
            no_room = target in self._over_threshold
            self._over_threshold.discard(target)
            if used > self.config.memory_threshold * self.limit:
                self.metrics.load_above_threshold()
                why = ("nothing idle was left to unload" if no_room else
                       "it needed more than the largest footprint measured so far")
                self.reporter.warn(
                    f"{target} loaded with memory at {100 * used / self.limit:.0f}% of the limit, above the "
                    f"{100 * self.config.memory_threshold:.0f}% threshold: {why} "
                    "(fewer copies, a larger --memory-limit, or a lower load per model avoid it)"
                )
            self.reporter.info(
                f"  loaded {target} in {load_s:.2f} s (+{footprint / 2**20:.0f} MiB"
                f"{', other loads ran alongside' if overlapped else ''}; "
                f"{len(self._loaded)} loaded, {100 * used / self.limit:.1f}% of the memory limit)"
            )
            return

    async def _admit(self, target: str) -> int:
        """Wait until a load may go to the container; returns the bytes reserved for it.

        A load goes ahead when its estimated footprint (the largest measured so far) fits under
        the threshold beside what is used and reserved by the loads under way, after unloading
        idle models. When it does not fit it waits (bounded by the requests' model-wait timeout,
        after which they get 429 like any load that takes too long) for a load under way to finish
        or a busy model to become idle and unloadable, and looks again. Only when nothing is
        loading and nothing is busy, so that nothing can ever make room, does it go ahead: then
        the container has the last word (507 included) and the load is logged and counted
        (LoadsAboveThreshold)."""
        self._over_threshold.discard(target)
        async with self._room:
            while True:
                if target in self._unloading:  # its old copy is still leaving the container
                    await self._wait_for_room()
                    continue
                fits = self._make_room()
                busy = any(self._busy(t, e) for t, e in self._loaded.items())
                if fits or (self._active_loads == 0 and not busy and not self._evictions):
                    if not fits:
                        self._over_threshold.add(target)
                    reserved = self._estimate_footprint()
                    self._reserved_bytes += reserved
                    self._active_loads += 1
                    return reserved
                await self._wait_for_room()

    async def _wait_for_room(self) -> None:
        """Wait (room condition held) until a load finishes, a model is unloaded or becomes idle."""
        self._room_waiters += 1
        try:
            await self._room.wait()
        finally:
            self._room_waiters -= 1

    def _model_idle(self) -> None:
        """A loaded model's last request finished: loads waiting for room may evict it now."""
        if self._room_waiters:
            asyncio.get_running_loop().create_task(self._notify_room())

    async def _notify_room(self) -> None:
        async with self._room:
            self._room.notify_all()

    async def _release(self, reserved: int) -> None:
        async with self._room:
            self._reserved_bytes -= reserved
            self._active_loads -= 1
            self._room.notify_all()

    def _container_load(self, cached: CachedModel, target: str) -> None:
        # Its own connection: Triton runs a load on the HTTP thread of the connection that asked.
        with ContainerClient(self.server.sagemaker_url, load_timeout_s=self.config.load_timeout_s) as control:
            try:
                control.load(cached.container_name, self.server.model_url(cached.model_dir), target=target)
            except requests.Timeout:
                raise LoadTimedOut(
                    f"loading {target} did not finish within {self.config.load_timeout_s:g} s (--load-timeout); "
                    "retrying may help if the host was busy, else check the model's initialize() in the Triton log"
                ) from None

    def _worker_processes(self, target: str) -> tuple[psutil.Process, ...]:
        """The server's processes started for ``target``: python-backend stubs carry its model
        path, ``.../<hash>/model/...``, in their command line."""
        marker = f"/{cache_key(target)}/"
        found = []
        for pid in self.server.pids():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if pid != self.server.pid and any(marker in arg for arg in proc.cmdline()[1:2]):
                    found.append(proc)
        return tuple(found)

    async def _drop_dead_model(self, target: str, entry: LoadedEntry) -> None:
        """A model whose worker died: out of the table and unloaded, so the next request loads
        it again like any cold request. Triton's python backend may never finish unloading a
        model whose stub died after a request reached it (measured with the wheel's 2.51: still
        waiting after 90 s); past ``DEAD_UNLOAD_TIMEOUT_S`` the server is restarted instead, as a
        broken container is replaced. The room lock is not held across the unload."""
        async with self._room:
            if self._loaded.get(target) is not entry:
                return  # someone else already did
            del self._loaded[target]
            self._unloading.add(target)  # loads of it wait until its old copy is gone
        self.metrics.worker_failed()
        self.reporter.warn(f"the worker of {target} died; unloading it, it reloads on the next request")
        try:
            unload_s = await self._container_unload(target, timeout_s=DEAD_UNLOAD_TIMEOUT_S)
            self.metrics.model_unloaded(unload_s, evicted=False)
        except requests.RequestException as exc:
            self.reporter.warn(f"Triton did not unload {target} ({type(exc).__name__}); restarting it, "
                               "models reload on demand")
            await self._recover(force=True)
        finally:
            async with self._room:
                self._unloading.discard(target)
                self._record_memory()
                self._room.notify_all()

    def _report_load_failure(self, target: str, exc: ModelLoadFailed) -> None:
        self.reporter.info(f"  load {target} failed: {exc}")
        if any(ch.isspace() for ch in target):
            self.reporter.warn(
                f"{target}: Triton names the model after its target, and the python backend of Triton "
                "releases before 25.08 cuts model names at spaces (python_backend stub_launcher), so "
                "python-backend models cannot load under such a name there, on SageMaker too; rename the object"
            )

    def _estimate_footprint(self) -> int:
        """The largest footprint measured (kept across restarts, so copies reload in parallel)."""
        return max(self._footprints.values(), default=0)

    def _make_room(self) -> bool:
        """Whether a load's estimate fits under the threshold beside what is used, reserved by the
        loads under way and not already leaving; when it does not, start evicting idle models (least
        recently used first) until it would, and answer False: the caller waits, and an eviction
        that finishes wakes it. Never waits itself, so evictions run in parallel and outside the
        room lock (call with it held)."""
        if not self._footprints and self._active_loads:
            return False  # no footprint measured yet: one load at a time until there is
        budget = self.config.memory_threshold * self.limit
        over = self.memory_probe() + self._reserved_bytes + self._estimate_footprint() - budget
        while over - sum(self._evictions.values()) > 0 and self._start_eviction() is not None:
            pass
        return over <= 0

    def _start_eviction(self) -> asyncio.Task | None:
        """Take the least recently used idle model out of the table and start unloading it (the
        task); None when every loaded model is serving. Prefers models that served since their
        load, so a fresh copy is not evicted before the request that asked for it reaches it.
        Call with the room lock held."""
        idle = [(t, e) for t, e in self._loaded.items() if not self._busy(t, e)]
        if not idle:
            return None
        victim, entry = next(((t, e) for t, e in idle if e.invocations), idle[0])
        # Out of the table first: a request for it from now on loads it again (after the
        # unload: it is "unloading" until then) instead of reaching a model being unloaded.
        del self._loaded[victim]
        self._unloading.add(victim)
        self._evictions[victim] = max(entry.footprint_bytes, self._footprints.get(victim, 0))  # bytes to leave
        task = asyncio.get_running_loop().create_task(self._evict(victim), name=f"evict {victim}")
        self._eviction_tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._eviction_tasks.discard)
        return task

    def _busy(self, target: str, entry: LoadedEntry) -> bool:
        """Requests in flight through the front, or still running in the container (a slower
        hedged copy): such a model is never unloaded."""
        return bool(entry.inflight) or (self._forwarder is not None and self._forwarder.outstanding(target) > 0)

    async def _evict(self, victim: str) -> None:
        """Unload an evicted model, then wake the loads waiting for room. An unload that does not
        finish in EVICT_UNLOAD_TIMEOUT_S gets the server restarted: waiting for it would hold every
        load that needs its room."""
        try:
            unload_s = await self._container_unload(victim, timeout_s=EVICT_UNLOAD_TIMEOUT_S)
        except requests.RequestException as exc:
            self.reporter.warn(f"Triton did not unload {victim} within {EVICT_UNLOAD_TIMEOUT_S:g} s "
                               f"({type(exc).__name__}); restarting it, models reload on demand")
            await self._recover(force=True)
            return
        finally:
            async with self._room:
                self._evictions.pop(victim, None)
                self._room.notify_all()
        self.metrics.model_unloaded(unload_s, evicted=True)
        used = self._record_memory()
        self.reporter.info(f"  evicted {victim} (least recently used) in {unload_s:.2f} s; {used / 2**20:.0f} MiB used")

    async def _container_unload(self, target: str, timeout_s: float | None = None) -> float:
        started = time.perf_counter()

        def unload() -> None:
            options = {} if timeout_s is None else {"load_timeout_s": timeout_s}
            with ContainerClient(self.server.sagemaker_url, **options) as control, contextlib.suppress(ModelNotLoaded):
                control.unload(cache_key(target), target=target)  # already gone is as good as unloaded

        self._unloading.add(target)
        try:
            await asyncio.to_thread(unload)
        finally:
            self._unloading.discard(target)
            self._unloads_done += 1
        self.cache.touch(target)  # last used when it stopped serving, not when it was loaded
        return time.perf_counter() - started

    async def unload(self, target: str) -> bool:
        async with self._room:
            entry = self._loaded.pop(target, None)
            if entry is None:
                return False
            self.metrics.model_unloaded(await self._container_unload(target), evicted=False)
            self._record_memory()
            self._room.notify_all()
            return True

    # -- faults ----------------------------------------------------------------------------------
    async def _recover(self, force: bool = False) -> None:
        """Restart a dead server (or, with ``force``, a broken live one); models reload on demand."""
        async with self._recover_lock:
            if self.server.is_running() and not force:
                return
            self._server_ready.clear()
            try:
                await self._restart(force)
            finally:
                self._server_ready.set()

    async def _restart(self, force: bool) -> None:
        if not force:
            self.reporter.warn(
                f"the Triton server exited (code {self.server.returncode}); restarting it, models reload on demand"
            )
        self._loaded.clear()
        # A dead or broken server gets no grace: its workers catch SIGTERM and would hold the
        # restart for the whole stop_grace_s before SIGKILL.
        await asyncio.to_thread(self.server.restart, grace_s=0.0)
        self.metrics.restarted()
        self._record_memory()

    async def _server_died(self, within_s: float = 1.0) -> bool:
        """Whether the server is dead, waiting up to ``within_s`` for it to be seen so: a
        connection reset by a crashing server can come before the process has exited."""
        deadline = time.perf_counter() + within_s
        while self.server.is_running():
            if time.perf_counter() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def watchdog(self, interval_s: float = 1.0) -> None:
        """Detect a crashed server, and models whose workers died, between requests too."""
        while True:
            await asyncio.sleep(interval_s)
            if not self.server.is_running():
                await self._recover()
                continue
            for target, entry in list(self._loaded.items()):
                if entry.inflight == 0 and entry.workers_dead():
                    await self._drop_dead_model(target, entry)
