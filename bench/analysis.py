"""Per-stage and overall results of one bench run, rebuilt from its saved files: ``analyse``.

A *stage* is one user level of the load shape (one row of ``stages.csv``). For each stage:
the users, requests per second (requests sent in the stage / stage duration), latency
statistics, successes and failures, the load generator's CPU and its ``saturated`` flag,
and where ``endpoint_metrics.jsonl`` exists, what the endpoint did during the stage
(model loads, evictions, cache hits/misses: differences between the snapshot at the end of
the stage and the one before; LoadedModelCount and MemoryUtilization at the stage end).

Definitions (also written into ``summary.json``):

* **Latency statistics are over successful requests** (``ok == 1``). Failed requests are
  fast rejections or timeouts; mixing them in would make latency look better or worse
  than what callers got. Failures are counted separately.
* **Percentiles are exact**, computed from every recorded latency with linear
  interpolation between closest ranks (numpy ``method="linear"``, Hyndman & Fan type 7,
  Excel's PERCENTILE.INC): for sorted values ``x[0..n-1]`` the q-th percentile is at
  position ``h = (n - 1) * q / 100``, i.e. ``x[floor(h)] + (h - floor(h)) * (x[floor(h)+1]
  - x[floor(h)])``. Latencies [10, 20, 30, 40] ms give p50 25, p90 37, p95 38.5, p99 39.7.
* **Requests/s** counts every request sent in the stage, succeeded or not, divided by
  ``end_t - start_t`` of the stage.
* **Max users without failure**: the highest user count among stages that completed (not
  cut short by the end of the run) with requests and no failure, before the first stage
  that had a failure or finished no request at all (``unanswered_stages``: nothing can be
  said of it). **Users at first failure**: the ``users`` column of the earliest failed request.
* **Breaking point**: the first stage with a failed request (its users, failures and requests),
  and the last stage before it that ran to its end with requests and no failure: its users and
  requests/s are the load the endpoint held before it broke.
* **Max error-free throughput**: the highest requests/s of a stage with requests and no
  failure, held at least ``SUSTAINED_MIN_S`` (10 s) and not cut short: a shorter stage is a
  burst, not a throughput the endpoint sustains.
* **Overall p50/p95/p99** are over every successful request of the run; **sustained
  throughput** is every answered request over the run's duration. **Models**: copies
  targeted (the run's), model loads during the run (the endpoint's metrics, where it has
  them) and models resident at the end (its LoadedModelCount), each named as such.
* **Cold requests** waited for their model to load: the local endpoint says so per request
  (``cold`` in requests.csv); for SageMaker they are estimated from latency and CloudWatch's
  ModelLoadingWaitTime where ``mme metrics --run`` saved it (``bench.cold_estimate``).
  ``cold_method`` in summary.json says which. Warm percentiles are over the others.

This module computes the statistics; the rest lives beside it, each name imported from its home:

* ``bench.run_reader``: reading and checking ``run.json``, ``requests.csv``, ``stages.csv``;
* ``bench.endpoint_stages``: endpoint metrics per stage (``EndpointStage``);
* ``bench.summary_records``: the records (``StageSummary``, ``Overall``, ``RunSummary``) and
  the summary's definitions (``PERCENTILES``, ``PERCENTILE_METHOD``, ``LATENCY_OF``...);
* ``bench.summary_io``: writing ``summary.csv`` and ``summary.json`` (``write_summary``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from pathlib import Path

import numpy as np

from bench.cold_estimate import COLD_ESTIMATE_METHOD, estimate_cold
from bench.endpoint_stages import NO_ENDPOINT, EndpointStage, endpoint_by_stage, read_endpoint_snapshots
from bench.results import STAGES_FILE, RunInfo, StageRecord
from bench.run_reader import FirstFailure, StageRequests, read_run_info, read_stage_records, read_stage_requests
from bench.summary_records import (
    COLD_METHOD,
    COMPLETED,
    PERCENTILES,
    Overall,
    SUSTAINED_MIN_S,
    RunSummary,
    StageSummary,
    top_errors,
)
from mme.stats import percentile



def _rate(count: int, duration: float) -> float | None:
    return count / duration if duration > 0 else None


def _stage_summary(record: StageRecord | None, stage: int, reqs: StageRequests | None, partial: bool,
                   endpoint: EndpointStage) -> StageSummary:
    cpu_max: float | None
    cpu_mean: float | None
    if record is not None:
        start_t, end_t, users = record.start_t, record.end_t, record.users
        cpu_max, cpu_mean, saturated = record.generator_cpu_max, record.generator_cpu_mean, bool(record.saturated)
    else:  # in requests.csv only: the run ended before the stage's row was written
        start_t = reqs.first_t if reqs else 0.0
        end_t = reqs.last_end_t if reqs else start_t
        users = reqs.max_users if reqs else 0
        cpu_max = cpu_mean = None
        saturated = False
    duration = max(0.0, end_t - start_t)
    requests = reqs.requests if reqs else 0
    failures = reqs.failures if reqs else 0
    successes = requests - failures
    lat = reqs.latencies if reqs is not None else np.empty(0)
    pct = {q: percentile(lat, q) for q in PERCENTILES}
    errors = "; ".join(f"{code}:{n}" for code, n in reqs.errors.most_common()) if reqs else ""
    return StageSummary(
        stage=stage, users=users, start_t=start_t, end_t=end_t, duration_s=duration,
        requests=requests, successes=successes, failures=failures,
        requests_per_s=_rate(requests, duration), successes_per_s=_rate(successes, duration),
        latency_avg_ms=float(lat.mean()) if lat.size else None,
        latency_min_ms=float(lat.min()) if lat.size else None,
        latency_max_ms=float(lat.max()) if lat.size else None,
        latency_p50_ms=pct[50], latency_p90_ms=pct[90], latency_p95_ms=pct[95], latency_p99_ms=pct[99],
        generator_cpu_max=cpu_max, generator_cpu_mean=cpu_mean, saturated=saturated, partial=partial,
        derived=record is None, errors=errors, cut_off=reqs.cut_off if reqs else 0,
        cold_requests=reqs.cold if reqs else None,
        warm_p50_ms=_p(reqs, "warm", 50), warm_p95_ms=_p(reqs, "warm", 95), warm_p99_ms=_p(reqs, "warm", 99),
        cold_p50_ms=_p(reqs, "cold", 50), cold_max_ms=_p(reqs, "cold", 100), **asdict(endpoint),
    )


def _p(reqs: StageRequests | None, kind: str, q: float) -> float | None:
    if reqs is None or reqs.cold is None:
        return None
    return percentile(reqs.warm_latencies if kind == "warm" else reqs.cold_latencies, q)


def _max_users_without_failure(stages: tuple[StageSummary, ...]) -> int | None:
    best: int | None = None
    for s in stages:
        if s.failures or (not s.requests and not s.partial):
            break
        if s.requests and not s.partial:
            best = s.users if best is None else max(best, s.users)
    return best


def _breaking_point(stages: tuple[StageSummary, ...]) -> dict:
    """The first stage with failures, and the last one before it that ran to its end with requests
    and no failure: the load the endpoint held before it broke (Overall's breaking_* fields)."""
    broken = next((s for s in stages if s.failures), None)
    if broken is None:
        return {}
    held = [s for s in stages if s.stage < broken.stage and s.error_free and not s.partial]
    before = held[-1] if held else None
    return {"breaking_stage": broken.stage, "breaking_users": broken.users, "breaking_failures": broken.failures,
            "breaking_requests": broken.requests, "before_breaking_stage": before.stage if before else None,
            "before_breaking_users": before.users if before else None,
            "before_breaking_rps": before.requests_per_s if before else None}


def _top_errors(by_stage: dict[int, StageRequests]) -> tuple[dict, ...]:
    reasons: Counter = Counter()
    for reqs in by_stage.values():
        reasons.update(reqs.reasons)
    return top_errors(reasons)


def _overall(run: RunInfo, stages: tuple[StageSummary, ...], first: FirstFailure | None,
             min_latency: float | None, endpoint: dict[int, EndpointStage],
             by_stage: dict[int, StageRequests], cold_method: str) -> Overall:
    error_free = [s for s in stages if s.error_free and s.requests_per_s is not None and not s.partial
                  and s.duration_s >= SUSTAINED_MIN_S]
    top = max(error_free, key=lambda s: s.requests_per_s or 0.0, default=None)  # none is None (filtered)
    with_p50 = [s for s in stages if s.latency_p50_ms is not None]
    lowest = min(with_p50, key=lambda s: s.latency_p50_ms or 0.0, default=None)  # none is None (filtered)
    loaded_counts = [e.loaded_model_count for e in endpoint.values() if e.loaded_model_count is not None]
    if run.models_loaded is not None:
        models_loaded, source = run.models_loaded, "run.json"
    elif loaded_counts:
        models_loaded, source = max(loaded_counts), "endpoint metrics"
    else:
        models_loaded, source = None, None
    requests = sum(s.requests for s in stages)
    failures = sum(s.failures for s in stages)
    latencies = np.concatenate([r.latencies for r in by_stage.values()]) if by_stage else np.empty(0)
    duration = (max(s.end_t for s in stages) - min(s.start_t for s in stages)) if stages else 0.0
    loads = [e.model_loads for e in endpoint.values() if e.model_loads is not None]
    told = [r for r in by_stage.values() if r.cold is not None]
    warm = np.concatenate([r.warm_latencies for r in told]) if told else np.empty(0)
    cold = np.concatenate([r.cold_latencies for r in told]) if told else np.empty(0)
    known = bool(told)
    return Overall(
        requests=requests, successes=requests - failures, failures=failures,
        duration_s=duration,
        max_users_without_failure=_max_users_without_failure(stages), failed=failures > 0,
        first_failure_users=first.users if first else None, first_failure_t=first.t if first else None,
        first_failure_error=first.error if first else None,
        max_error_free_rps=top.requests_per_s if top else None,
        max_error_free_rps_users=top.users if top else None, max_error_free_rps_stage=top.stage if top else None,
        lowest_p50_ms=lowest.latency_p50_ms if lowest else None, lowest_p50_users=lowest.users if lowest else None,
        min_latency_ms=min_latency, models_loaded=models_loaded, models_loaded_source=source,
        endpoint=run.endpoint, instance_type=run.instance_type, model=run.model, format=run.format,
        stopped_reason=run.stopped_reason, saturated_stages=tuple(s.stage for s in stages if s.saturated),
        partial=run.stopped_reason != COMPLETED, cut_off=sum(s.cut_off for s in stages),
        failure_rate=failures / requests if requests else None, top_errors=_top_errors(by_stage),
        latency_p50_ms=percentile(latencies, 50), latency_p95_ms=percentile(latencies, 95),
        latency_p99_ms=percentile(latencies, 99), sustained_rps=_rate(requests, duration),
        copies_targeted=run.copies, model_loads=sum(loads) if loads else None,
        unanswered_stages=tuple(s.stage for s in stages if not s.requests),
        cold_requests=sum(r.cold or 0 for r in told) if known else None, cold_method=cold_method if known else None,
        warm_p50_ms=percentile(warm, 50), warm_p95_ms=percentile(warm, 95), warm_p99_ms=percentile(warm, 99),
        cold_p50_ms=percentile(cold, 50), cold_p95_ms=percentile(cold, 95), cold_max_ms=percentile(cold, 100),
        **_breaking_point(stages),
    )


def analyse(run_dir: Path | str) -> RunSummary:
    """Read one run directory and summarise it. Bad input raises a one-line MmeError."""
    run_dir = Path(run_dir)
    run = read_run_info(run_dir)
    warnings: list[str] = []
    estimated_cold = estimate_cold(run_dir, run, warnings)
    by_stage, first = read_stage_requests(run_dir, warnings, estimated_cold)
    cold_method = COLD_METHOD if estimated_cold is None else COLD_ESTIMATE_METHOD
    records = read_stage_records(run_dir)
    if records is None:
        warnings.append(f"no {STAGES_FILE}: stage timing reconstructed from requests; generator CPU unknown")
        records = []
    known = {r.stage: r for r in records}
    unknown = sorted(set(by_stage) - set(known))
    if records and unknown:
        warnings.append(f"requests of stage(s) {', '.join(map(str, unknown))} missing from {STAGES_FILE}: "
                        "timing reconstructed from their requests")
    snapshots = read_endpoint_snapshots(run_dir, warnings)
    endpoint = endpoint_by_stage(snapshots)
    order = sorted(set(known) | set(by_stage))
    ended_early = run.stopped_reason != COMPLETED
    stages = tuple(
        _stage_summary(known.get(i), i, by_stage.get(i), ended_early and i == order[-1], endpoint.get(i, NO_ENDPOINT))
        for i in order
    )
    if ended_early:
        reason = run.stopped_reason or "unknown (run.json was not finalised)"
        warnings.append(f"run stopped before its load shape ended ({reason}): the last stage is partial")
    saturated = [s.stage for s in stages if s.saturated]
    if saturated:
        warnings.append(f"load generator saturated in stage(s) {', '.join(map(str, saturated))}: latency and "
                        "throughput there measure the generator, not the endpoint; add workers")
    if not any(s.requests for s in stages):
        warnings.append("no requests recorded")
    successful = [s.latency_min_ms for s in stages if s.latency_min_ms is not None]
    overall = _overall(run, stages, first, min(successful, default=None), endpoint, by_stage, cold_method)
    if overall.cut_off:
        warnings.append(f"{overall.cut_off} request(s) were still in flight when the drain ended the run: recorded "
                        "as cut off (cut_off in requests.csv), counted in no latency or failure figure")
    return RunSummary(run_dir=run_dir, run=run, stages=stages, overall=overall,
                      has_endpoint_metrics=bool(endpoint), warnings=tuple(warnings))
