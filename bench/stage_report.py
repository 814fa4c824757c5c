"""What ``bench.run`` prints while a run goes: a progress line every ``--progress-interval``,
a report line for each finished stage (and the ``--max-p95-ms`` check, which may stop the
run), and the closing summary with its open-loop and saturation warnings. Reads the run's
``bench.collect.Collector``; writes nothing but the console and ``extra["max_p95_exceeded"]``.

Part of the load generator process: import it only after gevent's monkey patching.
"""

from __future__ import annotations

import time
from typing import Callable

import gevent

from collections import Counter

from bench.collect import SATURATION_PERCENT, Collector
from bench.config import BenchConfig
from bench.stages import LoadPlan
from bench.summary_records import NONE, top_errors, top_errors_text
from mme.progress import Reporter
from mme.stats import percentile


def ms(value: float | None) -> str:
    return NONE if value is None else f"{value:.1f} ms"


def top_errors_line(reasons: Counter, n: int = 3) -> str:
    """The most common failures of ``reasons`` ((error, message, target) -> count), for the console."""
    return top_errors_text(top_errors(reasons, n))


class StageReporter:
    """``collector`` is set when the run starts measuring; until then nothing is reported."""

    def __init__(self, config: BenchConfig, plan: LoadPlan, reporter: Reporter, extra: dict,
                 request_stop: Callable[[str], None], drain: Callable[[], None],
                 in_flight: Callable[[float, float], int | None] | None = None) -> None:
        self.config = config
        self.plan = plan
        self.reporter = reporter
        self.extra = extra
        self._request_stop = request_stop
        self._drain = drain  # bring the local runner's records into the collector first
        # requests sent between two run times still unanswered; the callable gives None while it
        # cannot tell yet (workers that have not reported since); no callable: never waits
        self._in_flight = in_flight
        self.collector: Collector | None = None
        self._reported: set[int] = set()
        self._reports: list[gevent.Greenlet] = []

    def stage_ended(self, stage: int, lag: float) -> None:
        """Report the stage once every request sent in it has answered and been recorded (after
        ``lag`` seconds for the records to arrive; with workers, once each has reported since the
        stage ended), so the line counts what the report counts; at most the request timeout
        (plus ``lag``) after the stage ended."""
        self._reports.append(gevent.spawn(self._report_when_answered, stage, lag))

    def _report_when_answered(self, stage: int, lag: float) -> None:
        gevent.sleep(lag)
        span = next((s for s in self.collector.stages if s.stage == stage), None) if self.collector else None
        if span is not None and span.end_t is not None and self._in_flight is not None:
            deadline = time.monotonic() + self.config.client.timeout_s + lag  # workers report every few seconds
            while self._in_flight(span.start_t, span.end_t) != 0 and time.monotonic() < deadline:
                gevent.sleep(0.1)
        self.stage_report(stage, True)

    def final_reports(self) -> None:
        """At the end of the run: every stage not reported yet, without stopping anything."""
        gevent.killall(self._reports)
        assert self.collector is not None, "final reports before the run started measuring"
        for span in self.collector.stages:
            self.stage_report(span.stage, may_stop=False)

    def stage_report(self, stage: int, may_stop: bool) -> None:
        if stage in self._reported or self.collector is None:
            return
        self._reported.add(stage)
        self._drain()
        stats = self.collector.stats.get(stage)
        span = next((s for s in self.collector.stages if s.stage == stage), None)
        if stats is None or span is None:
            return
        end_t = span.end_t if span.end_t is not None else span.start_t
        duration = max(end_t - span.start_t, 1e-9)
        ok = sorted(stats.latencies_ok)
        p95 = percentile(ok, 95)  # linear, as `mme report` computes it
        cpu = self.collector.stage_records(self.plan.open_loop, end_t)
        cpu_max = next((r.generator_cpu_max for r in cpu if r.stage == stage), 0.0)
        users = stats.peak_users if self.plan.open_loop else span.users
        pending = self._in_flight(span.start_t, end_t) if self._in_flight is not None and span.end_t is not None else 0
        self.reporter.info(
            f"  stage {stage + 1}/{len(self.plan.stages)} done  {span.start_t:6.1f}-{end_t:6.1f} s  users {users:4d}  "
            f"{stats.requests:6d} req  {stats.requests / duration:7.1f} req/s  p50 {ms(percentile(ok, 50)):>10}  "
            f"p95 {ms(p95):>10}  failures {stats.failures}"
            + (f"  cut off {stats.cut_off}" if stats.cut_off else "")
            + (f"  cold {stats.cold}, warm p95 {ms(percentile(sorted(stats.warm_latencies), 95))}"
               if stats.cold else "")
            + (f"  ({pending} still in flight, not counted yet)" if pending
               else "  (workers' latest counts not in yet)" if pending is None else "")
            + f"  generator cpu max {cpu_max:.0f}%" + ("  SATURATED" if cpu_max > SATURATION_PERCENT else ""))
        if stats.failures:
            self.reporter.info(f"    failures: {top_errors_line(stats.errors)}")
        limit = self.config.stops.max_p95_ms
        if limit is not None and p95 is not None and p95 > limit:
            self.extra.setdefault("max_p95_exceeded", {"stage": stage, "p95_ms": round(p95, 3), "limit_ms": limit})
            if may_stop:
                self._request_stop("max-p95-ms")

    def progress(self, run_time: float, stage: int, runner, elapsed: float) -> None:
        collector = self.collector
        assert collector is not None, "progress before the run started measuring"
        window = [r for r in collector.take_window() if not r.cut_off]
        ok = sorted(r.latency_ms for r in window if r.ok)
        failures = sum(1 for r in window if not r.ok)
        recent_cpu = [s.percent for s in collector.cpu if s.end_wall >= time.time() - max(elapsed, 1.0)]
        users = runner.user_count
        label = f"in flight {max((r.users for r in window), default=0)}" if self.plan.open_loop else f"users {users}"
        self.reporter.info(
            f"  [{run_time:6.1f} s] stage {stage + 1}/{len(self.plan.stages)}  {label}  "
            f"{len(window) / max(elapsed, 1e-9):7.1f} req/s  p95 {ms(percentile(ok, 95)):>10}  failures {failures}  "
            f"cpu {max(recent_cpu, default=0.0):.0f}%")

    def summary(self, stop_reason: str | None, stop_t: float, open_loop_counts: Callable[[], dict]) -> None:
        collector = self.collector
        if collector is None:
            self.reporter.info(f"==> stopped ({stop_reason}) before any request was sent")
            return
        total = collector.total
        ok = sorted(total.latencies_ok)
        duration = max(stop_t, 1e-9)
        self.reporter.info(
            f"==> {stop_reason} after {duration:.1f} s: {total.requests} requests, {total.failures} failed"
            + (f", {total.cut_off} cut off by the end of the drain" if total.cut_off else "")
            + f"; p50 {ms(percentile(ok, 50))}, p95 {ms(percentile(ok, 95))}, p99 {ms(percentile(ok, 99))}; "
            f"{total.requests / duration:.1f} req/s")
        if total.failures:
            self.reporter.info(f"    most common failures: {top_errors_line(total.errors)}")
        if self.plan.open_loop:
            counts = open_loop_counts()
            if counts["late_starts"]:
                self.reporter.warn(f"{counts['late_starts']} of {counts['scheduled']} open-loop arrivals started late "
                                   f"(up to {counts['max_lateness_ms']:.0f} ms; concurrency cap {self.config.load.max_inflight} "
                                   "or a busy generator): the endpoint did not keep up with the offered rate")
        saturated = [r.stage for r in collector.stage_records(self.plan.open_loop, duration) if r.saturated]
        if saturated:
            self.reporter.warn(
                f"a load generator used more than {SATURATION_PERCENT:.0f}% of a core in stage(s) "
                f"{', '.join(str(s + 1) for s in saturated)} (saturated=1 in stages.csv): latencies there include the "
                "generator's own queueing; add --workers" + (" or use --client fast" if self.config.client.kind == "boto3" else ""))
