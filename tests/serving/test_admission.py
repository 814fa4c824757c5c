"""Memory admission and eviction (serving/runtime/admission.py) against a fake container: the memory
used is a number the test controls, and an unload is a coroutine that frees the model's bytes,
held back until the test releases it where a test needs an eviction in progress."""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from serving.runtime.admission import Admission, LoadedEntry
from serving.triton.container import ContainerTimedOut

LIMIT = 100  # with the 0.9 threshold: 90 bytes may be used
THRESHOLD = 0.9


class FakeContainer:
    def __init__(self) -> None:
        self.used = 0
        self.sizes: dict[str, int] = {}
        self.gates: dict[str, asyncio.Event] = {}
        self.stuck: set[str] = set()  # their unload times out
        self.started: list[str] = []
        self.finished: list[str] = []

    def probe(self) -> int:
        return self.used

    def hold(self, *targets: str) -> None:
        """Their unloads wait until released."""
        for target in targets:
            self.gates[target] = asyncio.Event()

    def release(self, target: str) -> None:
        self.gates[target].set()

    async def unload(self, target: str, timeout_s: float | None) -> None:
        self.started.append(target)
        if target in self.gates:
            await self.gates[target].wait()
        if target in self.stuck:
            raise ContainerTimedOut(f"unload of {target} did not finish in {timeout_s} s")
        self.used -= self.sizes.pop(target, 0)
        self.finished.append(target)


class Setup:
    def __init__(self) -> None:
        self.container = FakeContainer()
        self.loaded: OrderedDict[str, LoadedEntry] = OrderedDict()
        self.outstanding: dict[str, int] = {}
        self.restarts = 0
        self.touched: list[str] = []
        self.admission = Admission(
            self.loaded, memory_probe=self.container.probe, limit_bytes=LIMIT, threshold=THRESHOLD,
            unload=self.container.unload, outstanding=lambda t: self.outstanding.get(t, 0),
            restart=self.restart, on_unloaded=self.touched.append)

    async def restart(self) -> None:
        self.restarts += 1
        self.loaded.clear()
        self.container.used = 0
        self.container.sizes.clear()

    def load(self, target: str, size: int, invocations: int = 1) -> LoadedEntry:
        """A model already in the container, its footprint measured."""
        entry = LoadedEntry(target, cached=None, footprint_bytes=size, load_seconds=0.1, invocations=invocations)
        self.loaded[target] = entry
        self.container.sizes[target] = size
        self.container.used += size
        self.admission.record_footprint(target, size, overlapped=False)
        return entry


async def settle() -> None:
    """Let every task that can run, run (evictions, notifications)."""
    for _ in range(3):
        await asyncio.sleep(0.01)


def run(coro) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout=5))


def test_a_load_that_does_not_fit_evicts_the_least_recently_used_idle_model_and_waits_for_it():
    async def main():
        s = Setup()
        s.load("a", 40)
        s.load("b", 40)
        s.loaded.move_to_end("a")  # a served last: b is the least recently used
        s.container.hold("b")
        # 80 used + 40 expected for the new load > 90: b must go first.
        admit = asyncio.create_task(s.admission.admit("c"))
        await settle()
        assert not admit.done(), "the load went ahead before the eviction finished"
        assert s.container.started == ["b"] and list(s.loaded) == ["a"]
        assert s.admission.unloading == {"b"}  # a request for b now waits for its old copy to go
        assert not s.admission.room.locked(), "the eviction holds the room lock"
        s.container.release("b")
        reserved = await admit
        assert reserved == 40 and s.admission.reserved_bytes == 40 and s.admission.active_loads == 1
        assert s.container.finished == ["b"] and s.container.used == 40 and list(s.loaded) == ["a"]
        assert not s.admission.unloading and not s.admission.evictions and s.touched == ["b"]
        assert not s.admission.took_over_threshold("c")
        await s.admission.release(reserved)
        assert s.admission.reserved_bytes == 0 and s.admission.active_loads == 0

    run(main())


def test_a_model_that_served_is_evicted_before_a_fresh_copy_that_has_not_yet():
    async def main():
        s = Setup()
        s.load("fresh", 40, invocations=0)  # least recently used, but its first request has not reached it
        s.load("served", 40)
        assert await s.admission.admit("c") == 40
        assert s.container.finished == ["served"] and list(s.loaded) == ["fresh"]

    run(main())


def test_a_model_with_requests_in_flight_or_outstanding_hedged_copies_is_never_evicted():
    async def main():
        s = Setup()
        s.load("a", 40).inflight = 1  # a request through the front
        s.load("b", 40)
        s.outstanding["b"] = 1  # a slower hedged copy still running in the container
        admit = asyncio.create_task(s.admission.admit("c"))
        await settle()
        # Both busy: nothing is evicted, and the load waits rather than going over the threshold.
        assert not admit.done() and s.container.started == [] and list(s.loaded) == ["a", "b"]
        assert s.admission.room_waiters == 1
        s.outstanding.pop("b")  # b's slower copy answered: the forwarder calls on_idle
        s.admission.model_idle("b")
        assert await admit == 40
        assert s.container.finished == ["b"] and list(s.loaded) == ["a"]  # a, still serving, stays
        assert not s.admission.took_over_threshold("c")

    run(main())


def test_a_load_with_nothing_to_evict_and_nothing_busy_goes_ahead_marked_above_threshold():
    async def main():
        s = Setup()
        s.container.used = 95  # over the threshold already, and nothing loaded to unload
        first = await s.admission.admit("x")
        assert first == 0 and s.admission.active_loads == 1
        assert s.admission.took_over_threshold("x") and not s.admission.took_over_threshold("x")
        # A second load waits for the first (that may make room, or measure a footprint) ...
        second = asyncio.create_task(s.admission.admit("y"))
        await settle()
        assert not second.done()
        # ... and goes ahead above the threshold once nothing can make room any more.
        await s.admission.release(first)
        await second
        assert s.admission.took_over_threshold("y") and s.container.started == []

    run(main())


def test_each_load_waiting_for_room_gets_its_own_eviction_and_wakes_when_one_finishes():
    """Two loads need room at once: the second's arrival starts the second eviction at once (each
    load that needs room evicts for itself), instead of waiting for the first eviction to finish
    and then starting its own: under thrash that serialised the unloads, one waiting load at a time."""
    async def main():
        s = Setup()
        s.load("a", 40)
        s.load("b", 40)
        s.container.hold("a", "b")
        c = asyncio.create_task(s.admission.admit("c"))
        await settle()
        assert s.container.started == ["a"] and s.admission.room_waiters == 1  # c's own eviction
        d = asyncio.create_task(s.admission.admit("d"))
        await settle()
        assert s.container.started == ["a", "b"] and s.admission.room_waiters == 2  # and d's, in parallel
        assert not c.done() and not d.done()
        s.container.release("a")
        assert await c == 40
        await settle()
        assert not d.done()  # a's room went to c; b's is still leaving
        s.container.release("b")
        assert await d == 40
        assert s.container.started == ["a", "b"]  # no eviction more than the two loads needed
        assert s.container.used == 0 and not s.loaded and s.admission.reserved_bytes == 80

    run(main())


def test_evictions_for_one_load_run_in_parallel_outside_the_room_lock():
    async def main():
        s = Setup()
        for target in ("a", "b", "c"):
            s.load(target, 20)
        s.container.used += 20  # memory the models do not account for
        s.admission.record_footprint("big", 50, overlapped=False)  # measured before: loads expect 50
        s.container.hold("a", "b")
        admit = asyncio.create_task(s.admission.admit("big"))
        await settle()
        # 80 used + 50 expected - 90 = 40 over: two 20-byte models go, both at once.
        assert s.container.started == ["a", "b"] and s.container.finished == []
        assert not s.admission.room.locked() and set(s.admission.evictions) == {"a", "b"}
        s.container.release("b")
        s.container.release("a")
        assert await admit == 50
        assert list(s.loaded) == ["c"] and s.container.used == 40

    run(main())


def test_an_eviction_whose_unload_times_out_restarts_the_server_and_wakes_the_waiters():
    async def main():
        s = Setup()
        s.load("a", 40)
        s.load("b", 40)
        s.container.stuck.add("a")
        assert await s.admission.admit("c") == 40
        assert s.restarts == 1 and s.container.finished == [] and not s.admission.evictions
        assert not s.admission.unloading and not s.loaded  # the restart emptied the container

    run(main())


def test_a_load_of_a_model_still_leaving_the_container_waits_for_it():
    async def main():
        s = Setup()
        entry = s.load("a", 10)
        assert await s.admission.withdraw("a", entry)
        assert not await s.admission.withdraw("a", entry)  # someone else already did
        admit = asyncio.create_task(s.admission.admit("a"))
        await settle()
        assert not admit.done() and "a" not in s.loaded
        await s.admission.unload_model("a", timeout_s=5.0)
        await s.admission.withdrawn("a")
        assert await admit == 10 and s.container.finished == ["a"]

    run(main())


def test_on_507_one_idle_model_is_evicted_and_none_when_all_are_busy():
    async def main():
        s = Setup()
        s.load("a", 10).inflight = 1
        assert await s.admission.evict_one() is None and list(s.loaded) == ["a"]
        s.load("b", 10)
        eviction = await s.admission.evict_one()
        await eviction
        assert s.container.finished == ["b"] and list(s.loaded) == ["a"]

    run(main())


def test_the_explicit_unload_and_the_footprint_estimate():
    async def main():
        s = Setup()
        s.load("a", 30)
        s.admission.record_footprint("a", 10, overlapped=True)  # disturbed: never lowers it
        assert s.admission.estimate_footprint() == 30
        s.admission.record_footprint("a", 10, overlapped=False)  # clean: it stands
        assert s.admission.estimate_footprint() == 10
        assert await s.admission.unload("a") and not await s.admission.unload("a")
        assert s.container.used == 0 and s.admission.unloads_done == 1 and s.touched == ["a"]

    run(main())


def test_an_explicit_unload_holds_no_lock_while_the_container_unloads():
    """A slow explicit unload (the python backend's take 2-3.5 s) does not hold admissions: another
    load that fits is admitted while it runs, and a load of the target itself waits until it is gone."""
    async def main():
        s = Setup()
        s.load("a", 30)
        s.container.hold("a")
        unloading = asyncio.create_task(s.admission.unload("a"))
        await settle()
        assert s.container.started == ["a"] and not unloading.done()
        assert await asyncio.wait_for(s.admission.admit("b"), 1) == 30  # admitted meanwhile
        again = asyncio.create_task(s.admission.admit("a"))
        await settle()
        assert not again.done()  # its old copy is still leaving
        s.container.release("a")
        assert await unloading is True
        assert await again == 30 and s.container.finished == ["a"]

    run(main())
