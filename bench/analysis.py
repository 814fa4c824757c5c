"""Per-stage and overall results of one bench run, rebuilt from its saved files.

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
  that had a failure. **Users at first failure**: the ``users`` column of the earliest
  failed request.
* **Max error-free throughput**: the highest requests/s of a stage with requests and no
  failure.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from bench.results import (
    ENDPOINT_METRICS_FILE,
    REQUEST_FIELDS,
    REQUESTS_FILE,
    RUN_FILE,
    STAGE_FIELDS,
    STAGES_FILE,
    RunInfo,
    StageRecord,
    read_requests,
    read_stages,
)
from mme.errors import MmeError
from mme.stats import percentile
from mme.fsutil import write_bytes_atomic, write_json_atomic

SUMMARY_SCHEMA_VERSION = 1
SUMMARY_CSV = "summary.csv"
SUMMARY_JSON = "summary.json"
PERCENTILES = (50, 90, 95, 99)
PERCENTILE_METHOD = "linear interpolation between closest ranks (numpy method='linear', Hyndman-Fan type 7)"
LATENCY_OF = "successful requests (ok == 1)"
COMPLETED = "completed"


@dataclass(frozen=True)
class EndpointStage:
    """What the endpoint reported for one stage (differences of its cumulative counts)."""

    model_loads: int | None
    model_evictions: int | None
    cache_hits: int | None
    cache_misses: int | None
    invocations_ok: int | None
    model_latency_avg_ms: float | None  # endpoint-side ModelLatency of the stage's requests
    loaded_model_count: int | None  # gauge at the stage end
    memory_utilization: float | None  # percent, at the stage end
    loads_above_threshold: int | None = None  # loads that left memory above the eviction threshold


NO_ENDPOINT = EndpointStage(None, None, None, None, None, None, None, None)


@dataclass(frozen=True)
class StageSummary:
    stage: int
    users: int
    start_t: float
    end_t: float
    duration_s: float
    requests: int
    successes: int
    failures: int
    requests_per_s: float | None  # None when the stage has no duration
    successes_per_s: float | None
    latency_avg_ms: float | None  # None when no request succeeded
    latency_min_ms: float | None
    latency_max_ms: float | None
    latency_p50_ms: float | None
    latency_p90_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    generator_cpu_max: float | None  # None for stages missing from stages.csv
    generator_cpu_mean: float | None
    saturated: bool  # the generator was the bottleneck: results unreliable
    partial: bool  # cut short by the end of the run (interrupted, stopped on failure...)
    derived: bool  # not in stages.csv: timing reconstructed from its requests
    errors: str  # failures by error code, most frequent first: "ModelError:3; ReadTimeout:1"
    model_loads: int | None = None
    model_evictions: int | None = None
    cache_hits: int | None = None
    cache_misses: int | None = None
    invocations_ok: int | None = None
    model_latency_avg_ms: float | None = None
    loaded_model_count: int | None = None
    memory_utilization: float | None = None
    loads_above_threshold: int | None = None

    @property
    def error_free(self) -> bool:
        return self.requests > 0 and self.failures == 0


STAGE_COLUMNS = tuple(f.name for f in fields(StageSummary))


@dataclass(frozen=True)
class Overall:
    requests: int
    successes: int
    failures: int
    duration_s: float
    max_users_without_failure: int | None  # None: no stage completed without a failure
    failed: bool  # any failed request; False means the endpoint never failed up to the last stage
    first_failure_users: int | None
    first_failure_t: float | None
    first_failure_error: str | None
    max_error_free_rps: float | None
    max_error_free_rps_users: int | None
    max_error_free_rps_stage: int | None
    lowest_p50_ms: float | None
    lowest_p50_users: int | None
    min_latency_ms: float | None
    models_loaded: int | None
    models_loaded_source: str | None  # "run.json" | "endpoint metrics"
    endpoint: str
    instance_type: str | None
    model: str | None
    format: str | None
    stopped_reason: str | None
    saturated_stages: tuple[int, ...]
    partial: bool  # the run did not complete its load shape


@dataclass(frozen=True)
class RunSummary:
    run_dir: Path
    run: RunInfo
    stages: tuple[StageSummary, ...]
    overall: Overall
    has_endpoint_metrics: bool
    warnings: tuple[str, ...]

    @property
    def label(self) -> str:
        """Short name for charts and tables: model, format and instance where known."""
        parts = [p for p in (self.run.model, self.run.format) if p] or [self.run.run_id]
        if self.run.instance_type:
            parts.append(f"({self.run.instance_type})")
        return " ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SUMMARY_SCHEMA_VERSION,
            "run_dir": str(self.run_dir),
            "percentile_method": PERCENTILE_METHOD,
            "latency_of": LATENCY_OF,
            "run": asdict(self.run),
            "overall": _rounded(asdict(self.overall)),
            "stages": [_rounded(asdict(s)) for s in self.stages],
            "has_endpoint_metrics": self.has_endpoint_metrics,
            "warnings": list(self.warnings),
        }


# -- statistics ---------------------------------------------------------------------------


def _rate(count: int, duration: float) -> float | None:
    return count / duration if duration > 0 else None


# -- reading ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _StageRequests:
    latencies: np.ndarray  # successful requests' latencies, ms
    requests: int
    failures: int
    errors: Counter
    first_t: float
    last_end_t: float
    max_users: int


class _Accumulator:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.requests = 0
        self.failures = 0
        self.errors: Counter = Counter()
        self.first_t = math.inf
        self.last_end_t = -math.inf
        self.max_users = 0

    def freeze(self) -> _StageRequests:
        return _StageRequests(np.asarray(self.latencies, dtype=float), self.requests, self.failures, self.errors,
                              self.first_t, self.last_end_t, self.max_users)


@dataclass(frozen=True)
class _FirstFailure:
    t: float
    users: int
    error: str


def _check_header(path: Path, expected: tuple[str, ...]) -> None:
    try:
        with open(path, newline="") as fh:
            header = next(csv.reader(fh), None)
    except FileNotFoundError:
        raise MmeError(f"{path.parent} has no {path.name}; pass a directory written by 'mme bench'") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise MmeError(f"cannot read {path}: {_reason(exc)}") from None
    if header is None:
        raise MmeError(f"{path} is empty (no header row); the run wrote nothing readable")
    missing = [name for name in expected if name not in header]
    if missing:
        raise MmeError(f"{path} is not a bench {path.stem} file: missing column(s) {', '.join(missing)}")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return " ".join(str(exc).split()) or type(exc).__name__


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        if fh.tell() == 0:
            return True
        fh.seek(-1, 2)
        return fh.read(1) == b"\n"


def _line_count(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for _ in fh)


def _read_requests(run_dir: Path, warnings: list[str]) -> tuple[dict[int, _StageRequests], _FirstFailure | None]:
    """Requests grouped by stage. A last row cut short (the generator was killed while
    writing it: no newline at the end of the file) is left out with a warning; any other
    unreadable row is an error."""
    path = run_dir / REQUESTS_FILE
    _check_header(path, REQUEST_FIELDS)
    acc: dict[int, _Accumulator] = {}
    first: _FirstFailure | None = None
    line = 1
    try:
        for line, rec in enumerate(read_requests(run_dir), start=2):
            a = acc.get(rec.stage)
            if a is None:
                a = acc[rec.stage] = _Accumulator()
            a.requests += 1
            a.first_t = min(a.first_t, rec.t)
            a.last_end_t = max(a.last_end_t, rec.t + rec.latency_ms / 1000.0)
            a.max_users = max(a.max_users, rec.users)
            if rec.ok:
                a.latencies.append(rec.latency_ms)
            else:
                a.failures += 1
                error = rec.error or (f"HTTP {rec.status}" if rec.status else "no response")
                a.errors[error] += 1
                if first is None or rec.t < first.t:
                    first = _FirstFailure(rec.t, rec.users, error)
    except (ValueError, TypeError, csv.Error, UnicodeDecodeError, OSError) as exc:
        bad_line = line + 1
        if not isinstance(exc, OSError) and not _ends_with_newline(path) and _line_count(path) == bad_line:
            warnings.append(f"{REQUESTS_FILE} line {bad_line} was cut short (interrupted write): left out")
        else:
            raise MmeError(f"cannot read {path} near line {bad_line}: {_reason(exc)}") from None
    return {stage: a.freeze() for stage, a in acc.items()}, first


def _read_stages(run_dir: Path) -> list[StageRecord] | None:
    path = run_dir / STAGES_FILE
    if not path.exists():
        return None
    _check_header(path, STAGE_FIELDS)
    try:
        return read_stages(run_dir)
    except (ValueError, TypeError, csv.Error, UnicodeDecodeError, OSError) as exc:
        raise MmeError(f"cannot read {path}: {_reason(exc)}") from None


def _read_run_info(run_dir: Path) -> RunInfo:
    if not run_dir.exists():
        raise MmeError(f"{run_dir} does not exist; pass a directory written by 'mme bench'")
    if not run_dir.is_dir():
        raise MmeError(f"{run_dir} is not a directory; pass a directory written by 'mme bench'")
    try:
        return RunInfo.read(run_dir)
    except (TypeError, AttributeError) as exc:
        raise MmeError(f"{run_dir / RUN_FILE} is not a bench run description ({_reason(exc)})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MmeError(f"cannot read {run_dir / RUN_FILE}: {_reason(exc)}") from None


def _read_endpoint_snapshots(run_dir: Path, warnings: list[str]) -> dict[int, dict]:
    """Stage index -> the snapshot that closes the stage: the one taken at its end, else (the
    endpoint stopped answering before the stage ended) the last one taken within it. Stage -1:
    the baseline taken before the first stage. Unreadable lines (an interrupted write) are
    skipped with a warning rather than failing the whole report."""
    path = run_dir / ENDPOINT_METRICS_FILE
    if not path.exists():
        return {}
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        warnings.append(f"{ENDPOINT_METRICS_FILE} unreadable ({_reason(exc)}): endpoint metrics left out")
        return {}
    snapshots: dict[int, dict] = {}
    ended_stages: set[int] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            entry = json.loads(raw)
            stage = int(entry["stage"])
            snapshot = entry["snapshot"]
            if not isinstance(snapshot, dict):
                raise TypeError("snapshot is not an object")
        except (ValueError, KeyError, TypeError) as exc:
            warnings.append(f"{ENDPOINT_METRICS_FILE} line {number} unreadable ({_reason(exc)}): skipped")
            continue
        ended = entry.get("at", "end") == "end"
        if ended or stage not in ended_stages:
            snapshots[stage] = snapshot
        if ended:
            ended_stages.add(stage)
    return snapshots


# -- endpoint metrics per stage ----------------------------------------------------------


def _count(snapshot: dict | None, name: str) -> float:
    if not snapshot:
        return 0
    value = (snapshot.get("counts") or {}).get(name, 0)
    return value if isinstance(value, (int, float)) else 0


def _latency_totals(snapshot: dict | None, name: str) -> tuple[float, float]:
    if not snapshot:
        return 0, 0.0
    entry = (snapshot.get("latency_us") or {}).get(name) or {}
    return entry.get("count") or 0, entry.get("sum") or 0.0


def _delta(now: float, before: float) -> float:
    """Counter difference; a counter that went down was reset (the endpoint restarted)."""
    return now - before if now >= before else now


def _endpoint_stage(now: dict, before: dict | None) -> EndpointStage:
    def d(name: str) -> int:
        return int(_delta(_count(now, name), _count(before, name)))

    count_now, sum_now = _latency_totals(now, "ModelLatency")
    count_before, sum_before = _latency_totals(before, "ModelLatency")
    if count_now >= count_before:
        count, total = count_now - count_before, sum_now - sum_before
    else:
        count, total = count_now, sum_now
    gauges = now.get("gauges") or {}
    loaded = gauges.get("LoadedModelCount")
    if loaded is None and isinstance(now.get("loaded_models"), list):
        loaded = len(now["loaded_models"])
    # The share of the endpoint's memory limit (what eviction counts); endpoints before the
    # CloudWatch-named metrics called it MemoryUtilization, which now means host memory.
    utilisation = gauges.get("MemoryLimitUtilization", gauges.get("MemoryUtilization"))
    return EndpointStage(
        model_loads=d("ModelLoads"), model_evictions=d("ModelEvictions"), cache_hits=d("ModelCacheHit"),
        cache_misses=d("ModelCacheMiss"), invocations_ok=d("Invocations.ok"),
        model_latency_avg_ms=(total / count / 1000.0) if count else None,
        loaded_model_count=int(loaded) if isinstance(loaded, (int, float)) else None,
        memory_utilization=float(utilisation) if isinstance(utilisation, (int, float)) else None,
        loads_above_threshold=d("LoadsAboveThreshold"),
    )


def _endpoint_by_stage(snapshots: dict[int, dict]) -> dict[int, EndpointStage]:
    """Each stage against the closest earlier snapshot; the first stage against the
    baseline (stage < 0) when there is one, else against zero (counts since the endpoint
    started)."""
    result: dict[int, EndpointStage] = {}
    before: dict | None = None
    for stage in sorted(snapshots):
        if stage >= 0:
            result[stage] = _endpoint_stage(snapshots[stage], before)
        before = snapshots[stage]
    return result


# -- summaries ----------------------------------------------------------------------------


def _stage_summary(record: StageRecord | None, stage: int, reqs: _StageRequests | None, partial: bool,
                   endpoint: EndpointStage) -> StageSummary:
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
        derived=record is None, errors=errors, **asdict(endpoint),
    )


def _max_users_without_failure(stages: tuple[StageSummary, ...]) -> int | None:
    best: int | None = None
    for s in stages:
        if s.failures:
            break
        if s.requests and not s.partial:
            best = s.users if best is None else max(best, s.users)
    return best


def _overall(run: RunInfo, stages: tuple[StageSummary, ...], first: _FirstFailure | None,
             min_latency: float | None, endpoint: dict[int, EndpointStage]) -> Overall:
    error_free = [s for s in stages if s.error_free and s.requests_per_s is not None]
    top = max(error_free, key=lambda s: s.requests_per_s, default=None)
    with_p50 = [s for s in stages if s.latency_p50_ms is not None]
    lowest = min(with_p50, key=lambda s: s.latency_p50_ms, default=None)
    loaded_counts = [e.loaded_model_count for e in endpoint.values() if e.loaded_model_count is not None]
    if run.models_loaded is not None:
        models_loaded, source = run.models_loaded, "run.json"
    elif loaded_counts:
        models_loaded, source = max(loaded_counts), "endpoint metrics"
    else:
        models_loaded, source = None, None
    requests = sum(s.requests for s in stages)
    failures = sum(s.failures for s in stages)
    return Overall(
        requests=requests, successes=requests - failures, failures=failures,
        duration_s=(max(s.end_t for s in stages) - min(s.start_t for s in stages)) if stages else 0.0,
        max_users_without_failure=_max_users_without_failure(stages), failed=failures > 0,
        first_failure_users=first.users if first else None, first_failure_t=first.t if first else None,
        first_failure_error=first.error if first else None,
        max_error_free_rps=top.requests_per_s if top else None,
        max_error_free_rps_users=top.users if top else None, max_error_free_rps_stage=top.stage if top else None,
        lowest_p50_ms=lowest.latency_p50_ms if lowest else None, lowest_p50_users=lowest.users if lowest else None,
        min_latency_ms=min_latency, models_loaded=models_loaded, models_loaded_source=source,
        endpoint=run.endpoint, instance_type=run.instance_type, model=run.model, format=run.format,
        stopped_reason=run.stopped_reason, saturated_stages=tuple(s.stage for s in stages if s.saturated),
        partial=run.stopped_reason != COMPLETED,
    )


def analyse(run_dir: Path | str) -> RunSummary:
    """Read one run directory and summarise it. Bad input raises a one-line MmeError."""
    run_dir = Path(run_dir)
    run = _read_run_info(run_dir)
    warnings: list[str] = []
    by_stage, first = _read_requests(run_dir, warnings)
    records = _read_stages(run_dir)
    if records is None:
        warnings.append(f"no {STAGES_FILE}: stage timing reconstructed from requests; generator CPU unknown")
        records = []
    known = {r.stage: r for r in records}
    unknown = sorted(set(by_stage) - set(known))
    if records and unknown:
        warnings.append(f"requests of stage(s) {', '.join(map(str, unknown))} missing from {STAGES_FILE}: "
                        "timing reconstructed from their requests")
    snapshots = _read_endpoint_snapshots(run_dir, warnings)
    endpoint = _endpoint_by_stage(snapshots)
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
    overall = _overall(run, stages, first, min(successful, default=None), endpoint)
    return RunSummary(run_dir=run_dir, run=run, stages=stages, overall=overall,
                      has_endpoint_metrics=bool(endpoint), warnings=tuple(warnings))


# -- writing ------------------------------------------------------------------------------


def _rounded(data: dict[str, Any], digits: int = 4) -> dict[str, Any]:
    return {k: (round(v, digits) if isinstance(v, float) else list(v) if isinstance(v, tuple) else v)
            for k, v in data.items()}


def summary_csv_text(summary: RunSummary) -> str:
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(STAGE_COLUMNS)
    for s in summary.stages:
        row = _rounded(asdict(s))
        writer.writerow(["" if row[c] is None else int(row[c]) if isinstance(row[c], bool) else row[c]
                         for c in STAGE_COLUMNS])
    return buffer.getvalue()


def write_summary(summary: RunSummary, out_dir: Path | None = None) -> tuple[Path, Path]:
    """(Re)write summary.csv and summary.json (atomically) in ``out_dir`` (default: the run dir)."""
    target = out_dir or summary.run_dir
    csv_path, json_path = target / SUMMARY_CSV, target / SUMMARY_JSON
    write_bytes_atomic(csv_path, summary_csv_text(summary).encode())
    write_json_atomic(json_path, summary.to_json())
    return csv_path, json_path
