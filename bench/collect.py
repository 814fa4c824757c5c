"""From ``events.request`` to requests.csv, across processes.

Every generator process (the local runner, or each worker) keeps a :class:`Recorder`: it
listens to ``events.request`` and samples its own CPU. A worker ships what it recorded with
each ``report_to_master`` (every 3 s) and once more when its users stop; the master receives
them in ``worker_report`` / a custom message. The :class:`Collector` (in the local runner or
the master) turns raw samples into :class:`RequestRecord` rows with the stage and user count
of the moment they were sent, writes them as they come, and keeps the per-stage latencies the
stop conditions and progress lines need: percentiles are exact across workers.
"""

from __future__ import annotations

import os
import socket
import time
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import psutil

from bench.results import RequestRecord, RequestWriter, StageRecord
from mme.stats import percentile

CPU_SAMPLE_S = 0.5
SATURATION_PERCENT = 90.0

# (sent_at wall time, target, status, error, users on this generator when sent, latency_ms, message, cut_off,
#  cold: 1/0, None when the endpoint does not say)
RawRecord = tuple


def generator_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class CpuSample:
    worker: str
    end_wall: float  # when the sample was taken
    interval_s: float  # the span it covers, ending at end_wall
    percent: float  # of one core


class Recorder:
    """Per generator process: raw request samples and CPU samples, drained by the owner."""

    def __init__(self, on_failure: Callable[[RawRecord], None] | None = None) -> None:
        self.worker = generator_id()
        self.records: list[RawRecord] = []
        self.cpu: list[CpuSample] = []
        self._on_failure = on_failure
        self._process = psutil.Process()
        self._process.cpu_percent(None)
        self._last_sample = time.time()

    def on_request(self, request_type=None, name=None, response_time=None, response_length=None, exception=None,
                   context=None, **_kw) -> None:
        bench = (context or {}).get("bench")
        if bench is None:
            return
        sent_at, target, status, error, users, message, cut_off, cold = bench
        raw = (sent_at, target, status, error, users, response_time, message, cut_off, cold)
        self.records.append(raw)
        if error and not cut_off and self._on_failure is not None:
            self._on_failure(raw)

    def sample_cpu(self) -> CpuSample:
        now = time.time()
        sample = CpuSample(self.worker, now, now - self._last_sample, self._process.cpu_percent(None))
        self._last_sample = now
        self.cpu.append(sample)
        return sample

    def drain(self) -> tuple[list[RawRecord], list[CpuSample]]:
        records, cpu = self.records, self.cpu
        self.records, self.cpu = [], []
        return records, cpu

    def run_cpu_sampler(self, sleep: Callable[[float], None]) -> None:
        while True:
            sleep(CPU_SAMPLE_S)
            self.sample_cpu()


@dataclass
class StageStats:
    requests: int = 0  # answered or failed, cut-offs not included
    failures: int = 0
    cut_off: int = 0  # still in flight when the drain ended
    latencies_ok: list[float] = field(default_factory=list)
    peak_users: int = 0
    errors: Counter = field(default_factory=Counter)  # (error, message, target) -> failures
    cold: int = 0  # answered requests that waited for their model to load (the endpoint said so)
    warm_latencies: list[float] = field(default_factory=list)  # successful requests the endpoint called warm

    def p(self, q: float) -> float | None:
        return percentile(self.latencies_ok, q)


@dataclass
class StageSpan:
    stage: int
    start_t: float
    end_t: float | None
    users: int
    spawn_rate: float


class Collector:
    """Raw samples in, requests.csv rows and per-stage statistics out (master or local runner)."""

    def __init__(self, run_dir, t0_wall: float, exact_users: bool,
                 on_failure: Callable[[RequestRecord], None] | None = None) -> None:
        self._writer = RequestWriter(run_dir)
        self.t0_wall = t0_wall
        self.exact_users = exact_users  # local runner: the record's own count is the run's
        self.on_failure = on_failure
        self.stages: list[StageSpan] = []
        self._stage_starts: list[float] = []
        self.stats: dict[int, StageStats] = {}
        self._timeline_t: list[float] = []
        self._timeline_users: list[int] = []
        self._pending: list[RequestRecord] = []
        self.cpu: list[CpuSample] = []
        self.workers: set[str] = set()
        self.total = StageStats()
        self.first_failure: RequestRecord | None = None
        self.window: list[RequestRecord] = []  # since the last progress line

    # -- time lines ------------------------------------------------------------------------
    def begin_stage(self, stage: int, t: float, users: int, spawn_rate: float) -> None:
        if self.stages and self.stages[-1].end_t is None:
            self.stages[-1].end_t = t
        self.stages.append(StageSpan(stage, t, None, users, spawn_rate))
        self._stage_starts.append(t)
        self.stats.setdefault(stage, StageStats())

    def end_stage(self, t: float) -> None:
        if self.stages and self.stages[-1].end_t is None:
            self.stages[-1].end_t = t

    def note_users(self, t: float, users: int) -> None:
        if not self._timeline_users or self._timeline_users[-1] != users:
            self._timeline_t.append(t)
            self._timeline_users.append(users)

    def _stage_at(self, t: float) -> int:
        if not self.stages:
            return 0
        return self.stages[max(0, bisect_right(self._stage_starts, t) - 1)].stage

    def _users_at(self, t: float) -> int:
        i = bisect_right(self._timeline_t, t) - 1
        return self._timeline_users[i] if i >= 0 else 0

    # -- samples ---------------------------------------------------------------------------
    def add(self, worker: str, raws: list[RawRecord]) -> None:
        self.workers.add(worker)
        for sent_at, target, status, error, users, latency_ms, message, cut_off, cold in raws:
            t = sent_at - self.t0_wall
            if not self.exact_users:  # the master's count lags spawning a little; a worker's own is a floor
                users = max(users, self._users_at(t))
            record = RequestRecord(t=t, stage=self._stage_at(t), users=users, target=target, latency_ms=latency_ms,
                                   ok=0 if error else 1, status=status, error=error, worker=worker, message=message,
                                   cut_off=cut_off, cold=cold)
            self._pending.append(record)
            self.window.append(record)
            for stats in (self.stats.setdefault(record.stage, StageStats()), self.total):
                stats.peak_users = max(stats.peak_users, users)
                if cut_off:
                    stats.cut_off += 1
                    continue
                stats.requests += 1
                stats.cold += cold or 0
                if error:
                    stats.failures += 1
                    stats.errors[(error, message, target)] += 1
                else:
                    stats.latencies_ok.append(latency_ms)
                    if cold == 0:
                        stats.warm_latencies.append(latency_ms)
            if cut_off:
                continue
            if error and self.first_failure is None:
                self.first_failure = record
                if self.on_failure is not None:
                    self.on_failure(record)

    def add_cpu(self, samples: list[CpuSample]) -> None:
        self.cpu.extend(samples)

    def flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            self._writer.write(pending)

    def close(self) -> None:
        self.flush()
        self._writer.close()

    def take_window(self) -> list[RequestRecord]:
        window, self.window = self.window, []
        return window

    # -- stages.csv ------------------------------------------------------------------------
    def stage_records(self, open_loop: bool, now_t: float) -> list[StageRecord]:
        rows = []
        for span in self.stages:
            end_t = span.end_t if span.end_t is not None else now_t
            overlapping = [s.percent for s in self.cpu
                           if s.end_wall - self.t0_wall >= span.start_t and s.end_wall - s.interval_s - self.t0_wall <= end_t]
            cpu_max = max(overlapping, default=0.0)
            cpu_mean = sum(overlapping) / len(overlapping) if overlapping else 0.0
            users = self.stats.get(span.stage, StageStats()).peak_users if open_loop else span.users
            rows.append(StageRecord(stage=span.stage, start_t=round(span.start_t, 3), end_t=round(end_t, 3),
                                    users=users, spawn_rate=span.spawn_rate, generator_cpu_max=round(cpu_max, 1),
                                    generator_cpu_mean=round(cpu_mean, 1),
                                    saturated=int(cpu_max > SATURATION_PERCENT)))
        return rows
