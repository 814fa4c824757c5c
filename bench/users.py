"""The Locust user: one InvokeEndpoint per task, reported through ``events.request``.

Closed loop (every shape but open-loop): each user sends, waits for the answer, then waits
``wait_min_s``..``wait_max_s`` (0.05-0.5 s as in the article) before the next request.

Open loop: each user is an arrival scheduler. Requests start on a fixed schedule (``rate``
per second across all generators) in greenlets of their own, whatever the endpoint does, up
to a cap on requests in flight; an arrival that finds the cap reached starts late and is
counted, so a stalled endpoint shows up instead of silently slowing the load down.

Each request fires ``events.request`` with ``context["bench"] = (sent_at, target, status,
error, users, message, cut_off, cold)``; ``bench.collect`` turns those into requests.csv rows. When
the run ends, users finish the request in flight (Locust's ``stop_timeout``: the run's drain
timeout); one still in flight when the drain ends (its greenlet killed) fires as cut off, so
no request that was sent goes unrecorded.
"""

from __future__ import annotations

import base64
import itertools
import random
import time
from dataclasses import dataclass, field
from typing import Iterator

from gevent import GreenletExit
from gevent.event import Event
from gevent.pool import Pool
from locust import User, task

from bench.client import CLIENTS, InvokeResult, Invoker
from bench.config import BenchConfig
from bench.endpoint import resolve_credentials
from bench.targets import TargetPicker, parse_distribution

LATE_START_S = 0.010  # an open-loop arrival starting later than this after its schedule is late
CONFIG_WAIT_S = 60.0


CUT_OFF = "CutOff"  # error code of a request still in flight when the drain ended


class InvokeFailed(Exception):
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
    to the users), the target picker. Set by ``configure`` once the config is known."""

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
        plan = config.load_plan
        self.arrivals = plan.open_loop
        self.wait_s = (config.wait_min_s, config.wait_max_s)
        share = -(-(config.max_inflight if plan.open_loop else plan.max_users) // config.generators)
        credentials, _ = resolve_credentials(config.address)
        def invoker(body: bytes, content_type: str) -> Invoker:
            return CLIENTS[config.client](config.address, credentials, body, content_type, config.accept,
                                          pool_size=share + 1, timeout_s=config.timeout_s)

        weights = None
        if config.mix and config.mix_payloads:  # a fleet: each target its own body
            self.invoker = MixInvoker({target: invoker(base64.b64decode(body), content_type) for target, (body, content_type)
                                       in zip(config.targets, config.mix_payloads)})
            weights = tuple(config.mix["weights"])
        else:
            self.invoker = invoker(config.payload, config.content_type)
        if config.targets:
            self.picker = TargetPicker(config.targets, parse_distribution(config.distribution), seed=config.seed,
                                       weights=weights)
        self.config = config
        self.ready.set()

    def watch(self, environment) -> None:
        """Start no new request (no open-loop arrival, no closed-loop send) once the run starts
        stopping, before users are stopped."""
        environment.events.test_stopping.add_listener(lambda **_kw: self.stopping.set())

    def in_flight_between(self, start_wall: float, end_wall: float) -> int:
        """Requests of this generator still waiting for an answer that were sent in [start_wall, end_wall)."""
        return sum(1 for sent in list(self.in_flight.values()) if start_wall <= sent < end_wall)

    def close(self) -> None:
        if self.invoker is not None:
            self.invoker.close()


class MixInvoker:
    """A fleet's requests: each target through the invoker holding its own sample body."""

    def __init__(self, invokers: dict[str, Invoker]) -> None:
        self.invokers = invokers

    def invoke(self, target: str | None) -> InvokeResult:
        return self.invokers[target or ""].invoke(target)

    def close(self) -> None:
        for invoker in self.invokers.values():
            invoker.close()


STATE = GeneratorState()


class BenchUser(User):
    """Sends the configured request to the configured endpoint; see the module docstring."""

    def wait_time(self) -> float:
        return 0.0 if STATE.arrivals else random.uniform(*STATE.wait_s)

    def on_start(self) -> None:
        if not STATE.ready.wait(timeout=CONFIG_WAIT_S):
            raise RuntimeError("no bench configuration arrived from the master")
        self._pool: Pool | None = None

    def on_stop(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.kill(block=False)

    @task
    def invoke(self) -> None:
        if STATE.arrivals:
            assert STATE.config is not None
            self._schedule_arrivals(STATE.config)
        else:
            self._send(self.environment.runner.user_count if self.environment.runner else 0)

    def _send(self, users: int) -> None:
        if STATE.stopping.is_set():  # the run is ending: a user Locust is stopping may still wake here
            return
        target = STATE.picker.pick() if STATE.picker is not None else None
        sent_at = time.time()
        assert STATE.invoker is not None  # configured before any user runs (STATE.ready)
        token = next(STATE.tokens)
        STATE.in_flight[token] = sent_at
        try:
            result: InvokeResult = STATE.invoker.invoke(target)
        except GreenletExit:  # the drain ended with this request in flight: recorded as cut off
            waited_ms = (time.time() - sent_at) * 1000.0
            self.environment.events.request.fire(
                request_type="POST", name=target or "invocations", response_time=waited_ms, response_length=0,
                exception=None, context={"bench": (sent_at, target or "", 0, CUT_OFF, users,
                                                   "still in flight when the drain timeout ended the run", 1, None)},
                response=None, url=None)
            raise
        finally:
            STATE.in_flight.pop(token, None)
        self.environment.events.request.fire(
            request_type="POST", name=target or "invocations", response_time=result.latency_ms,
            response_length=result.response_bytes, exception=None if result.ok else InvokeFailed(result),
            context={"bench": (sent_at, target or "", result.status, result.error, users, result.message, 0,
                               result.cold)},
            response=None, url=None,
        )

    def _schedule_arrivals(self, config: BenchConfig) -> None:
        plan = config.load_plan
        assert plan.rate is not None
        interval = config.generators / plan.rate
        self._pool = pool = Pool(max(1, config.max_inflight // config.generators))
        start = time.perf_counter()
        n = 0
        while not STATE.stopping.is_set():
            due = start + n * interval
            delay = due - time.perf_counter()
            if delay > 0 and STATE.stopping.wait(delay):
                break
            pool.wait_available()
            if STATE.stopping.is_set():
                break
            STATE.open_loop.note(time.perf_counter() - due)
            pool.spawn(self._send, len(pool) + 1)
            n += 1
        pool.join()  # the run's stop grace period bounds this
