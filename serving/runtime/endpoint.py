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

The work is split in these modules:
- this one, :class:`MultiModelEndpoint`: the endpoint's public face and lifecycle, request
  handling (validation, the load-then-invoke loop) and loading (one load task per target, the
  container's load, measuring each model's footprint); it answers each request with a typed
  outcome (serving/runtime/outcomes.py) that serving/runtime/front.py turns into SageMaker's reply; it owns
  the table of loaded models (``_loaded``, least recently used first) and of loads under way
  (``_loading``), and never holds a lock across the container's load;
- serving/runtime/container_port.py, :class:`~serving.runtime.container_port.Container`: the container's
  loads, unloads and invocations (Triton's, or a test's fake);
- serving/runtime/admission.py, :class:`~serving.runtime.admission.Admission`: memory admission and eviction
  (the room condition, reservations, footprints, evictions, targets still unloading);
- serving/runtime/recovery.py, :class:`~serving.runtime.recovery.Recovery`: restarts of a dead or broken
  server (loads wait on its ``server_ready``), dead workers, and the watchdog.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from mme.progress import Reporter
from serving.models.cache import ModelCache
from serving.models.cache_entries import CachedModel, cache_key
from serving.models.store import InvalidTargetName, validate_target_name
from serving.monitor.instance_metrics import InstanceSampler
from serving.monitor.memory import DEFAULT_MEMORY_THRESHOLD, process_tree_memory
from serving.runtime import errors_sagemaker as sm
from serving.runtime import outcomes as out
from serving.runtime.admission import Admission, LoadedEntry
from serving.runtime.container_port import Container, TritonContainer
from serving.runtime.forward import InvocationTimedOut
from serving.runtime.metrics import EndpointMetrics
from serving.runtime.recovery import DEAD_UNLOAD_TIMEOUT_S, DEAD_WORKER_MARKERS, Recovery, dead_worker_reply  # noqa: F401
from serving.triton.base import TritonServer
from serving.triton.container import (
    LOAD_TIMEOUT_S,
    ContainerOutOfMemory,
    ContainerTimedOut,
    ContainerUnreachable,
    ModelAlreadyLoaded,
    ModelLoadFailed,
)

MAX_ATTEMPTS = 4  # loads (or a container restart) one request may wait for
# Triton's answer for an invocation of a model it does not hold. Triton (the wheel's 2.51, model
# namespacing on) answers it, for one request, for a model it loaded and still serves when another
# model's repository is being registered at that instant: seen under thrash, 2 microseconds after
# the same model's previous request was executing, with the next load's registration logged 4 ms
# later (1 request in about 700; benchmarks/bench_thrash.py). Such a request is sent once more.
UNKNOWN_MODEL_MARKER = b"Request for unknown model"
SAGEMAKER_TIMEOUT_S = 60.0  # both of SageMaker's 60-second rules


@dataclass(frozen=True)
class EndpointConfig:
    memory_limit_bytes: int
    memory_threshold: float = DEFAULT_MEMORY_THRESHOLD
    max_payload_bytes: int = sm.MAX_PAYLOAD_BYTES
    region: str = "us-east-1"
    account: str = sm.DEFAULT_ACCOUNT
    endpoint_name: str = sm.DEFAULT_ENDPOINT_NAME
    variant_name: str = sm.DEFAULT_VARIANT
    model_wait_timeout_s: float = SAGEMAKER_TIMEOUT_S
    invocation_timeout_s: float = SAGEMAKER_TIMEOUT_S
    allow_unsigned: bool = False
    load_timeout_s: float = LOAD_TIMEOUT_S  # a load not finished by then fails its requests
    # Memory is the RSS of the server's process tree: a model with worker processes of its own
    # (python-backend stubs) whose load overlapped others is charged their RSS, not the tree's
    # growth over its load (which counts the other loads too and, kept as an upper bound, made the
    # endpoint keep room for several models' worth: under churn only two tiny models stayed loaded).
    footprint_from_workers: bool = False


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


class NoRoom(LoadFailed):
    """The container answered 507 and every loaded model was serving: nothing to evict."""


class EndpointClosing(Exception):
    """The endpoint is shutting down: loads in progress were abandoned."""


class StillLoading(Exception):
    """The target was not loaded within the model wait timeout (its load goes on)."""


class MultiModelEndpoint:
    def __init__(self, cache: ModelCache, server: TritonServer, config: EndpointConfig,
                 memory_probe: Callable[[], int], reporter: Reporter | None = None,
                 metrics: EndpointMetrics | None = None, instance_sampler: InstanceSampler | None = None,
                 container: Container | None = None) -> None:
        self.cache = cache
        self.server = server
        self.config = config
        self.memory_probe = memory_probe
        self.reporter = reporter or Reporter(quiet=True)
        self.metrics = metrics or EndpointMetrics()
        self.instance_sampler = instance_sampler  # CPU, memory, disk and GPU utilisation of the instance
        self._loaded: OrderedDict[str, LoadedEntry] = OrderedDict()
        self._loading: dict[str, asyncio.Task] = {}
        self._container = container  # None: Triton's, made by start()
        self._closing = False
        # Memory admission and eviction; the table is shared, by reference, with both helpers.
        self._admission = Admission(
            self._loaded, memory_probe=memory_probe, limit_bytes=config.memory_limit_bytes,
            threshold=config.memory_threshold, unload=self._unload_from_container, outstanding=self._outstanding,
            restart=lambda: self._recovery.recover(force=True), on_unloaded=cache.touch,
            metrics=self.metrics, reporter=self.reporter)
        self._recovery = Recovery(server, self._loaded, self._admission, self.metrics, self.reporter)
        self.abandoned_loads = 0  # loads still running when the shutdown began

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        if self._container is None:
            self._container = TritonContainer(
                self.server, load_timeout_s=self.config.load_timeout_s,
                invocation_timeout_s=self.config.invocation_timeout_s,
                loads_in_flight=lambda: len(self._loading), on_idle=self._admission.model_idle)
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
        if self._container is not None:
            await self._container.close()

    # -- state -----------------------------------------------------------------------------
    @property
    def limit(self) -> int:
        return self.config.memory_limit_bytes

    def in_use(self, target: str) -> bool:
        """Loaded, loading or unloading: its cached files must stay on disk (called from the
        cache's fetch threads: membership tests only)."""
        return target in self._loaded or target in self._loading or target in self._admission.unloading

    def loaded_models(self) -> list[dict]:
        return [
            {"target": e.target, "footprint_bytes": e.footprint_bytes, "footprint_shared": e.footprint_shared,
             "load_seconds": round(e.load_seconds, 3),
             "invocations": e.invocations, "model_dir": str(e.cached.model_dir)}
            for e in self._loaded.values()
        ]

    def _record_memory(self) -> int:
        return self._admission.record_memory()

    def _outstanding(self, target: str) -> int:
        """Requests of ``target`` the container may still be running (slower hedged copies too)."""
        return self._container.outstanding(target) if self._container is not None else 0

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
    async def invoke(self, target: str | None, body: bytes, content_type: str, accept: str | None) -> out.Outcome:
        """What the request came to (serving/runtime/front.py answers it as SageMaker does)."""
        if not target:
            return out.MissingTarget()
        try:  # a loaded target's name was checked before its load
            target = target if target in self._loaded else validate_target_name(target)
        except InvalidTargetName as exc:
            return out.InvalidTarget(exc)
        if len(body) > self.config.max_payload_bytes:
            return out.PayloadTooLarge(self.config.max_payload_bytes)
        start = time.perf_counter()
        deadline = start + self.config.model_wait_timeout_s
        restarted = worker_recovered = resent_unknown = False
        wait_s = 0.0
        hit = True
        for _ in range(MAX_ATTEMPTS):
            try:
                attempt_hit, attempt_wait = await self._ensure_loaded(target, deadline)
            except StillLoading:
                return out.ModelStillLoading(target, self.config.model_wait_timeout_s,
                                             wait_s=time.perf_counter() - start, hit=False)
            except EndpointClosing:
                return out.ShuttingDown(target, wait_s=time.perf_counter() - start, hit=False)
            except NoRoom as exc:
                return out.InsufficientMemory(exc.body, wait_s=time.perf_counter() - start, hit=False)
            except LoadFailed as exc:
                return out.LoadRefused(exc.status, exc.body, wait_s=time.perf_counter() - start, hit=False)
            except Exception as exc:  # store and extraction errors carry their SageMaker code
                return out.LoadError(exc, wait_s=time.perf_counter() - start, hit=False)
            hit = hit and attempt_hit
            wait_s += attempt_wait
            entry = self._loaded.get(target)
            if entry is None:
                continue  # evicted between its load and this request: load it again
            entry.inflight += 1  # an entry with requests in flight is never evicted
            entry.invocations += 1
            model_start = time.perf_counter()
            try:
                assert self._container is not None  # start() made it before any request
                status, headers, data = await self._container.invoke(target, body, content_type, accept)
            except InvocationTimedOut:
                return out.ModelTimedOut(model_s=time.perf_counter() - model_start, wait_s=wait_s, hit=hit)
            except ContainerUnreachable as exc:
                if not restarted and await self._recovery.server_died():
                    restarted = True  # retried once on the restarted server
                    await self._recovery.recover()
                    continue
                return out.ContainerUnavailable(str(exc), wait_s=wait_s, hit=hit)
            finally:
                entry.inflight -= 1
                if not entry.inflight:
                    self._admission.model_idle()
            model_s = time.perf_counter() - model_start
            if not worker_recovered and dead_worker_reply(status, data):
                worker_recovered = True  # once per request: unload the dead model, load it again
                await self._recovery.drop_dead_model(target, entry)
                continue
            if status == 400 and not resent_unknown and UNKNOWN_MODEL_MARKER in data and target in self._loaded:
                resent_unknown = True  # loaded in our table and in Triton's: its transient lookup miss
                self.metrics.unknown_model_resent()
                continue
            if status == 200:
                return out.Invoked(data, headers.get("Content-Type", "application/json"),
                                   model_s=model_s, wait_s=wait_s, hit=hit)
            return out.InvokeFailed(status, data.decode("utf-8", "replace"), model_s=model_s, wait_s=wait_s, hit=hit)
        return out.ModelEvicted(target, wait_s=wait_s, hit=False)

    # -- loading (admission and eviction: serving/runtime/admission.py) ------------------------------
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
            task.add_done_callback(functools.partial(self._load_finished, target))
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=max(0.0, deadline - time.perf_counter()))
        except TimeoutError:
            raise StillLoading(target) from None
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
            await self._recovery.server_ready.wait()  # a load during a restart would only fail
            reserved = await self._admission.admit(target)
            overlapped = self._admission.crowded()
            unloads_before = self._admission.unloads_done
            before = self.memory_probe()
            started = time.perf_counter()
            try:
                await self._container_load(cached, target)
            except ModelAlreadyLoaded:
                pass  # the container kept it (e.g. across a front restart): serve it as loaded
            except ContainerOutOfMemory as exc:
                eviction = await self._admission.evict_one()
                if eviction is None:
                    raise NoRoom(507, exc.body) from None
                await eviction
                continue
            except ModelLoadFailed as exc:
                self._report_load_failure(target, exc)
                raise LoadFailed(exc.status, exc.body) from None
            except ContainerUnreachable:
                if restarts or not await self._recovery.server_died():
                    raise
                restarts += 1  # the server crashed under this load: load again on the restarted one
                await self._recovery.recover()
                continue
            finally:
                overlapped = overlapped or self._admission.crowded()
                await self._admission.release(reserved)
            load_s = time.perf_counter() - started
            after = self.memory_probe()
            footprint = max(0, after - before)
            overlapped = overlapped or self._admission.unloads_done != unloads_before
            workers = await asyncio.to_thread(self._recovery.worker_processes, target)
            if overlapped and workers and self.config.footprint_from_workers:
                own = process_tree_memory((p.pid for p in workers), uss=False).rss_bytes
                if own > 0:
                    footprint, overlapped = own, False
            self._loaded[target] = LoadedEntry(target, cached, footprint, load_s, footprint_shared=overlapped,
                                               workers=workers)
            self._admission.record_footprint(target, footprint, overlapped)
            fresh = not cached.cache_hit
            self.metrics.model_loaded(load_s, cached.download_seconds if fresh else None,
                                      cached.extract_seconds if fresh else None)
            used = self._admission.record_memory(after)
            no_room = self._admission.took_over_threshold(target)
            if self._admission.above_threshold(used):
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

    async def _container_load(self, cached: CachedModel, target: str) -> None:
        assert self._container is not None  # start() made it before any request
        try:
            await self._container.load(cached.container_name, self.server.model_url(cached.model_dir), target=target)
        except ContainerTimedOut:
            raise LoadTimedOut(
                f"loading {target} did not finish within {self.config.load_timeout_s:g} s (--load-timeout); "
                "retrying may help if the host was busy, else check the model's initialize() in the Triton log"
            ) from None

    def _report_load_failure(self, target: str, exc: ModelLoadFailed) -> None:
        self.reporter.info(f"  load {target} failed: {exc}")
        if any(ch.isspace() for ch in target):
            self.reporter.warn(
                f"{target}: Triton names the model after its target, and the python backend of Triton "
                "releases before 25.08 cuts model names at spaces (python_backend stub_launcher), so "
                "python-backend models cannot load under such a name there, on SageMaker too; rename the object"
            )

    async def _unload_from_container(self, target: str, timeout_s: float | None = None) -> None:
        """The container's unload (Admission.unload_model keeps the book; it calls this)."""
        assert self._container is not None  # start() made it before any request
        await self._container.unload(cache_key(target), target=target, timeout_s=timeout_s)

    async def unload(self, target: str) -> bool:
        return await self._admission.unload(target)

    # -- faults (serving/runtime/recovery.py) -----------------------------------------------------------
    async def watchdog(self, interval_s: float = 1.0) -> None:
        """Detect a crashed server, and models whose workers died, between requests too."""
        await self._recovery.watchdog(interval_s)
