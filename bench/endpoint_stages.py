"""What the endpoint did during each stage of a bench run, from ``endpoint_metrics.jsonl``
(snapshots of the endpoint's ``/metrics.json``: a baseline before the first stage, some
within a stage, one at each stage end): model loads, evictions, cache hits/misses and
successful invocations as differences between the snapshot closing the stage and the one
before, the endpoint-side ModelLatency of the stage's requests, and the LoadedModelCount and
memory utilisation gauges at the stage end."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bench.results import ENDPOINT_METRICS_FILE
from bench.run_reader import reason


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


def read_endpoint_snapshots(run_dir: Path, warnings: list[str]) -> dict[int, dict]:
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
        warnings.append(f"{ENDPOINT_METRICS_FILE} unreadable ({reason(exc)}): endpoint metrics left out")
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
            warnings.append(f"{ENDPOINT_METRICS_FILE} line {number} unreadable ({reason(exc)}): skipped")
            continue
        ended = entry.get("at", "end") == "end"
        if ended or stage not in ended_stages:
            snapshots[stage] = snapshot
        if ended:
            ended_stages.add(stage)
    return snapshots


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


def endpoint_stage(now: dict, before: dict | None) -> EndpointStage:
    """One stage: the snapshot closing it against the one before (None: counts since the endpoint started)."""
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


def endpoint_by_stage(snapshots: dict[int, dict]) -> dict[int, EndpointStage]:
    """Each stage against the closest earlier snapshot; the first stage against the
    baseline (stage < 0) when there is one, else against zero (counts since the endpoint
    started)."""
    result: dict[int, EndpointStage] = {}
    before: dict | None = None
    for stage in sorted(snapshots):
        if stage >= 0:
            result[stage] = endpoint_stage(snapshots[stage], before)
        before = snapshots[stage]
    return result
