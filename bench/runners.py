"""The Locust runners behind one bench run, for ``bench.run``'s driver: either a local runner
that records its own requests (``bench.collect.Recorder``), or a master runner with K local
``bench.worker`` processes (and any remote ``mme bench-worker``) reached through
``bench.distributed.MasterLink``; starting users at each shape tick; and at the end stopping
the users, collecting the workers' final records and shutting everything down.

The master listens where ``config.generators.master_bind_host`` says (loopback unless the user named an
address) and admits only workers with the run's token: ``$MME_BENCH_WORKER_TOKEN``, else one
made here and printed in the line that tells remote workers how to join. Local workers get it
through their environment.

Part of the load generator process: import it only after gevent's monkey patching (``bench.run``
patches first).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from typing import Any, Callable

import gevent

from bench.collect import Collector, Recorder
from bench.config import TOKEN_ENV, BenchConfig
from bench.distributed import MasterLink
from bench.users import generator_of
from mme.errors import MmeError
from mme.network import is_loopback
from mme.process import child_env
from mme.progress import Reporter

FINALS_TIMEOUT_S = 10.0  # after the drain, how long workers may take to send their last records
STOP_MARGIN_S = 15.0  # beyond the drain, how long stopping the users may take


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host if host not in ("*", "0.0.0.0") else "", 0))
        return sock.getsockname()[1]


class LoadRunners:
    """The run's Locust runner (``runner``) and what feeds it: ``recorder`` for a local run,
    ``link`` and the local worker processes for a distributed one. Notes the master's address
    in ``extra`` (saved into run.json)."""

    def __init__(self, environment, config: BenchConfig, reporter: Reporter, extra: dict,
                 on_failure: Callable, on_worker_error: Callable[[str, str], None]) -> None:
        self.environment = environment
        self.generator = generator_of(environment)  # this process's users' shared state
        self.config = config
        self.reporter = reporter
        self.extra = extra
        self._on_failure = on_failure
        self._on_worker_error = on_worker_error
        self.runner: Any = None  # locust's LocalRunner or MasterRunner once created
        self.recorder: Recorder | None = None
        self.link: MasterLink | None = None
        self._start_greenlet: gevent.Greenlet | None = None
        self._worker_processes: list[subprocess.Popen] = []

    def create(self, stopping: Callable[[], bool]):
        """The runner, with every expected worker connected and configured (unless
        ``stopping()`` turns true while waiting for them)."""
        config, generators = self.config, self.config.generators
        if not generators.distributed:
            runner = self.runner = self.environment.create_local_runner()
            self.generator.configure(config)
            self.generator.watch(self.environment)
            self.recorder = Recorder(on_failure=self._on_failure)
            self.environment.events.request.add_listener(self.recorder.on_request)
            gevent.spawn(self.recorder.run_cpu_sampler, gevent.sleep)
            return runner
        host = generators.master_bind_host
        port = generators.master_port or _free_port(host)
        token = os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(24)
        if not is_loopback(host):
            self.reporter.warn(f"the bench master listens on {host}:{port}, open to other machines; "
                               "workers must present the token to join")
        runner = self.runner = self.environment.create_master_runner(host, port)
        self.link = MasterLink(self.environment, runner, config, self._on_failure, self._on_worker_error,
                               token, self._on_refused)
        self.extra["master"] = f"{host}:{port}"
        env = child_env(extra={TOKEN_ENV: token}, lifeline=True)  # not on the command line, where 'ps' shows it
        for _ in range(generators.local_workers):
            self._worker_processes.append(subprocess.Popen(
                [sys.executable, "-m", "bench.worker", "--master-host", "127.0.0.1", "--master-port", str(port), "--managed"],
                env=env))
        expected = generators.count
        if generators.expect_workers:
            join_host = "127.0.0.1" if is_loopback(host) else ("<this host>" if host in ("0.0.0.0", "::", "*") else host)
            where = (" (the master listens on loopback only: run workers on this machine or through an SSH tunnel, "
                     "or give --master-bind-host <this host's address> to accept remote workers)") if is_loopback(host) else ""
            # Printed even with --quiet: without it nobody could join with a token made here.
            print(f"==> waiting for {generators.expect_workers} remote worker(s): mme bench-worker --master-host "
                  f"{join_host} --master-port {port} --token {token}{where}", file=self.reporter.stream, flush=True)
        deadline = time.monotonic() + generators.worker_wait_s
        while runner.worker_count < expected or len(self.link.configured) < expected:
            if stopping():
                return runner
            for process in self._worker_processes:
                if process.poll() is not None:
                    raise MmeError(f"a local worker process exited with {process.returncode} before the run started")
            if time.monotonic() > deadline:
                refused = self.extra.get("refused_workers", 0)
                raise MmeError(f"only {runner.worker_count} of {expected} workers connected within "
                               f"{generators.worker_wait_s:g} s (master at {host}:{port})"
                               + (f"; {refused} refused for a wrong or missing token" if refused else ""))
            gevent.sleep(0.1)
        return runner

    def _on_refused(self, client_id: str) -> None:
        self.extra["refused_workers"] = self.extra.get("refused_workers", 0) + 1
        self.reporter.warn(f"refused a worker from {client_id}: wrong or missing token")

    def start_users(self, users: int, spawn_rate: float) -> None:
        runner = self.runner
        if self.link is None:
            runner.start(users, spawn_rate)
            return
        # MasterRunner.start blocks for the whole ramp: run it aside, and let a newer stage replace it.
        if self._start_greenlet is not None and not self._start_greenlet.ready():
            self._start_greenlet.kill(block=True)
        self._start_greenlet = gevent.spawn(runner.start, users, spawn_rate)

    def drain_into(self, collector: Collector | None) -> None:
        """Hand the local runner's recorded requests and CPU samples to the collector."""
        if self.recorder is not None and collector is not None:
            records, cpu = self.recorder.drain()
            collector.add(self.recorder.worker, records)
            collector.add_cpu(cpu)

    def open_loop_counts(self) -> dict:
        """Open-loop arrivals scheduled and started late, over every generator."""
        parts = list(self.link.open_loop.values()) if self.link is not None else [self.generator.open_loop.as_dict()]
        return {"scheduled": sum(p.get("scheduled", 0) for p in parts),
                "late_starts": sum(p.get("late_starts", 0) for p in parts),
                "max_lateness_ms": max((p.get("max_lateness_ms", 0.0) for p in parts), default=0.0)}

    def stop(self, wait_for_finals: bool) -> None:
        """Stop the users; with ``wait_for_finals``, wait for the workers' last records."""
        runner = self.runner
        if runner is None:
            return
        if self._start_greenlet is not None:
            self._start_greenlet.kill(block=True)
        drain_s = self.config.stops.drain_s
        with gevent.Timeout(drain_s + STOP_MARGIN_S, False):
            runner.stop()  # users finish their request in flight, up to the drain (Locust's stop_timeout)
        if (self.link is not None and wait_for_finals
                and not self.link.wait_for_finals(drain_s + FINALS_TIMEOUT_S)):
            self.reporter.warn("some workers sent no final records; requests.csv may miss their last seconds")

    def cut_short(self) -> None:
        """End the drain now: users still waiting for an answer are stopped (their requests are
        recorded as cut off). Workers of a distributed run are told to quit; what they had not
        sent yet is lost."""
        runner = self.runner
        if runner is None:
            return
        if self.link is None:
            runner.user_greenlets.kill(block=False)
            return
        for client_id in self.link.connected:
            runner.send_message("quit", None, client_id=client_id)

    def shut_down(self, patient: bool) -> None:
        """Tell every worker to quit, quit the runner and wait for the local worker processes
        (up to 10 s each when ``patient``, else half a second before terminating them)."""
        runner = self.runner
        if self.link is not None:
            # Workers that reported 'client_stopped' are off the master's list until they re-announce
            # themselves; tell every worker that ever connected to quit.
            for client_id in self.link.connected:
                runner.send_message("quit", None, client_id=client_id)
        if runner is not None:
            runner.quit()
        for process in self._worker_processes:
            try:
                process.wait(timeout=10 if patient else 0.5)
            except subprocess.TimeoutExpired:
                process.terminate()
                process.wait(timeout=10)
        self.generator.close()
