"""The load generator process: ``python -m bench.run --config CONFIG.json``.

``mme bench`` checks everything, creates the run directory and starts this in a fresh process
(Locust monkey-patches the standard library on import, which the ``mme`` process must not
suffer). ``BenchRun`` owns the run itself: a Locust Environment used as a library; a driver
that follows the load shape's ``tick()`` (10 times a second, so time-scaled stages shorter
than Locust's 1 s shape tick still happen), marks stage boundaries, starts users and checks
the stop conditions; and the saved results (``bench.results``: run.json, stages.csv, Locust's
CSVs) at the end, however the run ends: shape completed, stop condition, endpoint failures,
Ctrl-C. Its parts, each in its own module:

* ``bench.runners``: the local runner, or master + local worker processes (and remote workers);
* ``bench.endpoint_snapshots``: the endpoint's metrics before, during and at the end of stages;
* ``bench.stage_report``: progress lines, per-stage reports (``--max-p95-ms``) and the summary.
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import csv  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402
from gevent.event import Event  # noqa: E402
from locust import __version__ as locust_version  # noqa: E402
from locust.runners import WORKER_REPORT_INTERVAL  # noqa: E402
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV, StatsCSVFileWriter  # noqa: E402

from bench import results  # noqa: E402
from bench.collect import SATURATION_PERCENT, Collector  # noqa: E402
from bench.config import TOO_MANY_FAILURES, BenchConfig  # noqa: E402
from bench.distributed import setup_logging  # noqa: E402
from bench.endpoint_snapshots import METRICS_TIMEOUT_S, EndpointSnapshots  # noqa: E402, F401
from bench.runners import FINALS_TIMEOUT_S, LoadRunners  # noqa: E402, F401
from bench.shapes import shape_for  # noqa: E402
from mme.process import die_with_parent  # noqa: E402
from bench.stage_report import StageReporter, top_errors_line  # noqa: E402
from bench.users import BenchEnvironment, BenchUser  # noqa: E402
from bench.warmup import warm_up  # noqa: E402
from mme.errors import MmeError  # noqa: E402
from mme.progress import Reporter  # noqa: E402

DRIVER_TICK_S = 0.05
LOCAL_DRAIN_S = 0.2
LOCUST_CSV_PREFIX = "locust"


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class BenchRun:
    def __init__(self, config: BenchConfig) -> None:
        self.config = config
        self.run_dir = config.output.run_dir
        self.plan = config.load.plan
        self.reporter = Reporter(quiet=config.output.quiet)
        self.stop_reason: str | None = None
        self.extra: dict = {}
        self._wake = Event()
        self.collector: Collector | None = None
        self.started_at = _utc_now()
        # The drain: when the run stops, users finish the request in flight, up to drain_s (0: at once).
        self.environment = BenchEnvironment(user_classes=[BenchUser], host=config.endpoint.address.url,
                                            stop_timeout=config.stops.drain_s)
        self.runners = LoadRunners(self.environment, config, self.reporter, self.extra,
                                   self._on_failure, self._on_worker_error)
        self.snapshots = EndpointSnapshots(config.endpoint.address, self.run_dir, self.extra)
        self.stage_reports = StageReporter(config, self.plan, self.reporter, self.extra, self.request_stop,
                                           self._drain_local, self._in_flight)
        self._stop_t = 0.0  # run time when the driver stopped
        self._cut_short = False  # a second interrupt ended the drain
        self._csv: tuple[StatsCSVFileWriter, gevent.Greenlet] | None = None

    # -- control ---------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            if reason in ("interrupted", "terminated"):
                self.reporter.info(f"==> {reason}: no new requests; waiting up to {self.config.stops.drain_s:g} s for "
                                   "those in flight (again to cut the wait short), then saving what was measured")
        elif reason in ("interrupted", "terminated") and not self._cut_short:
            self._cut_short = True
            self.reporter.info("==> stopping at once: requests still in flight are recorded as cut off")
            self.runners.cut_short()
        self._wake.set()

    def _on_failure(self, _source: object = None) -> None:
        if self.config.stops.stop_on_failure:
            self.request_stop("stop-on-failure")

    def _on_worker_error(self, worker: str, message: str) -> None:
        self.extra.setdefault("worker_errors", []).append({"worker": worker, "message": message})
        print(f"mme: error: worker {worker}: {message}", file=sys.stderr)
        self.request_stop("worker-error")

    # -- stages ----------------------------------------------------------------------------
    def _in_flight(self, start_t: float, end_t: float) -> int | None:
        """Requests sent between run times ``start_t`` and ``end_t``, not answered yet: this
        process's, or the workers' as of their latest reports (None: not every worker has
        reported since ``end_t``)."""
        t0 = self.collector.t0_wall if self.collector is not None else 0.0
        if self.runners.link is not None:
            return self.runners.link.in_flight_between(t0 + start_t, t0 + end_t)
        return self.environment.generator.in_flight_between(t0 + start_t, t0 + end_t)

    def _drain_local(self) -> None:
        self.runners.drain_into(self.collector)

    def _stage_ended(self, stage: int, t: float) -> None:
        self.snapshots.take(stage, "end")
        self._write_stages(t)
        lag = LOCAL_DRAIN_S + 0.1 if self.runners.link is None else WORKER_REPORT_INTERVAL + 0.5
        self.stage_reports.stage_ended(stage, lag)

    def _write_stages(self, now_t: float) -> None:
        assert self.collector is not None  # stages end only once the run has its collector
        results.write_stages(self.run_dir, self.collector.stage_records(self.plan.open_loop, now_t))

    # -- the run ---------------------------------------------------------------------------
    def _run_info(self, ended: bool) -> results.RunInfo:
        config, address, targets = self.config, self.config.endpoint.address, self.config.targets
        return results.RunInfo(
            run_id=config.output.run_id, endpoint=address.name, endpoint_url=address.url if address.custom_url else None,
            region=address.region, mode=config.endpoint.mode, model=targets.model, format=config.payload.format,
            instance_type=config.endpoint.instance_type, copies=len(targets.names),
            target_distribution=targets.popularity if targets.names else "uniform", client=config.client.kind,
            workers=config.generators.count, shape=self.plan.kind, content_type=config.payload.content_type,
            payload_bytes=len(config.payload.body), started_at=self.started_at, ended_at=_utc_now() if ended else None,
            stopped_reason=self.stop_reason if ended else None, models_loaded=self.snapshots.models_loaded(),
            extra=self._extra(),
        )

    def _extra(self) -> dict:
        config, stops, names = self.config, self.config.stops, self.config.targets.names
        extra = {
            "payload_source": config.payload.source, "accept": config.client.accept,
            "credentials": config.endpoint.credentials_note, "wait_s": list(config.load.wait_s),
            "plan": self.plan.to_json(), "time_scale": config.load.time_scale, "timeout_s": config.client.timeout_s,
            "stop_on_failure": stops.stop_on_failure, "max_p95_ms": stops.max_p95_ms,
            "targets": list(names[:5]) + (["..."] if len(names) > 5 else []),
            "endpoint_metrics": self.snapshots.enabled, "locust_version": locust_version,
            "saturation_threshold_percent": SATURATION_PERCENT,
        }
        if self.plan.open_loop:
            extra["open_loop"] = {"rate": self.plan.rate, "max_inflight": config.load.max_inflight,
                                  **self.runners.open_loop_counts()}
        if self.collector is not None:
            total = self.collector.total
            extra.update(requests=total.requests, failures=total.failures, cut_off=total.cut_off,
                         drain_s=stops.drain_s, max_failure_rate=stops.max_failure_rate,
                         generators=sorted(self.collector.workers))
            if self.collector.first_failure is not None:
                f = self.collector.first_failure
                extra["first_failure"] = {"t": round(f.t, 3), "stage": f.stage, "users": f.users, "target": f.target,
                                          "status": f.status, "error": f.error, "worker": f.worker}
        if config.targets.mix is not None:
            extra["mix"] = config.targets.mix.to_json()
        extra.update(self.extra)
        return extra

    def run(self) -> int:
        self._run_info(ended=False).write(self.run_dir)
        try:
            runner = self.runners.create(stopping=lambda: self.stop_reason is not None)
            if self.config.load.warmup and self.stop_reason is None:

                self.extra["warmup"] = warm_up(self.config, self.reporter)
            if self.config.in_process is not None:
                self.extra["in_process"] = self.config.in_process.to_dict()
            self.snapshots.fetch_baseline()
            self._drive(runner)
        finally:
            self._finish()
        return self._verdict()

    def _verdict(self) -> int:
        """0, or TOO_MANY_FAILURES (with the reason on stderr) when the failed share is above the limit."""
        if self.collector is None:
            return 0
        total = self.collector.total
        limit = self.config.stops.max_failure_rate
        if not total.requests or total.failures / total.requests <= limit:
            return 0
        share = total.failures / total.requests
        print(f"mme: error: {total.failures} of {total.requests} requests failed ({share:.1%}, above "
              f"--max-failure-rate {limit:.1%}); most common: "
              f"{top_errors_line(total.errors, 1)}", file=sys.stderr)
        return TOO_MANY_FAILURES

    def _drive(self, runner) -> None:
        """Run the plan, from the shape's first tick until it ends or a stop is requested."""
        if self.stop_reason is not None:
            return
        plan, config = self.plan, self.config
        distributed = self.runners.link is not None
        shape = shape_for(plan, schedulers=config.generators.count)
        shape.runner = runner
        csv_writer = StatsCSVFileWriter(self.environment, PERCENTILES_TO_REPORT, str(self.run_dir / LOCUST_CSV_PREFIX))
        self._csv = (csv_writer, gevent.spawn(csv_writer.stats_writer))
        shape.reset_time()
        t0_wall = time.time()
        self.collector = Collector(self.run_dir, t0_wall, exact_users=not distributed, on_failure=self._on_failure)
        self.stage_reports.collector = self.collector
        if self.runners.link is not None:
            self.runners.link.collector = self.collector
        self.snapshots.start(t0_wall)
        targets, address = config.targets, config.endpoint.address
        mode = (f"{config.endpoint.mode}-model, {len(targets.names)} target(s) {targets.popularity}" if targets.names
                else "single model")
        self.reporter.info(f"==> bench {config.output.run_id}: {address.name} at {address.url} ({mode}); shape "
                           f"{plan.kind} {plan.duration_s:g} s; client {config.client.kind}; "
                           f"{config.generators.count} generator(s)")
        stage, last_tick = None, None
        next_drain, next_progress, last_progress = 0.0, config.output.progress_interval_s, 0.0
        # Endpoint metrics within a stage too, so an endpoint that dies mid-run still leaves
        # figures up to its last good snapshot.
        next_snapshot = config.output.metrics_interval_s
        while self.stop_reason is None:
            run_time = shape.get_run_time()
            tick = shape.tick()
            if tick is None:
                self.stop_reason = "completed"
                break
            index = plan.stage_index(run_time)
            assert index is not None  # tick() above ended the loop once the plan was over
            if index != stage:
                if stage is not None:
                    self._stage_ended(stage, run_time)
                s = plan.stages[index]
                self.collector.begin_stage(index, run_time, s.users, s.spawn_rate)
            stage = index
            if tick != last_tick:
                self.runners.start_users(*tick)
                last_tick = tick
            if distributed:
                self.collector.note_users(run_time, runner.user_count)
                if runner.worker_count == 0 and run_time > 1.0:
                    self.request_stop("workers-lost")
            if run_time >= next_drain:
                self._drain_local()
                self.collector.flush()
                next_drain = run_time + LOCAL_DRAIN_S
            if run_time >= next_snapshot:
                self.snapshots.take(stage, "during")
                next_snapshot = run_time + config.output.metrics_interval_s
            if run_time >= next_progress:
                self.stage_reports.progress(run_time, stage, runner, run_time - last_progress)
                last_progress, next_progress = run_time, run_time + config.output.progress_interval_s
            self._wake.wait(DRIVER_TICK_S)
            self._wake.clear()
        self._stop_t = shape.get_run_time()
        if stage is not None:
            self.collector.end_stage(self._stop_t)
            self._stage_ended(stage, self._stop_t)

    def _finish(self) -> None:
        collector = self.collector
        if self.stop_reason is None:
            self.stop_reason = "error"
        self.runners.stop(wait_for_finals=collector is not None)
        if collector is not None:
            self._drain_local()
            if collector.stages:  # after the drain: the last stage's figures include its drained requests
                self.snapshots.take(collector.stages[-1].stage, "end")
            self.snapshots.finish()
            self.stage_reports.final_reports()
            collector.close()
            self._write_stages(self._stop_t)
            self._write_locust_csvs()
        self._run_info(ended=True).write(self.run_dir)
        self.runners.shut_down(patient=collector is not None)
        self.stage_reports.summary(self.stop_reason, self._stop_t, self.runners.open_loop_counts)

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.run")
    parser.add_argument("--config", required=True, type=Path)
    args = parser.parse_args(argv)
    die_with_parent()  # a killed mme bench: SIGTERM (drain, save), then SIGKILL for the whole generator group
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
