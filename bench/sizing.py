"""How many instances a target TPS needs, from a run against one instance.

The second source article's method: load one instance until it fails or breaks its
latency requirement, take the throughput it sustained as that instance's capacity, then
size the fleet so each instance runs at 60-70% of it (headroom for spikes, failover and
scaling delay). Here the capacity is the highest requests/s of a stage with no failure
whose p95 latency is within the SLO; instances = ceil(target / (utilisation x capacity)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.summary_records import RunSummary, StageSummary
from mme.errors import UsageError

UTILISATIONS = (0.6, 0.7)
_EPS = 1e-9  # 840 / (0.7 * 200) is 6.000000000000001 in floating point: still 6 instances


@dataclass(frozen=True)
class Sizing:
    target_tps: float
    p95_slo_ms: float
    capacity_rps: float | None  # None: no stage met the SLO without failures
    capacity_stage: int | None
    capacity_users: int | None
    capacity_p95_ms: float | None
    instances_at_60: int | None
    instances_at_70: int | None
    instances_at_100: int | None  # the bare minimum, no headroom
    measured_instances: int  # instances behind the endpoint during the run (RunInfo.extra)
    message: str
    notes: tuple[str, ...]


def instances_needed(target_tps: float, capacity_rps: float, utilisation: float) -> int:
    """ceil(target / (utilisation * capacity)), at least 1."""
    if capacity_rps <= 0 or not 0 < utilisation <= 1:
        raise ValueError("capacity must be positive and utilisation in (0, 1]")
    return max(1, math.ceil(target_tps / (utilisation * capacity_rps) - _EPS))


def _measured_instances(summary: RunSummary) -> int:
    value = summary.run.extra.get("instance_count") if isinstance(summary.run.extra, dict) else None
    return value if isinstance(value, int) and value > 1 else 1


def _qualifying(summary: RunSummary, p95_slo_ms: float) -> list[StageSummary]:
    return [s for s in summary.stages if s.error_free and s.requests_per_s is not None
            and s.latency_p95_ms is not None and s.latency_p95_ms <= p95_slo_ms]


def size(summary: RunSummary, target_tps: float, p95_slo_ms: float) -> Sizing:
    if not target_tps > 0 or not p95_slo_ms > 0:
        raise UsageError("--target-tps and --p95-slo-ms must be positive numbers")
    measured = _measured_instances(summary)
    candidates = _qualifying(summary, p95_slo_ms)
    if not candidates:
        error_free = [s for s in summary.stages if s.error_free and s.latency_p95_ms is not None]
        if not error_free:
            message = (f"no stage of run {summary.run.run_id} ran without failures: this run gives no capacity "
                       "to size from; rerun starting with fewer users")
        else:
            best = min(error_free, key=lambda s: s.latency_p95_ms or 0.0)  # none is None (filtered above)
            message = (f"no error-free stage had p95 <= {p95_slo_ms:g} ms (lowest error-free p95: "
                       f"{best.latency_p95_ms:.1f} ms at {best.users} users): one instance cannot meet this SLO "
                       "at any tested load; try a larger instance, a faster format, or fewer copies")
        return Sizing(target_tps, p95_slo_ms, None, None, None, None, None, None, None, measured, message, ())
    best = max(candidates, key=lambda s: s.requests_per_s or 0.0)  # none is None (_qualifying)
    capacity = (best.requests_per_s or 0.0) / measured
    at = {u: instances_needed(target_tps, capacity, u) for u in (*UTILISATIONS, 1.0)}
    notes = []
    if measured > 1:
        notes.append(f"The run measured {measured} instances: capacity per instance = "
                     f"{best.requests_per_s:.1f} / {measured}.")
    if best.saturated:
        notes.append(f"Stage {best.stage} was limited by a saturated load generator: the instance may sustain more.")
    last_measured = [s for s in summary.stages if s.requests]
    if not summary.overall.failed and last_measured and best.stage == last_measured[-1].stage:
        notes.append("The endpoint met the SLO without failures up to the last stage: capacity is at least this; "
                     "rerun with more users for a tighter number.")
    message = (f"one instance sustained {capacity:.1f} requests/s without failures within p95 <= {p95_slo_ms:g} ms "
               f"(stage {best.stage}, {best.users} users, p95 {best.latency_p95_ms:.1f} ms). For {target_tps:g} TPS: "
               f"{at[0.6]} instances at 60% utilisation, {at[0.7]} at 70% ({at[1.0]} at 100%, no headroom).")
    return Sizing(target_tps, p95_slo_ms, capacity, best.stage, best.users, best.latency_p95_ms,
                  at[0.6], at[0.7], at[1.0], measured, message, tuple(notes))
