"""Per model (target) of a run: requests, failures, latency, cold requests and the cache hit
ratio measured, from requests.csv; with a fleet plan in the run directory (``fleet-plan.json``,
``mme demo-fleet`` and ``mme capacity --catalogue`` write one) the predicted hit ratio beside it.

A request is a hit when it succeeded without waiting for its model to load (the local endpoint
says so per request; requests.csv's ``cold`` column). Requests cut off at the end are left out.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.results import readable_requests
from mme.fsutil import write_bytes_atomic
from mme.stats import percentile

FLEET_PLAN_FILE = "fleet-plan.json"
PER_MODEL_CSV = "per_model.csv"


@dataclass(frozen=True)
class ModelRow:
    target: str
    requests: int
    failures: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    cold: int | None  # successful requests that waited for a load (None: the endpoint does not say)
    cold_p95_ms: float | None
    hit_ratio: float | None  # measured: warm successes / successes
    predicted_hit_ratio: float | None = None


def per_model(run_dir: Path) -> list[ModelRow]:
    """One row per target of ``run_dir``'s requests.csv (most requested first); empty without targets."""
    latencies: dict[str, list[float]] = {}
    cold_latencies: dict[str, list[float]] = {}
    counts: dict[str, list[int]] = {}  # target -> [requests, failures, cold known, cold]
    for r in readable_requests(run_dir):
        if not r.target or r.cut_off:
            continue
        c = counts.setdefault(r.target, [0, 0, 0, 0])
        c[0] += 1
        if not r.ok:
            c[1] += 1
            continue
        latencies.setdefault(r.target, []).append(r.latency_ms)
        if r.cold is not None:
            c[2] += 1
            if r.cold:
                c[3] += 1
                cold_latencies.setdefault(r.target, []).append(r.latency_ms)
    predicted = predicted_hit_ratios(run_dir)
    rows = []
    for target, (requests, failures, known, cold) in sorted(counts.items(), key=lambda kv: -kv[1][0]):
        ok = latencies.get(target, [])
        rows.append(ModelRow(target, requests, failures, percentile(ok, 50), percentile(ok, 95), percentile(ok, 99),
                             cold if known else None, percentile(cold_latencies.get(target, []), 95),
                             (known - cold) / known if known else None, predicted.get(target)))
    return rows


def predicted_hit_ratios(run_dir: Path) -> dict[str, float]:
    """The first plan's per-model predicted hit ratios of ``run_dir/fleet-plan.json`` (none: {})."""
    path = run_dir / FLEET_PLAN_FILE
    try:
        plan = json.loads(path.read_text())
        models = plan["plans"][0]["simulation"]["models"]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return {}
    return {m["target"]: m["hit_ratio"] for m in models if m.get("hit_ratio") is not None}


def write_per_model(run_dir: Path, rows: list[ModelRow]) -> Path:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(ModelRow.__dataclass_fields__))
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else round(v, 4) if isinstance(v, float) else v)
                         for k, v in asdict(row).items()})
    path = run_dir / PER_MODEL_CSV
    write_bytes_atomic(path, buffer.getvalue().encode())
    return path


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f}"


def table(rows: list[ModelRow]) -> tuple[list[str], list[list[str]]]:
    header = ["model (target)", "requests", "failed", "p50 ms", "p95 ms", "p99 ms", "cold", "cold p95 ms",
              "hit ratio", "predicted hit ratio"]
    body = [[r.target, str(r.requests), str(r.failures), _ms(r.p50_ms), _ms(r.p95_ms), _ms(r.p99_ms),
             "–" if r.cold is None else str(r.cold), _ms(r.cold_p95_ms), _pct(r.hit_ratio),
             _pct(r.predicted_hit_ratio)] for r in rows]
    return header, body
