"""The load generator process: ``python -m bench.run --config CONFIG.json``.

``mme bench`` checks everything, creates the run directory and starts this in a fresh process
(Locust monkey-patches the standard library on import, which the ``mme`` process must not
suffer). Here: a Locust Environment used as a library, with a local runner, or a master plus K
local worker processes (and any remote ``mme bench-worker``); a driver that follows the load
shape's ``tick()`` (10 times a second, so time-scaled stages shorter than Locust's 1 s shape
tick still happen), marks stage boundaries, snapshots the endpoint's metrics, checks the stop
conditions and prints progress; and the saved results (``bench.results``) at the end,
however the run ends: shape completed, stop condition, endpoint failures, Ctrl-C.
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import csv  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402
from gevent.event import Event  # noqa: E402
from locust import __version__ as locust_version  # noqa: E402
from locust.env import Environment  # noqa: E402
from locust.runners import WORKER_REPORT_INTERVAL  # noqa: E402
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV, StatsCSVFileWriter  # noqa: E402

from bench import results  # noqa: E402
from bench.collect import SATURATION_PERCENT, Collector, Recorder  # noqa: E402
from bench.config import BenchConfig  # noqa: E402
from bench.distributed import MasterLink, setup_logging  # noqa: E402
from bench.endpoint import fetch_metrics  # noqa: E402
from mme.stats import percentile  # noqa: E402
from bench.shapes import shape_for  # noqa: E402
from bench.users import STATE, BenchUser  # noqa: E402
from mme.errors import MmeError  # noqa: E402
from mme.progress import Reporter  # noqa: E402

DRIVER_TICK_S = 0.05
LOCAL_DRAIN_S = 0.2
STOP_GRACE_S = 2.0  # users finish the request in flight when the run stops, up to this long
METRICS_TIMEOUT_S = 5.0
FINALS_TIMEOUT_S = 10.0
LOCUST_CSV_PREFIX = "locust"


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host if host not in ("*", "0.0.0.0") else "", 0))
        return sock.getsockname()[1]


class BenchRun:
    def __init__(self, config: BenchConfig) -> None:
        self.config = config
        self.run_dir = Path(config.run_dir)
        self.plan = config.load_plan
        self.reporter = Reporter(quiet=config.quiet)
        self.stop_reason: str | None = None
        self.extra: dict = {}
        self._wake = Event()
        self._reported: set[int] = set()
        self._snapshots: list[gevent.Greenlet] = []
        self._reports: list[gevent.Greenlet] = []
        self.runner = None
        self._start_greenlet: gevent.Greenlet | None = None
        self._worker_processes: list[subprocess.Popen] = []
        self.collector: Collector | None = None
        self.last_snapshot: dict | None = None
        self.metrics_enabled = False
        self.started_at = _utc_now()
        self.environment = Environment(user_classes=[BenchUser], host=config.endpoint_url,
                                       stop_timeout=min(STOP_GRACE_S, config.timeout_s))
        self.recorder: Recorder | None = None
        self.link: MasterLink | None = None
        self._stop_t = 0.0  # run time when the driver stopped
        self._csv: tuple[StatsCSVFileWriter, gevent.Greenlet] | None = None

    # -- control ---------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            if reason == "interrupted":
                self.reporter.info("==> interrupted: stopping the users and saving what was measured")
        self._wake.set()

    def _on_failure(self, _source: object = None) -> None:
        if self.config.stop_on_failure:
            self.request_stop("stop-on-failure")

    def _on_worker_error(self, worker: str, message: str) -> None:
        self.extra.setdefault("worker_errors", []).append({"worker": worker, "message": message})
        print(f"mme: error: worker {worker}: {message}", file=sys.stderr)
        self.request_stop("worker-error")

    # -- runners ---------------------------------------------------------------------------
    def _create_runner(self):
        config = self.config
        if not config.distributed:
            runner = self.runner = self.environment.create_local_runner()
            STATE.configure(config)
            STATE.watch(self.environment)
            self.recorder = Recorder(on_failure=self._on_failure)
            self.environment.events.request.add_listener(self.recorder.on_request)
            gevent.spawn(self.recorder.run_cpu_sampler, gevent.sleep)
            return runner
        port = config.master_port or _free_port(config.master_bind_host)
        runner = self.runner = self.environment.create_master_runner(config.master_bind_host, port)
        self.link = MasterLink(self.environment, runner, config, self._on_failure, self._on_worker_error)
        self.extra["master"] = f"{config.master_bind_host}:{port}"
        root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
        for _ in range(config.local_workers):
            self._worker_processes.append(subprocess.Popen(
                [sys.executable, "-m", "bench.worker", "--master-host", "127.0.0.1", "--master-port", str(port), "--managed"],
                env=env))
        expected = config.generators
        if config.expect_workers:
            self.reporter.info(f"==> waiting for {config.expect_workers} remote worker(s): "
                               f"mme bench-worker --master-host <this host> --master-port {port}")
        deadline = time.monotonic() + config.worker_wait_s
        while runner.worker_count < expected or len(self.link.configured) < expected:
            if self.stop_reason is not None:
                return runner
            for process in self._worker_processes:
                if process.poll() is not None:
                    raise MmeError(f"a local worker process exited with {process.returncode} before the run started")
            if time.monotonic() > deadline:
                raise MmeError(f"only {runner.worker_count} of {expected} workers connected within "
                               f"{config.worker_wait_s:g} s (master at {config.master_bind_host}:{port})")
            gevent.sleep(0.1)
        return runner

    def _start_users(self, runner, users: int, spawn_rate: float) -> None:
        if self.link is None:
            runner.start(users, spawn_rate)
            return
        # MasterRunner.start blocks for the whole ramp: run it aside, and let a newer stage replace it.
        if self._start_greenlet is not None and not self._start_greenlet.ready():
            self._start_greenlet.kill(block=True)
        self._start_greenlet = gevent.spawn(runner.start, users, spawn_rate)

    # -- stages ----------------------------------------------------------------------------
    def _drain_local(self) -> None:
        if self.recorder is not None and self.collector is not None:
            records, cpu = self.recorder.drain()
            self.collector.add(self.recorder.worker, records)
            self.collector.add_cpu(cpu)

    def _snapshot(self, stage: int, at: str) -> None:
        t = time.time() - self.collector.t0_wall
        snapshot = fetch_metrics(self.config.endpoint_url, METRICS_TIMEOUT_S)
        if snapshot is None:
            self.extra["endpoint_metrics_missed"] = self.extra.get("endpoint_metrics_missed", 0) + 1
            return
        self.last_snapshot = snapshot
        results.append_endpoint_metrics(self.run_dir, stage, t, snapshot, at=at)

    def _take_snapshot(self, stage: int, at: str) -> None:
        if self.metrics_enabled:
            self._snapshots = [g for g in self._snapshots if not g.ready()]
            self._snapshots.append(gevent.spawn(self._snapshot, stage, at))

    def _stage_ended(self, stage: int, t: float) -> None:
        self._take_snapshot(stage, "end")
        self._write_stages(t)
        lag = LOCAL_DRAIN_S + 0.1 if self.link is None else WORKER_REPORT_INTERVAL + 0.5
        self._reports.append(gevent.spawn_later(lag, self._stage_report, stage, True))

    def _stage_report(self, stage: int, may_stop: bool) -> None:
        if stage in self._reported or self.collector is None:
            return
        self._reported.add(stage)
        self._drain_local()
        stats = self.collector.stats.get(stage)
        span = next((s for s in self.collector.stages if s.stage == stage), None)
        if stats is None or span is None:
            return
        end_t = span.end_t if span.end_t is not None else span.start_t
        duration = max(end_t - span.start_t, 1e-9)
        ok = sorted(stats.latencies_ok)
        p95 = percentile(ok, 95) or 0.0  # linear, as `mme report` computes it
        cpu = self.collector.stage_records(self.plan.open_loop, end_t)
        cpu_max = next((r.generator_cpu_max for r in cpu if r.stage == stage), 0.0)
        users = stats.peak_users if self.plan.open_loop else span.users
        self.reporter.info(
            f"  stage {stage + 1}/{len(self.plan.stages)} done  {span.start_t:6.1f}-{end_t:6.1f} s  users {users:4d}  "
            f"{stats.requests:6d} req  {stats.requests / duration:7.1f} req/s  p50 {percentile(ok, 50) or 0.0:7.1f} ms  "
            f"p95 {p95:7.1f} ms  failures {stats.failures}  generator cpu max {cpu_max:.0f}%"
            + ("  SATURATED" if cpu_max > SATURATION_PERCENT else ""))
        limit = self.config.max_p95_ms
        if limit is not None and ok and p95 > limit:
            self.extra.setdefault("max_p95_exceeded", {"stage": stage, "p95_ms": round(p95, 3), "limit_ms": limit})
            if may_stop:
                self.request_stop("max-p95-ms")

    def _progress(self, run_time: float, stage: int, runner, elapsed: float) -> None:
        window = self.collector.take_window()
        ok = sorted(r.latency_ms for r in window if r.ok)
        failures = sum(1 for r in window if not r.ok)
        recent_cpu = [s.percent for s in self.collector.cpu if s.end_wall >= time.time() - max(elapsed, 1.0)]
        users = runner.user_count
        label = f"in flight {max((r.users for r in window), default=0)}" if self.plan.open_loop else f"users {users}"
        self.reporter.info(
            f"  [{run_time:6.1f} s] stage {stage + 1}/{len(self.plan.stages)}  {label}  "
            f"{len(window) / max(elapsed, 1e-9):7.1f} req/s  p95 {percentile(ok, 95) or 0.0:7.1f} ms  failures {failures}  "
            f"cpu {max(recent_cpu, default=0.0):.0f}%")

    def _write_stages(self, now_t: float) -> None:
        results.write_stages(self.run_dir, self.collector.stage_records(self.plan.open_loop, now_t))

    # -- the run ---------------------------------------------------------------------------
    def _run_info(self, ended: bool) -> results.RunInfo:
        config = self.config
        models_loaded = None
        if self.last_snapshot is not None:
            gauges = self.last_snapshot.get("gauges") or {}
            loaded = gauges.get("LoadedModelCount")
            if loaded is None and isinstance(self.last_snapshot.get("loaded_models"), list):
                loaded = len(self.last_snapshot["loaded_models"])
            models_loaded = int(loaded) if loaded is not None else None
        return results.RunInfo(
            run_id=config.run_id, endpoint=config.endpoint,
            endpoint_url=config.endpoint_url if config.custom_url else None, region=config.region, mode=config.mode,
            model=config.model, format=config.format, instance_type=config.instance_type, copies=len(config.targets),
            target_distribution=config.distribution if config.targets else "uniform", client=config.client,
            workers=config.generators, shape=config.shape, content_type=config.content_type,
            payload_bytes=len(config.payload), started_at=self.started_at, ended_at=_utc_now() if ended else None,
            stopped_reason=self.stop_reason if ended else None, models_loaded=models_loaded, extra=self._extra(),
        )

    def _extra(self) -> dict:
        config = self.config
        extra = {
            "payload_source": config.payload_source, "accept": config.accept, "credentials": config.credentials_note,
            "wait_s": [config.wait_min_s, config.wait_max_s], "plan": self.plan.to_json(),
            "time_scale": config.time_scale, "timeout_s": config.timeout_s, "stop_on_failure": config.stop_on_failure,
            "max_p95_ms": config.max_p95_ms, "targets": list(config.targets[:5]) + (["..."] if len(config.targets) > 5 else []),
            "endpoint_metrics": self.metrics_enabled, "locust_version": locust_version,
            "saturation_threshold_percent": SATURATION_PERCENT,
        }
        if self.plan.open_loop:
            extra["open_loop"] = {"rate": self.plan.rate, "max_inflight": config.max_inflight, **self._open_loop_counts()}
        if self.collector is not None:
            total = self.collector.total
            extra.update(requests=total.requests, failures=total.failures, generators=sorted(self.collector.workers))
            if self.collector.first_failure is not None:
                f = self.collector.first_failure
                extra["first_failure"] = {"t": round(f.t, 3), "stage": f.stage, "users": f.users, "target": f.target,
                                          "status": f.status, "error": f.error, "worker": f.worker}
        extra.update(self.extra)
        return extra

    def _open_loop_counts(self) -> dict:
        parts = list(self.link.open_loop.values()) if self.link is not None else [STATE.open_loop.as_dict()]
        return {"scheduled": sum(p.get("scheduled", 0) for p in parts),
                "late_starts": sum(p.get("late_starts", 0) for p in parts),
                "max_lateness_ms": max((p.get("max_lateness_ms", 0.0) for p in parts), default=0.0)}

    def run(self) -> int:
        config = self.config
        self._run_info(ended=False).write(self.run_dir)
        try:
            runner = self._create_runner()
            baseline = None
            if config.custom_url:
                baseline = fetch_metrics(config.endpoint_url, METRICS_TIMEOUT_S), time.time()
                self.metrics_enabled = baseline[0] is not None
            self._drive(runner, baseline if self.metrics_enabled else None)
        finally:
            self._finish(self.runner)
        return 0

    def _drive(self, runner, baseline: tuple[dict, float] | None = None) -> None:
        """Run the plan. ``baseline``: the endpoint's metrics and the wall time they were taken,
        before the first stage (saved as stage -1, so the first stage's counts are its own)."""
        if self.stop_reason is not None:
            return
        plan, config = self.plan, self.config
        shape = shape_for(plan, schedulers=config.generators)
        shape.runner = runner
        csv_writer = StatsCSVFileWriter(self.environment, PERCENTILES_TO_REPORT, str(self.run_dir / LOCUST_CSV_PREFIX))
        self._csv = (csv_writer, gevent.spawn(csv_writer.stats_writer))
        shape.reset_time()
        t0_wall = time.time()
        self.collector = Collector(self.run_dir, t0_wall, exact_users=self.link is None,
                                   on_failure=self._on_failure)
        if self.link is not None:
            self.link.collector = self.collector
        if baseline is not None:
            self.last_snapshot = baseline[0]
            results.append_endpoint_metrics(self.run_dir, -1, baseline[1] - t0_wall, baseline[0], at="start")
        mode = f"{config.mode}-model, {len(config.targets)} target(s) {config.distribution}" if config.targets else "single model"
        self.reporter.info(f"==> bench {config.run_id}: {config.endpoint} at {config.endpoint_url} ({mode}); shape "
                           f"{config.shape} {plan.duration_s:g} s; client {config.client}; {config.generators} generator(s)")
        stage, last_tick = None, None
        next_drain, next_progress, last_progress = 0.0, config.progress_interval_s, 0.0
        # Endpoint metrics within a stage too, so an endpoint that dies mid-run still leaves
        # figures up to its last good snapshot.
        next_snapshot = config.metrics_interval_s
        while self.stop_reason is None:
            run_time = shape.get_run_time()
            tick = shape.tick()
            if tick is None:
                self.stop_reason = "completed"
                break
            index = plan.stage_index(run_time)
            if index != stage:
                if stage is not None:
                    self._stage_ended(stage, run_time)
                s = plan.stages[index]
                self.collector.begin_stage(index, run_time, s.users, s.spawn_rate)
                stage = index
            if tick != last_tick:
                self._start_users(runner, *tick)
                last_tick = tick
            if self.link is not None:
                self.collector.note_users(run_time, runner.user_count)
                if runner.worker_count == 0 and run_time > 1.0:
                    self.request_stop("workers-lost")
            if run_time >= next_drain:
                self._drain_local()
                self.collector.flush()
                next_drain = run_time + LOCAL_DRAIN_S
            if run_time >= next_snapshot:
                self._take_snapshot(stage, "during")
                next_snapshot = run_time + config.metrics_interval_s
            if run_time >= next_progress:
                self._progress(run_time, stage, runner, run_time - last_progress)
                last_progress, next_progress = run_time, run_time + config.progress_interval_s
            self._wake.wait(DRIVER_TICK_S)
            self._wake.clear()
        self._stop_t = shape.get_run_time()
        if stage is not None:
            self.collector.end_stage(self._stop_t)
            self._stage_ended(stage, self._stop_t)

    def _finish(self, runner) -> None:
        collector = self.collector
        if self.stop_reason is None:
            self.stop_reason = "error"
        if runner is not None:
            if self._start_greenlet is not None:
                self._start_greenlet.kill(block=True)
            with gevent.Timeout(STOP_GRACE_S + 15, False):
                runner.stop()
            if self.link is not None and collector is not None and not self.link.wait_for_finals(FINALS_TIMEOUT_S):
                self.reporter.warn("some workers sent no final records; requests.csv may miss their last seconds")
        if collector is not None:
            self._drain_local()
            gevent.joinall(self._snapshots, timeout=METRICS_TIMEOUT_S + 1)
            gevent.killall(self._snapshots + self._reports)
            for span in collector.stages:
                self._stage_report(span.stage, may_stop=False)
            collector.close()
            self._write_stages(self._stop_t)
            self._write_locust_csvs()
        self._run_info(ended=True).write(self.run_dir)
        if self.link is not None:
            # Workers that reported 'client_stopped' are off the master's list until they re-announce
            # themselves; tell every worker that ever connected to quit.
            for client_id in self.link.connected:
                runner.send_message("quit", None, client_id=client_id)
        if runner is not None:
            runner.quit()
        for process in self._worker_processes:
            try:
                process.wait(timeout=10 if collector is not None else 0.5)
            except subprocess.TimeoutExpired:
                process.terminate()
                process.wait(timeout=10)
        STATE.close()
        self._summary()

    def _write_locust_csvs(self) -> None:
        if self._csv is None:
            return
        writer, greenlet = self._csv
        greenlet.kill(block=True)
        writer.close_files()
        final = StatsCSV(self.environment, PERCENTILES_TO_REPORT)
        with open(self.run_dir / f"{LOCUST_CSV_PREFIX}_stats.csv", "w", newline="") as fh:
            final.requests_csv(csv.writer(fh))
        with open(self.run_dir / f"{LOCUST_CSV_PREFIX}_failures.csv", "w", newline="") as fh:
            final.failures_csv(csv.writer(fh))

    def _summary(self) -> None:
        collector = self.collector
        if collector is None:
            self.reporter.info(f"==> stopped ({self.stop_reason}) before any request was sent")
            return
        total = collector.total
        ok = sorted(total.latencies_ok)
        duration = max(self._stop_t, 1e-9)
        self.reporter.info(
            f"==> {self.stop_reason} after {duration:.1f} s: {total.requests} requests, {total.failures} failed; "
            f"p50 {percentile(ok, 50) or 0.0:.1f} ms, p95 {percentile(ok, 95) or 0.0:.1f} ms, p99 {percentile(ok, 99) or 0.0:.1f} ms; "
            f"{total.requests / duration:.1f} req/s")
        if self.plan.open_loop:
            counts = self._open_loop_counts()
            if counts["late_starts"]:
                self.reporter.warn(f"{counts['late_starts']} of {counts['scheduled']} open-loop arrivals started late "
                                   f"(up to {counts['max_lateness_ms']:.0f} ms; concurrency cap {self.config.max_inflight} "
                                   "or a busy generator): the endpoint did not keep up with the offered rate")
        saturated = [r.stage for r in collector.stage_records(self.plan.open_loop, duration) if r.saturated]
        if saturated:
            self.reporter.warn(
                f"a load generator used more than {SATURATION_PERCENT:.0f}% of a core in stage(s) "
                f"{', '.join(str(s + 1) for s in saturated)} (saturated=1 in stages.csv): latencies there include the "
                "generator's own queueing; add --workers" + (" or use --client fast" if self.config.client == "boto3" else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.run")
    parser.add_argument("--config", required=True, type=Path)
    args = parser.parse_args(argv)
    setup_logging("locust")
    config = BenchConfig.read(args.config)
    bench = BenchRun(config)
    gevent.signal_handler(signal.SIGINT, bench.request_stop, "interrupted")
    gevent.signal_handler(signal.SIGTERM, bench.request_stop, "terminated")
    try:
        return bench.run()
    except MmeError as exc:
        print(f"mme: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
