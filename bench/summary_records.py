"""The records a bench run's summary is made of (``StageSummary``, ``Overall``, ``RunSummary``),
the summary's fixed definitions (percentiles, what latency is measured over, schema version)
and its JSON form. Built by ``bench.analysis``, written by ``bench.summary_io``, read by the
charts, tables and sizing."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from bench.results import RunInfo

SUMMARY_SCHEMA_VERSION = 1
SUMMARY_CSV = "summary.csv"
SUMMARY_JSON = "summary.json"
PERCENTILES = (50, 90, 95, 99)
PERCENTILE_METHOD = "linear interpolation between closest ranks (numpy method='linear', Hyndman-Fan type 7)"
LATENCY_OF = "successful requests (ok == 1)"
COLD_METHOD = "the endpoint's X-Mme-Cold reply header, per request (mme serve)"
COMPLETED = "completed"
NONE = "–"  # a figure with nothing to compute it from
TOP_ERRORS = 5
SUSTAINED_MIN_S = 10.0  # a stage shorter than this is a burst: no throughput headline from it


def top_errors(reasons: Counter, n: int = TOP_ERRORS) -> tuple[dict, ...]:
    """The ``n`` most common failures of ``reasons`` ((error, message, target) -> count) as
    {"error", "message", "count", "targets"}, targets most frequent first."""
    by_reason: Counter = Counter()
    targets: dict[tuple[str, str], Counter] = {}
    for (error, message, target), count in reasons.items():
        by_reason[(error, message)] += count
        targets.setdefault((error, message), Counter())[target] += count
    return tuple({"error": error, "message": message, "count": count,
                  "targets": [t for t, _ in targets[(error, message)].most_common()]}
                 for (error, message), count in by_reason.most_common(n))


def top_errors_text(top: tuple[dict, ...]) -> str:
    """``12 x ModelError "bad input" (m-v1.tar.gz, m-v2.tar.gz +3)``; ... or NONE."""
    parts = []
    for entry in top:
        targets = [t or "(no target)" for t in entry["targets"]]
        shown = ", ".join(targets[:2]) + (f" +{len(targets) - 2}" if len(targets) > 2 else "")
        message = f' "{entry["message"]}"' if entry["message"] else ""
        parts.append(f"{entry['count']} x {entry['error']}{message} ({shown})")
    return "; ".join(parts) or NONE


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
    cut_off: int = 0  # requests still in flight when the drain ended the run: neither answered nor failed
    # cold: requests that waited for their model to be fetched and loaded (None: the endpoint did not say)
    cold_requests: int | None = None
    warm_p50_ms: float | None = None  # successful requests whose model was loaded already
    warm_p95_ms: float | None = None
    warm_p99_ms: float | None = None
    cold_p50_ms: float | None = None  # successful cold requests
    cold_max_ms: float | None = None
    # what the endpoint did in the stage (bench.endpoint_stages.EndpointStage's fields)
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
    max_error_free_rps: float | None  # over stages held at least SUSTAINED_MIN_S, not a burst
    max_error_free_rps_users: int | None
    max_error_free_rps_stage: int | None
    lowest_p50_ms: float | None
    lowest_p50_users: int | None
    min_latency_ms: float | None
    models_loaded: int | None  # resident at the end of the run (LoadedModelCount)
    models_loaded_source: str | None  # "run.json" | "endpoint metrics"
    endpoint: str
    instance_type: str | None
    model: str | None
    format: str | None
    stopped_reason: str | None
    saturated_stages: tuple[int, ...]
    partial: bool  # the run did not complete its load shape
    cut_off: int = 0  # requests still in flight when the drain ended the run
    failure_rate: float | None = None  # failures / requests (None without requests)
    latency_p50_ms: float | None = None  # over every successful request of the run
    latency_p95_ms: float | None = None
    latency_p99_ms: float | None = None
    sustained_rps: float | None = None  # answered requests / the run's duration
    copies_targeted: int = 0  # distinct targets requests were spread over
    model_loads: int | None = None  # loads during the run (endpoint metrics); None: unknown
    unanswered_stages: tuple[int, ...] = ()  # stages where no request finished (no figure to show)
    cold_requests: int | None = None  # None: the endpoint did not say which requests were cold
    cold_method: str | None = None  # how cold requests were told apart
    warm_p50_ms: float | None = None
    warm_p95_ms: float | None = None
    warm_p99_ms: float | None = None
    cold_p50_ms: float | None = None
    cold_p95_ms: float | None = None
    cold_max_ms: float | None = None
    # the most common failures: {"error", "message", "count", "targets"} (targets: most frequent first)
    top_errors: tuple[dict, ...] = ()
    # the breaking point: the first stage with failures, and the last stage before it that ran to its end
    # with requests and none (None: no failure, or no such stage)
    breaking_stage: int | None = None
    breaking_users: int | None = None
    breaking_failures: int | None = None  # of that stage
    breaking_requests: int | None = None
    before_breaking_stage: int | None = None
    before_breaking_users: int | None = None
    before_breaking_rps: float | None = None


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
            "overall": rounded(asdict(self.overall)),
            "stages": [rounded(asdict(s)) for s in self.stages],
            "has_endpoint_metrics": self.has_endpoint_metrics,
            "warnings": list(self.warnings),
        }


def rounded(data: dict[str, Any], digits: int = 4) -> dict[str, Any]:
    """A record's fields as saved: floats to ``digits`` places, tuples as lists."""
    return {k: (round(v, digits) if isinstance(v, float) else list(v) if isinstance(v, tuple) else v)
            for k, v in data.items()}


def common_users(summaries: "list[RunSummary] | tuple[RunSummary, ...]") -> int | None:
    """The highest user level every run held: a stage not cut short in which requests finished.
    Runs compared there are compared like for like; None when they share no such level."""
    levels = [{s.users for s in r.stages if s.requests and not s.partial} for r in summaries]
    shared = set.intersection(*levels) if levels else set()
    return max(shared) if shared else None


def stage_with_users(summary: RunSummary, users: int | None) -> StageSummary | None:
    """The run's last stage at ``users`` (not cut short, requests finished), if any."""
    held = [s for s in summary.stages if s.users == users and s.requests and not s.partial]
    return held[-1] if held else None
