"""Memory admission and eviction for the multi-model endpoint: which loads may go to the
container now, and which idle models leave to make room for them.

:class:`Admission` owns the table of loaded models' memory book-keeping (the table itself is
the endpoint's ``_loaded``, shared by reference), the room condition, the bytes reserved by the
loads under way, the footprint measured for each target, the evictions in progress and the
targets still leaving the container. It knows nothing of HTTP or Triton: the container's unload
is a coroutine it is given, the memory used is a probe it is given, and a model's requests still
running in the container (slower hedged copies included) come from an ``outstanding`` callable.

The rules (the endpoint relies on them):
- a model with requests in flight through the front (``LoadedEntry.inflight``) or still running
  in the container (``outstanding(target) > 0``) is never evicted;
- evictions start with the room lock held but run as their own tasks outside it, in parallel;
  a load waiting for room is woken when one finishes, when a load finishes, or when a busy model
  becomes idle (:meth:`model_idle`);
- the room lock is never held across a load or an unload (the endpoint calls :meth:`admit`,
  loads, then :meth:`release`; unloads run outside it, their targets marked ``unloading``);
- a load that does not fit and can never get room (nothing loading, nothing busy, nothing
  leaving) goes ahead and is marked above threshold: then the container has the last word.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Awaitable, Callable

import psutil

from mme.progress import Reporter
from serving.models.cache_entries import CachedModel
from serving.runtime.metrics import EndpointMetrics
from serving.triton.container import ContainerUnreachable
from serving.triton.processes import alive

EVICT_UNLOAD_TIMEOUT_S = 30.0  # an eviction's unload past this restarts the server (measured: 2 s each)


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


# The container's unload of a target, with a timeout (None: the client's default); raises
# serving.triton.container.ContainerUnreachable (ContainerTimedOut) when it does not finish. A target
# already gone counts as unloaded.
Unload = Callable[[str, "float | None"], Awaitable[None]]


class Admission:
    def __init__(self, loaded: OrderedDict[str, LoadedEntry], *, memory_probe: Callable[[], int],
                 limit_bytes: int, threshold: float, unload: Unload,
                 outstanding: Callable[[str], int] = lambda _target: 0,
                 restart: Callable[[], Awaitable[None]] | None = None,
                 on_unloaded: Callable[[str], object] | None = None,
                 metrics: EndpointMetrics | None = None, reporter: Reporter | None = None) -> None:
        self.loaded = loaded  # the endpoint's table, least recently used first
        self.memory_probe = memory_probe
        self.limit = limit_bytes
        self.threshold = threshold
        self._unload = unload
        self._outstanding = outstanding
        self._restart = restart  # a stuck eviction restarts the server (the endpoint's forced recovery)
        self._on_unloaded = on_unloaded  # after each finished unload (the cache records the use)
        self.metrics = metrics or EndpointMetrics()
        self.reporter = reporter or Reporter(quiet=True)
        # Evictions and admissions; never held during a load. Notified when a load finishes.
        self.room = asyncio.Condition()
        self.unloading: set[str] = set()  # Triton may still read their files
        self.reserved_bytes = 0  # estimated footprints of the loads in the container now
        self.active_loads = 0  # loads admitted to the container and not finished
        self.room_waiters = 0  # loads waiting for room (then an idle model notifies them)
        self.over_threshold: set[str] = set()  # loads admitted with no way to make room
        # Footprint per target: the last clean measurement (no other load or unload alongside);
        # a measurement disturbed by others only ever raises it.
        self.footprints: dict[str, int] = {}
        self.evictions: dict[str, int] = {}  # models being evicted -> bytes expected to leave
        self.eviction_tasks: set[asyncio.Task] = set()
        self.unloads_done = 0  # unloads finished, to tell whether one ran during a measurement

    # -- memory --------------------------------------------------------------------------
    def record_memory(self, used: int | None = None) -> int:
        """Record memory in use: ``used`` when just measured, else a reading taken now."""
        used = self.memory_probe() if used is None else used
        self.metrics.memory(used, self.limit, len(self.loaded))
        return used

    def above_threshold(self, used: int) -> bool:
        return used > self.threshold * self.limit

    def estimate_footprint(self) -> int:
        """The largest footprint measured (kept across restarts, so copies reload in parallel)."""
        return max(self.footprints.values(), default=0)

    def record_footprint(self, target: str, footprint: int, overlapped: bool) -> None:
        # Memory freed by an unload alongside would make this one look small, and a small
        # estimate lets too many loads in at once: a disturbed measurement never lowers it.
        self.footprints[target] = max(footprint, self.footprints.get(target, 0)) if overlapped else footprint

    def crowded(self) -> bool:
        """Another load or an unload runs alongside: a footprint measured now is an upper bound."""
        return self.active_loads > 1 or bool(self.unloading)

    def took_over_threshold(self, target: str) -> bool:
        """Whether ``target``'s load was admitted with no way to make room (and forget it)."""
        no_room = target in self.over_threshold
        self.over_threshold.discard(target)
        return no_room

    # -- admission -----------------------------------------------------------------------
    async def admit(self, target: str) -> int:
        """Wait until a load may go to the container; returns the bytes reserved for it (give
        them back with :meth:`release` when the container call is over, whatever its outcome).

        A load goes ahead when its estimated footprint (the largest measured so far) fits under
        the threshold beside what is used and reserved by the loads under way, after unloading
        idle models. When it does not fit it waits (bounded by the requests' model-wait timeout,
        after which they get 429 like any load that takes too long) for a load under way to finish
        or a busy model to become idle and unloadable, and looks again. Only when nothing is
        loading and nothing is busy, so that nothing can ever make room, does it go ahead: then
        the container has the last word (507 included) and the load is logged and counted
        (LoadsAboveThreshold)."""
        self.over_threshold.discard(target)
        async with self.room:
            while True:
                if target in self.unloading:  # its old copy is still leaving the container
                    await self._wait_for_room()
                    continue
                fits = self._make_room()
                busy = any(self.busy(t, e) for t, e in self.loaded.items())
                if fits or (self.active_loads == 0 and not busy and not self.evictions):
                    if not fits:
                        self.over_threshold.add(target)
                    reserved = self.estimate_footprint()
                    self.reserved_bytes += reserved
                    self.active_loads += 1
                    return reserved
                await self._wait_for_room()

    async def _wait_for_room(self) -> None:
        """Wait (room condition held) until a load finishes, a model is unloaded or becomes idle."""
        self.room_waiters += 1
        try:
            await self.room.wait()
        finally:
            self.room_waiters -= 1

    def model_idle(self, _target: str | None = None) -> None:
        """A loaded model's last request finished: loads waiting for room may evict it now."""
        if self.room_waiters:
            asyncio.get_running_loop().create_task(self._notify_room())

    async def _notify_room(self) -> None:
        async with self.room:
            self.room.notify_all()

    async def release(self, reserved: int) -> None:
        """A load admitted by :meth:`admit` is out of the container's hands: wake the waiters."""
        async with self.room:
            self.reserved_bytes -= reserved
            self.active_loads -= 1
            self.room.notify_all()

    # -- eviction ------------------------------------------------------------------------
    def busy(self, target: str, entry: LoadedEntry) -> bool:
        """Requests in flight through the front, or still running in the container (a slower
        hedged copy): such a model is never unloaded."""
        return bool(entry.inflight) or self._outstanding(target) > 0

    def _make_room(self) -> bool:
        """Whether a load's estimate fits under the threshold beside what is used, reserved by the
        loads under way and not already leaving; when it does not, start evicting idle models (least
        recently used first) until it would, and answer False: the caller waits, and an eviction
        that finishes wakes it. Never waits itself, so evictions run in parallel and outside the
        room lock (call with it held)."""
        if not self.footprints and self.active_loads:
            return False  # no footprint measured yet: one load at a time until there is
        budget = self.threshold * self.limit
        estimate = self.estimate_footprint()
        over = self.memory_probe() + self.reserved_bytes + estimate - budget
        # The other loads waiting for room need theirs too, as each would start its own eviction:
        # counting only this one's, the evictions under way covered one waiting load at a time
        # (measured under thrash: loads waited 3.3 s on average, up to 11.8 s, for 2 s unloads).
        demand = over + estimate * self.room_waiters
        while demand - sum(self.evictions.values()) > 0 and self._start_eviction() is not None:
            pass
        return over <= 0

    async def evict_one(self) -> asyncio.Task | None:
        """Start evicting the least recently used idle model (the container answered 507); the
        eviction's task to await, or None when every loaded model is serving."""
        async with self.room:
            return self._start_eviction()

    def _start_eviction(self) -> asyncio.Task | None:
        """Take the least recently used idle model out of the table and start unloading it (the
        task); None when every loaded model is serving. Prefers models that served since their
        load, so a fresh copy is not evicted before the request that asked for it reaches it.
        Call with the room lock held."""
        idle = [(t, e) for t, e in self.loaded.items() if not self.busy(t, e)]
        if not idle:
            return None
        victim, entry = next(((t, e) for t, e in idle if e.invocations), idle[0])
        # Out of the table first: a request for it from now on loads it again (after the
        # unload: it is "unloading" until then) instead of reaching a model being unloaded.
        del self.loaded[victim]
        self.unloading.add(victim)
        self.evictions[victim] = max(entry.footprint_bytes, self.footprints.get(victim, 0))  # bytes to leave
        task = asyncio.get_running_loop().create_task(self._evict(victim), name=f"evict {victim}")
        self.eviction_tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self.eviction_tasks.discard)
        return task

    async def _evict(self, victim: str) -> None:
        """Unload an evicted model, then wake the loads waiting for room. An unload that does not
        finish in EVICT_UNLOAD_TIMEOUT_S gets the server restarted: waiting for it would hold every
        load that needs its room."""
        try:
            unload_s = await self.unload_model(victim, timeout_s=EVICT_UNLOAD_TIMEOUT_S)
        except ContainerUnreachable as exc:
            self.reporter.warn(f"Triton did not unload {victim} within {EVICT_UNLOAD_TIMEOUT_S:g} s "
                               f"({type(exc).__name__}); restarting it, models reload on demand")
            if self._restart is not None:
                await self._restart()
            return
        finally:
            async with self.room:
                self.evictions.pop(victim, None)
                self.room.notify_all()
        self.metrics.model_unloaded(unload_s, evicted=True)
        used = self.record_memory()
        self.reporter.info(f"  evicted {victim} (least recently used) in {unload_s:.2f} s; {used / 2**20:.0f} MiB used")

    # -- unloads -------------------------------------------------------------------------
    async def unload_model(self, target: str, timeout_s: float | None = None) -> float:
        """The container's unload of ``target`` (marked unloading meanwhile); its seconds."""
        started = time.perf_counter()
        self.unloading.add(target)
        try:
            await self._unload(target, timeout_s)
        finally:
            self.unloading.discard(target)
            self.unloads_done += 1
        if self._on_unloaded is not None:
            self._on_unloaded(target)  # last used when it stopped serving, not when it was loaded
        return time.perf_counter() - started

    async def unload(self, target: str) -> bool:
        """Unload ``target`` now (the explicit unload); False if it is not loaded. Out of the table
        at once, the container's unload outside the room lock: admissions and evictions go on
        meanwhile (a load of ``target`` itself waits until it is gone)."""
        async with self.room:
            entry = self.loaded.pop(target, None)
            if entry is None:
                return False
            self.unloading.add(target)
        try:
            seconds = await self.unload_model(target)
        finally:
            async with self.room:
                self.room.notify_all()
        self.metrics.model_unloaded(seconds, evicted=False)
        self.record_memory()
        return True

    async def withdraw(self, target: str, entry: LoadedEntry) -> bool:
        """Take ``entry`` out of the table and mark its target unloading, so loads of it wait
        until its old copy is gone; False if the table no longer holds that entry. Follow with
        :meth:`unload_model` and :meth:`withdrawn`."""
        async with self.room:
            if self.loaded.get(target) is not entry:
                return False  # someone else already did
            del self.loaded[target]
            self.unloading.add(target)
            return True

    async def withdrawn(self, target: str) -> None:
        """A withdrawn target is gone (or given up on): wake the loads waiting for it."""
        async with self.room:
            self.unloading.discard(target)
            self.record_memory()
            self.room.notify_all()
