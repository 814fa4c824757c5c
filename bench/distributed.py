"""Master <-> worker plumbing on Locust's public seams.

The master sends the bench configuration to each worker as it connects (custom message
``bench_config``). A worker records its requests and CPU (:class:`bench.collect.Recorder`) and
ships them in every ``report_to_master`` (every 3 s) and in one more report, marked final, as
soon as its users stop; with ``--stop-on-failure`` it also reports its first failure at once
(``bench_failure``) instead of waiting for the next report.

Locust's master protocol has no authentication, so the master admits only workers that
present the run's shared token in their configuration request: until then a connection is
not one of the runner's clients (never counted, never given users, its messages dropped);
a wrong or missing token gets a refusal (``bench_refused``) and Locust's ``quit``.
"""

from __future__ import annotations

import hmac
import logging
import sys
import time
from dataclasses import asdict
from typing import Callable

import gevent

from bench.collect import Collector, CpuSample, Recorder
from bench.config import BenchConfig
from bench.users import GeneratorState, generator_of
from mme.errors import MmeError

CONFIG_MSG = "bench_config"
CONFIG_REQUEST_MSG = "bench_config_request"
FAILURE_MSG = "bench_failure"
WORKER_ERROR_MSG = "bench_worker_error"
REFUSED_MSG = "bench_refused"
REFUSED_ERROR = "the bench master refused this worker: wrong or missing --token"
REPORT_KEY = "bench"

_NOISE = ("spawn rate is very high", "CPU usage above", "exceeded cpu threshold", "CPU usage threshold was exceeded")


class _DropNoise(logging.Filter):
    """Locust's own CPU warnings are replaced by the per-stage saturation report; its spawn-rate
    warning fires for every time-scaled staged run."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(noise in message for noise in _NOISE)


def setup_logging(prefix: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{prefix}: %(levelname)s %(message)s"))
    handler.addFilter(_DropNoise())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)


def _payload(recorder: Recorder, state: GeneratorState, final: bool) -> dict:
    # "at" and "in_flight" (when each request not answered yet was sent) are taken with the
    # records: every request sent before "at" is either in these records (or earlier ones) or in flight.
    at, in_flight = time.time(), list(state.in_flight.values())
    records, cpu = recorder.drain()
    return {"worker": recorder.worker, "records": records, "cpu": [asdict(s) for s in cpu],
            "open_loop": state.open_loop.as_dict(), "final": final, "at": at, "in_flight": in_flight}


def attach_worker(environment, runner, on_configured: Callable[[], None] | None = None,
                  token: str | None = None) -> Recorder:
    """Wire a WorkerRunner: configuration in (asked for with ``token``) to the environment's
    generator state, records out."""
    state = generator_of(environment)
    stop_on_failure = [False]

    def on_failure(raw) -> None:
        if stop_on_failure[0]:
            stop_on_failure[0] = False  # once is enough
            runner.send_message(FAILURE_MSG, {"worker": recorder.worker, "record": list(raw)})

    recorder = Recorder(on_failure=on_failure)
    environment.events.request.add_listener(recorder.on_request)
    state.watch(environment)

    def drained(**_kw) -> None:
        # The drain is over once the users have stopped (test_stop fires then). Locust's worker
        # then sleeps stop_timeout before it reads the next message (its 'quit' included); the
        # next spawn message sets the drain again.
        environment.stop_timeout = 0.0

    environment.events.test_stop.add_listener(drained)

    def on_config(environment, msg, **_kw) -> None:
        if state.ready.is_set():
            return  # a worker re-announces itself after each stop; keep the first configuration
        try:
            config = BenchConfig.from_json(msg.data)
            state.configure(config)
        except MmeError as exc:
            state.error = str(exc)
            runner.send_message(WORKER_ERROR_MSG, {"worker": recorder.worker, "message": str(exc)})
            return
        stop_on_failure[0] = config.stops.stop_on_failure
        if on_configured is not None:
            on_configured()

    def on_refused(environment, msg, **_kw) -> None:
        state.error = REFUSED_ERROR  # the master's 'quit' follows and ends the worker

    runner.register_message(CONFIG_MSG, on_config)
    runner.register_message(REFUSED_MSG, on_refused)
    # Ask only now that the handlers are registered: a config sent on connect could arrive before them.
    runner.send_message(CONFIG_REQUEST_MSG, {"worker": recorder.worker, "token": token or ""})

    def on_report(client_id, data, **_kw) -> None:
        data[REPORT_KEY] = _payload(recorder, state, final=False)

    environment.events.report_to_master.add_listener(on_report)

    def on_test_stop(environment, **_kw) -> None:
        # A complete report (Locust's statistics and ours) as soon as the users are stopped, in the
        # same 'stats' message the periodic reports use: the master need not wait for the next one.
        data: dict = {}
        environment.events.report_to_master.fire(client_id=runner.client_id, data=data)
        data[REPORT_KEY]["final"] = True
        runner.send_message("stats", data)

    environment.events.test_stop.add_listener(on_test_stop)
    gevent.spawn(recorder.run_cpu_sampler, gevent.sleep)
    return recorder


class MasterLink:
    """The master's side: admits workers with the token, sends them the config, feeds their
    samples to the collector. ``on_refused(client_id)`` hears of each worker turned away."""

    def __init__(self, environment, runner, config: BenchConfig, on_failure: Callable[[str], None],
                 on_worker_error: Callable[[str, str], None], token: str,
                 on_refused: Callable[[str], None]) -> None:
        self.runner = runner
        self.token = token
        self.on_refused = on_refused
        self.admitted: set[str] = set()  # workers that presented the token
        self._pending: dict[str, object] = {}  # their 'client_ready', held until they do
        self._handle = runner.handle_message
        runner.handle_message = self._gate  # every message from a worker passes here first
        self.collector: Collector | None = None  # set when the run starts; samples before that carry no requests
        self.connected: set[str] = set()
        self.finals: set[str] = set()
        self.configured: set[str] = set()  # workers that asked for (and were sent) the configuration
        self.open_loop: dict[str, dict] = {}
        # each worker's latest report: when it was made and when its requests still in flight were sent
        self.in_flight: dict[str, tuple[float, list[float]]] = {}

        def on_connect(client_id, **_kw) -> None:
            self.connected.add(client_id)

        environment.events.worker_connect.add_listener(on_connect)

        self._config_data = config.to_json()  # the configuration crosses to each worker as JSON text

        def on_worker_report(client_id, data, **_kw) -> None:
            payload = data.get(REPORT_KEY)
            self._take(client_id, payload)
            if payload and payload.get("final"):
                self.finals.add(client_id)

        environment.events.worker_report.add_listener(on_worker_report)
        runner.register_message(FAILURE_MSG, lambda environment, msg, **_kw: on_failure(msg.data.get("worker", "")))
        runner.register_message(
            WORKER_ERROR_MSG, lambda environment, msg, **_kw: on_worker_error(msg.data.get("worker", ""), msg.data.get("message", "")))

    def _gate(self, client_id: str, msg) -> None:
        """Locust's handling for admitted workers; for others only the token check."""
        if msg.type == CONFIG_REQUEST_MSG:
            self._admit(client_id, msg.data if isinstance(msg.data, dict) else {})
        elif client_id in self.admitted:
            self._handle(client_id, msg)
        elif msg.type == "client_ready":
            from locust.rpc import Message  # noqa: PLC0415 - importing locust patches the process: generator processes only

            # Acknowledge (the worker waits for it before asking for the configuration), but
            # keep it off the runner's clients until it shows the token.
            self._pending[client_id] = msg
            self.runner.server.send_to_client(Message("ack", None, client_id))
        # Anything else from a worker without the token (reports, failures) is dropped.

    def _admit(self, client_id: str, data: dict) -> None:
        from locust.rpc import Message  # noqa: PLC0415 - importing locust patches the process: generator processes only

        token = data.get("token")
        if not (isinstance(token, str) and hmac.compare_digest(token.encode(), self.token.encode())):
            self._pending.pop(client_id, None)
            if client_id in self.admitted:  # cannot happen with our workers; take it off all the same
                self.admitted.discard(client_id)
                self._handle(client_id, Message("quit", None, client_id))
            self.runner.server.send_to_client(Message(REFUSED_MSG, None, client_id))
            self.runner.server.send_to_client(Message("quit", None, client_id))
            self.on_refused(client_id)
            return
        if client_id not in self.admitted:
            self.admitted.add(client_id)
            ready = self._pending.pop(client_id, None) or Message("client_ready", -1, client_id)
            self._handle(client_id, ready)  # now Locust counts it and may give it users
        self.configured.add(client_id)
        self.runner.send_message(CONFIG_MSG, self._config_data, client_id=client_id)

    def _take(self, client_id: str, payload: dict | None) -> None:
        if not payload:
            return
        self.open_loop[client_id] = payload.get("open_loop") or {}
        self.in_flight[client_id] = (float(payload.get("at", 0.0)), [float(t) for t in payload.get("in_flight", ())])
        if self.collector is None:
            return
        self.collector.add(payload["worker"], [tuple(r) for r in payload.get("records", ())])
        self.collector.add_cpu([CpuSample(**s) for s in payload.get("cpu", ())])

    def in_flight_between(self, start_wall: float, end_wall: float) -> int | None:
        """Requests sent in [start_wall, end_wall) the workers had not had answered at their
        latest report; None until every worker has reported since ``end_wall`` or sent its final
        report (until then a request of the window may be neither recorded nor known to be in flight)."""
        if any(c not in self.in_flight or (self.in_flight[c][0] < end_wall and c not in self.finals)
               for c in self.admitted):
            return None
        return sum(1 for c in self.admitted for t in self.in_flight[c][1] if start_wall <= t < end_wall)

    def wait_for_finals(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.connected <= self.finals:
            if time.monotonic() > deadline:
                return False
            gevent.sleep(0.05)
        return True
