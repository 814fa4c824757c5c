"""The Locust user: one InvokeEndpoint per task, reported through ``events.request``.

Closed loop (every shape but open-loop): each user sends, waits for the answer, then waits
``load.wait_s`` (0.05-0.5 s as in the article) before the next request.

Open loop: each user is an arrival scheduler. Requests start on a fixed schedule (``rate``
per second across all generators) in greenlets of their own, whatever the endpoint does, up
to a cap on requests in flight; an arrival that finds the cap reached starts late and is
counted, so a stalled endpoint shows up instead of silently slowing the load down.

The state the users of one generator process share (the configuration once it is known, the
client, the target picker, the requests in flight) is a :class:`GeneratorState` on Locust's
environment of the process (:class:`BenchEnvironment`, made by ``bench.run`` and ``bench.worker``);
each user reaches it through its own ``environment``.

Each request fires ``events.request`` with ``context["bench"] = (sent_at, target, status,
error, users, message, cut_off, cold)``; ``bench.collect`` turns those into requests.csv rows. When
the run ends, users finish the request in flight (Locust's ``stop_timeout``: the run's drain
timeout); one still in flight when the drain ends (its greenlet killed) fires as cut off, so
no request that was sent goes unrecorded.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass, field
from typing import Iterator

from gevent import GreenletExit
from gevent.event import Event
from gevent.pool import Pool
from locust import User, task
from locust.env import Environment

from bench.client import InvokeResult, Invoker, invoker_for
from bench.config import BenchConfig
from bench.endpoint import resolve_credentials
from bench.targets import TargetPicker

LATE_START_S = 0.010  # an open-loop arrival starting later than this after its schedule is late
CONFIG_WAIT_S = 60.0


CUT_OFF = "CutOff"  # error code of a request still in flight when the drain ended


class RequestFailed(Exception):
    """What Locust's failure statistics see for a failed request."""

    def __init__(self, result: InvokeResult) -> None:
        detail = f"HTTP {result.status}" if result.status else "no response"
        super().__init__(f"{result.error} ({detail})")


@dataclass
class OpenLoopCounters:
    scheduled: int = 0
    late: int = 0
    max_lateness_s: float = 0.0

    def note(self, lateness_s: float) -> None:
        self.scheduled += 1
        if lateness_s > LATE_START_S:
            self.late += 1
        if lateness_s > self.max_lateness_s:
            self.max_lateness_s = lateness_s

    def as_dict(self) -> dict:
        return {"scheduled": self.scheduled, "late_starts": self.late, "max_lateness_ms": round(self.max_lateness_s * 1e3, 3)}


@dataclass
class GeneratorState:
    """What the users of this process share: the config, one client (its connection pool sized
    to the users), the target picker. Set by ``configure`` once the config is known. It lives on
    the process's Locust environment (:class:`BenchEnvironment`); users reach it through theirs."""

    config: BenchConfig | None = None
    invoker: Invoker | None = None
    picker: TargetPicker | None = None
    ready: Event = field(default_factory=Event)
    open_loop: OpenLoopCounters = field(default_factory=OpenLoopCounters)
    stopping: Event = field(default_factory=Event)  # set by test_stopping: start no more requests
    arrivals: bool = False  # open loop: users are arrival schedulers
    in_flight: dict[int, float] = field(default_factory=dict)  # requests sent and not answered: token -> sent_at
    tokens: Iterator[int] = field(default_factory=itertools.count)
    wait_s: tuple[float, float] = (0.0, 0.0)
    error: str | None = None

    def configure(self, config: BenchConfig) -> None:
        plan = config.load.plan
        self.arrivals = plan.open_loop
        self.wait_s = config.load.wait_s
        share = -(-(config.load.max_inflight if plan.open_loop else plan.max_users) // config.generators.count)
        credentials, _ = resolve_credentials(config.endpoint.address)
        mix = config.targets.mix
        if mix is not None:  # a fleet: each target its own body
            self.invoker = MixInvoker({target: invoker_for(config, credentials, payload, share + 1)
                                       for target, payload in zip(mix.targets, mix.payloads)})
        else:
            self.invoker = invoker_for(config, credentials, config.payload, share + 1)
        targets = config.targets
        if targets.names:
            self.picker = TargetPicker(targets.names, targets.distribution, seed=targets.seed,
                                       weights=mix.weights if mix is not None else None)
        self.config = config
        self.ready.set()

    def watch(self, environment: Environment) -> None:
        """Start no new request (no open-loop arrival, no closed-loop send) once the run starts
        stopping, before users are stopped."""
        environment.events.test_stopping.add_listener(lambda **_kw: self.stopping.set())

    def in_flight_between(self, start_wall: float, end_wall: float) -> int:
        """Requests of this generator still waiting for an answer that were sent in [start_wall, end_wall)."""
        return sum(1 for sent in list(self.in_flight.values()) if start_wall <= sent < end_wall)

    def close(self) -> None:
        if self.invoker is not None:
            self.invoker.close()


class BenchEnvironment(Environment):
    """Locust's environment of a generator process, holding the state its users share."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.generator = GeneratorState()


def generator_of(environment: Environment) -> GeneratorState:
    """The shared state of the generator process ``environment`` belongs to."""
    if not isinstance(environment, BenchEnvironment):
        raise TypeError("bench users run in a bench.users.BenchEnvironment (bench.run, bench.worker)")
    return environment.generator


class MixInvoker:
    """A fleet's requests: each target through the invoker holding its own sample body."""

    def __init__(self, invokers: dict[str, Invoker]) -> None:
        self.invokers = invokers

    def invoke(self, target: str | None) -> InvokeResult:
        return self.invokers[target or ""].invoke(target)

    def close(self) -> None:
        for invoker in self.invokers.values():
            invoker.close()


class BenchUser(User):
    """Sends the configured request to the configured endpoint; see the module docstring."""

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        self.generator = generator_of(environment)
        self._pool: Pool | None = None

    def wait_time(self) -> float:
        return 0.0 if self.generator.arrivals else random.uniform(*self.generator.wait_s)

    def on_start(self) -> None:
        if not self.generator.ready.wait(timeout=CONFIG_WAIT_S):
            raise RuntimeError("no bench configuration arrived from the master")

    def on_stop(self) -> None:
        if self._pool is not None:
            self._pool.kill(block=False)

    @task
    def invoke(self) -> None:
        if self.generator.arrivals:
            assert self.generator.config is not None
            self._schedule_arrivals(self.generator.config)
        else:
            self._send(self.environment.runner.user_count if self.environment.runner else 0)

    def _send(self, users: int) -> None:
        state = self.generator
        if state.stopping.is_set():  # the run is ending: a user Locust is stopping may still wake here
            return
        target = state.picker.pick() if state.picker is not None else None
        sent_at = time.time()
        assert state.invoker is not None  # configured before any user runs (state.ready)
        token = next(state.tokens)
        state.in_flight[token] = sent_at
        try:
            result: InvokeResult = state.invoker.invoke(target)
        except GreenletExit:  # the drain ended with this request in flight: recorded as cut off
            waited_ms = (time.time() - sent_at) * 1000.0
            self.environment.events.request.fire(
                request_type="POST", name=target or "invocations", response_time=waited_ms, response_length=0,
                exception=None, context={"bench": (sent_at, target or "", 0, CUT_OFF, users,
                                                   "still in flight when the drain timeout ended the run", 1, None)},
                response=None, url=None)
            raise
        finally:
            state.in_flight.pop(token, None)
        self.environment.events.request.fire(
            request_type="POST", name=target or "invocations", response_time=result.latency_ms,
            response_length=result.response_bytes, exception=None if result.ok else RequestFailed(result),
            context={"bench": (sent_at, target or "", result.status, result.error, users, result.message, 0,
                               result.cold)},
            response=None, url=None,
        )

    def _schedule_arrivals(self, config: BenchConfig) -> None:
        state, plan, generators = self.generator, config.load.plan, config.generators.count
        assert plan.rate is not None
        interval = generators / plan.rate
        self._pool = pool = Pool(max(1, config.load.max_inflight // generators))
        start = time.perf_counter()
        n = 0
        while not state.stopping.is_set():
            due = start + n * interval
            delay = due - time.perf_counter()
            if delay > 0 and state.stopping.wait(delay):
                break
            pool.wait_available()
            if state.stopping.is_set():
                break
            state.open_loop.note(time.perf_counter() - due)
            pool.spawn(self._send, len(pool) + 1)
            n += 1
        pool.join()  # the run's stop grace period bounds this
