"""``mme capacity --catalogue FILE --mix MIX``: how many instances a fleet of different models
needs, what cache hit ratio its traffic will see and which share of requests will wait for a load.

1. measure (:mod:`sizing.fleet_measure`): every catalogue model as ``mme capacity`` measures one,
   saved as ``fleet-measurements.json`` so a plan for another mix or limit is rebuilt with
   ``--measurements FILE`` without measuring again; the mix (:mod:`sizing.mix`);
2. plan (here): for each instance (this host under ``--memory-limit``, and the GPU instance types of
   mme/instances.toml), the fewest instances whose share of requests waiting for a load stays
   within ``--max-cold-share``, by simulating the endpoint's LRU cache on the mix
   (sizing/fleet_sim.py). Written as ``fleet-plan.{json,md,csv}`` and ``fleet-plan.png``.

The instance types' figures reuse the footprints measured here: measured on a GPU host they are
GPU memory; measured as host memory (the cpu-local format) they are a rough guide, said so in the plan.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mme.charts import GRID_ALPHA, LEGEND_FONT_SIZE, figure, png
from mme.fsutil import write_bytes_atomic, write_json_atomic
from sizing.fleet_measure import FleetMeasurement
from sizing.fleet_sim import SimModel, SimResult, simulate, smallest_fleet

PLAN = "fleet-plan"
SCHEMA_VERSION = 1  # of fleet-plan.json
MIB = 2**20


# --- the plan ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanRow:
    instance: str
    memory_bytes: int
    budget_bytes: int  # per instance, for models
    result: SimResult
    curve: tuple[tuple[int, float, float], ...]  # (instances, hit ratio, waited share) around the choice
    does_not_fit: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"instance": self.instance, "memory_bytes": self.memory_bytes, "budget_bytes": self.budget_bytes,
                "instances": self.result.instances, "hit_ratio": self.result.to_dict()["hit_ratio"],
                "waited_share": self.result.to_dict()["waited_share"], "does_not_fit": list(self.does_not_fit),
                "curve": [{"instances": n, "hit_ratio": round(h, 4), "waited_share": round(w, 4)}
                          for n, h, w in self.curve],
                "simulation": self.result.to_dict()}


def plan_fleet(measurement: FleetMeasurement, rates: dict[str, float], memories: list[tuple[str, int]],
               threshold: float, max_cold_share: float, duration_s: float, use_rest: bool = False,
               seed: int = 0) -> list[PlanRow]:
    models = sim_models(measurement, rates, use_rest)
    rows = []
    warmup = duration_s * 0.1
    for name, memory in memories:
        budget = int(threshold * memory) - measurement.baseline_bytes - measurement.overhead_bytes
        if budget <= 0:
            rows.append(PlanRow(name, memory, budget, simulate(models, 1, 0, duration_s, warmup, seed), (),
                                tuple(m.target for m in models)))
            continue
        chosen = smallest_fleet(models, budget, duration_s, warmup, max_cold_share, seed=seed)
        curve = []
        for count in range(1, chosen.instances + 3):
            r = chosen if count == chosen.instances else simulate(models, count, budget, duration_s, warmup, seed)
            curve.append((count, r.hit_ratio or 0.0, r.waited_share or 0.0))
        rows.append(PlanRow(name, memory, budget, chosen, tuple(curve),
                            tuple(m.target for m in models if m.bytes > budget)))
    return rows


def plan_chart(rows: list[PlanRow]) -> bytes:
    """The predicted cache hit ratio by instance count, one line per instance, as PNG bytes
    (drawn as every chart of the toolkit is: :mod:`mme.charts`)."""
    fig = figure(8, 4.5)
    ax = fig.add_subplot()
    for row in rows:
        if row.curve:
            ax.plot([c[0] for c in row.curve], [100 * c[1] for c in row.curve], marker="o", label=row.instance)
    ax.set_xlabel("instances")
    ax.set_ylabel("predicted cache hit ratio (%)")
    ax.set_title("Fleet: predicted cache hit ratio by instance count")
    ax.grid(alpha=GRID_ALPHA)
    ax.legend(fontsize=LEGEND_FONT_SIZE)
    return png(fig)


def write_plan(out: Path, measurement: FleetMeasurement, rates: dict[str, float], rows: list[PlanRow],
               settings: dict[str, Any]) -> list[Path]:
    document = {"schema_version": SCHEMA_VERSION, "settings": settings, "rates": rates,
                "measurement": measurement.to_dict(), "plans": [r.to_dict() for r in rows]}
    paths = [out / f"{PLAN}.json", out / f"{PLAN}.md", out / f"{PLAN}.csv", out / f"{PLAN}.png"]
    write_json_atomic(paths[0], document)
    write_bytes_atomic(paths[1], plan_markdown(measurement, rates, rows, settings).encode())
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["instance", "instances", "target", "rate_rps", "loaded_mib", "load_s", "unload_s", "predicted_hit_ratio",
                     "predicted_waited_share", "fits"])
    for row in rows:
        for outcome in row.result.models.values():
            m = measurement.footprint(outcome.target)
            share = outcome.waited / outcome.requests if outcome.requests else None
            writer.writerow([row.instance, row.result.instances, outcome.target, round(rates.get(outcome.target, 0.0), 4),
                             round(m.loaded_bytes / MIB, 1), m.load_seconds, m.unload_seconds, outcome.hit_ratio, share, outcome.fits])
    write_bytes_atomic(paths[2], buffer.getvalue().encode())
    write_bytes_atomic(paths[3], plan_chart(rows))
    return paths


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def plan_table(rows: list[PlanRow]) -> str:
    lines = [f"{'instance':<22}{'memory':>10}{'budget':>10}{'instances':>11}{'hit ratio':>11}{'wait share':>12}  notes"]
    for row in rows:
        note = f"does not fit: {', '.join(row.does_not_fit)}" if row.does_not_fit else ""
        lines.append(f"{row.instance:<22}{row.memory_bytes / MIB:>8.0f}Mi{max(row.budget_bytes, 0) / MIB:>8.0f}Mi"
                     f"{row.result.instances:>11}{_pct(row.result.hit_ratio):>11}{_pct(row.result.waited_share):>12}  {note}")
    return "\n".join(lines)


def plan_markdown(measurement: FleetMeasurement, rates: dict[str, float], rows: list[PlanRow],
                  settings: dict[str, Any]) -> str:
    out = ["# Fleet plan", "",
           f"{len(measurement.models)} models, {sum(rates.values()):.2f} requests/s in all; memory counted as "
           f"{measurement.memory_kind}; server baseline {measurement.baseline_bytes / MIB:.0f} MiB, requests in flight "
           f"{measurement.overhead_bytes / MIB:.0f} MiB; threshold {settings['threshold']:.0%}; the fewest instances "
           f"with at most {100 * settings['max_cold_share']:.1f}% of requests waiting for a load, from "
           f"{settings['duration_s']:.0f} s of simulated traffic (LRU cache per instance, first 10% not counted).", "",
           "| instance | memory MiB | budget MiB | instances | hit ratio | waiting for a load | does not fit |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        out.append(f"| {row.instance} | {row.memory_bytes / MIB:.0f} | {max(row.budget_bytes, 0) / MIB:.0f} | "
                   f"{row.result.instances} | {_pct(row.result.hit_ratio)} | {_pct(row.result.waited_share)} | "
                   f"{', '.join(row.does_not_fit) or '-'} |")
    out += ["", "![predicted hit ratio by instances](fleet-plan.png)", "", "## Per model", ""]
    for row in rows:
        out += [f"### {row.instance}: {row.result.instances} instance(s)", "",
                "| model | requests/s | loaded MiB | load s | unload s | predicted hit ratio | waiting for a load |",
                "| --- | --- | --- | --- | --- | --- | --- |"]
        for outcome in row.result.models.values():
            m = measurement.footprint(outcome.target)
            share = outcome.waited / outcome.requests if outcome.requests else None
            out.append(f"| {m.model} | {rates.get(outcome.target, 0.0):.3f} | {m.loaded_bytes / MIB:.0f} | "
                       f"{m.load_seconds:.2f} | {m.unload_seconds:.2f} | {_pct(outcome.hit_ratio)} | {_pct(share)} |")
        out.append("")
    if "host" in measurement.memory_kind:
        out.append("Footprints were measured as host memory (CPU formats); the GPU instance types' rows reuse them "
                   "as a rough guide: measure on a GPU host for GPU memory.")
    return "\n".join(out) + "\n"


def sim_models(measurement: FleetMeasurement, rates: dict[str, float], use_rest: bool = False) -> list[SimModel]:
    """The simulated models: each at rest when it loads, then at its loaded size once it serves
    (``use_rest``: at rest throughout)."""
    return [SimModel(m.target, m.rest_bytes if use_rest else m.loaded_bytes, m.load_seconds, rates.get(m.target, 0.0),
                     rest_bytes=m.rest_bytes, unload_seconds=m.unload_seconds) for m in measurement.models]


def predict_run(measurement: FleetMeasurement, rates: dict[str, float], memory_bytes: int, threshold: float,
                duration_s: float, instances: int = 1, seed: int = 0, use_rest: bool = False) -> dict[str, Any]:
    """The simulation of one run from an empty endpoint (nothing discounted as warm-up): what a
    load test of ``duration_s`` seconds at ``rates`` on ``instances`` instances should measure.
    Shaped as ``fleet-plan.json`` (one plan), which ``mme report`` reads beside a run."""
    models = sim_models(measurement, rates, use_rest)
    budget = int(threshold * memory_bytes) - measurement.baseline_bytes - measurement.overhead_bytes
    result = simulate(models, instances, max(budget, 0), duration_s, 0.0, seed)
    return {"schema_version": SCHEMA_VERSION, "rates": rates, "measurement": measurement.to_dict(),
            "settings": {"threshold": threshold, "duration_s": duration_s, "seed": seed, "from": "an empty endpoint",
                         "counted": "at rest" if use_rest else "loaded"},
            "plans": [{"instance": f"this host ({memory_bytes / MIB:.0f} MiB)", "memory_bytes": memory_bytes,
                       "budget_bytes": budget, "instances": instances, "hit_ratio": result.to_dict()["hit_ratio"],
                       "waited_share": result.to_dict()["waited_share"], "simulation": result.to_dict()}]}


def mean_latency_s(prediction: dict[str, Any], measurement: FleetMeasurement) -> float | None:
    """A predicted run's mean request latency: a request that waited for a load takes its simulated
    wait, the others their model's measured latency (one request alone). None without requests."""
    models = prediction["plans"][0]["simulation"]["models"]
    requests = sum(m["requests"] for m in models)
    if not requests:
        return None
    total = sum(m["waited"] * m["mean_wait_s"] + m["requests"] * measurement.footprint(m["target"]).latency_seconds
                for m in models)
    return total / requests


def open_loop_rate(requested_rps: float, prediction: dict[str, Any], measurement: FleetMeasurement,
                   max_in_flight: int) -> float:
    """The demo fleet's open-loop rate: ``requested_rps``, or less where the prediction says it would
    keep more than half of ``max_in_flight`` requests in flight (Little's law: rate x the predicted
    mean latency): at most max_in_flight / (2 x mean latency) requests/s."""
    latency = mean_latency_s(prediction, measurement)
    if not latency:
        return requested_rps
    return min(requested_rps, max_in_flight / (2.0 * latency))
