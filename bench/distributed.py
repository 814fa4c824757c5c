"""Master <-> worker plumbing on Locust's public seams.

The master sends the bench configuration to each worker as it connects (custom message
``bench_config``). A worker records its requests and CPU (:class:`bench.collect.Recorder`) and
ships them in every ``report_to_master`` (every 3 s) and in one more report, marked final, as
soon as its users stop; with ``--stop-on-failure`` it also reports its first failure at once
(``bench_failure``) instead of waiting for the next report.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import asdict
from typing import Callable

import gevent

from bench.collect import Collector, CpuSample, Recorder
from bench.config import BenchConfig
from bench.users import STATE
from mme.errors import MmeError

CONFIG_MSG = "bench_config"
CONFIG_REQUEST_MSG = "bench_config_request"
FAILURE_MSG = "bench_failure"
WORKER_ERROR_MSG = "bench_worker_error"
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


def _payload(recorder: Recorder, final: bool) -> dict:
    records, cpu = recorder.drain()
    return {"worker": recorder.worker, "records": records, "cpu": [asdict(s) for s in cpu],
            "open_loop": STATE.open_loop.as_dict(), "final": final}


def attach_worker(environment, runner, on_configured: Callable[[], None] | None = None) -> Recorder:
    """Wire a WorkerRunner: configuration in, records out."""
    stop_on_failure = [False]

    def on_failure(raw) -> None:
        if stop_on_failure[0]:
            stop_on_failure[0] = False  # once is enough
            runner.send_message(FAILURE_MSG, {"worker": recorder.worker, "record": list(raw)})

    recorder = Recorder(on_failure=on_failure)
    environment.events.request.add_listener(recorder.on_request)
    STATE.watch(environment)

    def on_config(environment, msg, **_kw) -> None:
        if STATE.ready.is_set():
            return  # a worker re-announces itself after each stop; keep the first configuration
        try:
            config = BenchConfig.from_dict(msg.data)
            STATE.configure(config)
        except MmeError as exc:
            STATE.error = str(exc)
            runner.send_message(WORKER_ERROR_MSG, {"worker": recorder.worker, "message": str(exc)})
            return
        stop_on_failure[0] = config.stop_on_failure
        if on_configured is not None:
            on_configured()

    runner.register_message(CONFIG_MSG, on_config)
    # Ask only now that the handler is registered: a config sent on connect could arrive before it.
    runner.send_message(CONFIG_REQUEST_MSG, {"worker": recorder.worker})

    def on_report(client_id, data, **_kw) -> None:
        data[REPORT_KEY] = _payload(recorder, final=False)

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
    """The master's side: sends the config, feeds worker samples to the collector."""

    def __init__(self, environment, runner, config: BenchConfig, on_failure: Callable[[str], None],
                 on_worker_error: Callable[[str, str], None]) -> None:
        self.runner = runner
        self.collector: Collector | None = None  # set when the run starts; samples before that carry no requests
        self.connected: set[str] = set()
        self.finals: set[str] = set()
        self.configured: set[str] = set()  # workers that asked for (and were sent) the configuration
        self.open_loop: dict[str, dict] = {}
        config_data = config.to_dict()

        def on_connect(client_id, **_kw) -> None:
            self.connected.add(client_id)

        environment.events.worker_connect.add_listener(on_connect)

        def on_config_request(environment, msg, **_kw) -> None:
            self.configured.add(msg.node_id)
            runner.send_message(CONFIG_MSG, config_data, client_id=msg.node_id)

        runner.register_message(CONFIG_REQUEST_MSG, on_config_request)

        def on_worker_report(client_id, data, **_kw) -> None:
            payload = data.get(REPORT_KEY)
            self._take(client_id, payload)
            if payload and payload.get("final"):
                self.finals.add(client_id)

        environment.events.worker_report.add_listener(on_worker_report)
        runner.register_message(FAILURE_MSG, lambda environment, msg, **_kw: on_failure(msg.data.get("worker", "")))
        runner.register_message(
            WORKER_ERROR_MSG, lambda environment, msg, **_kw: on_worker_error(msg.data.get("worker", ""), msg.data.get("message", "")))

    def _take(self, client_id: str, payload: dict | None) -> None:
        if not payload:
            return
        self.open_loop[client_id] = payload.get("open_loop") or {}
        if self.collector is None:
            return
        self.collector.add(payload["worker"], [tuple(r) for r in payload.get("records", ())])
        self.collector.add_cpu([CpuSample(**s) for s in payload.get("cpu", ())])

    def wait_for_finals(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.connected <= self.finals:
            if time.monotonic() > deadline:
                return False
            gevent.sleep(0.05)
        return True
