"""``mme capacity --catalogue FILE --mix MIX``: how many instances a fleet of different models
needs, what cache hit ratio its traffic will see and which share of requests will wait for a load.

1. measure: every catalogue model as ``mme capacity`` measures one (one copy on an empty Triton:
   memory at rest and after requests at its max batch size, load seconds), plus the server's
   baseline and the endpoint's requests in flight. Saved as ``fleet-measurements.json``, so a
   plan for another mix or limit is rebuilt with ``--measurements FILE`` without measuring again.
2. plan: for each instance (this host under ``--memory-limit``, and the GPU instance types of
   mme/instances.toml), the fewest instances whose share of requests waiting for a load stays
   within ``--max-cold-share``, by simulating the endpoint's LRU cache on the mix
   (sizing/fleet_sim.py). Written as ``fleet-plan.{json,md,csv}`` and ``fleet-plan.png``.

The instance types' figures reuse the footprints measured here: measured on a GPU host they are
GPU memory; measured as host memory (the cpu-local format) they are a rough guide, said so in the plan.
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mme.errors import UsageError
from mme.fsutil import ensure_writable_dir, write_bytes_atomic, write_json_atomic
from mme.progress import Reporter
from sizing.fleet_sim import SimModel, SimResult, simulate, smallest_fleet, zipf_rates

SCHEMA_VERSION = 1
MEASUREMENTS = "fleet-measurements.json"
PLAN = "fleet-plan"
MIB = 2**20


@dataclass(frozen=True)
class ModelFootprint:
    model: str
    target: str  # the tarball name requests name
    format: str
    artifact: str
    rest_bytes: int
    loaded_bytes: int
    load_seconds: float
    unload_seconds: float = 0.0  # measurements written before it was measured read 0


@dataclass(frozen=True)
class FleetMeasurement:
    memory_kind: str
    baseline_bytes: int
    overhead_bytes: int  # the endpoint's requests in flight (the largest measured), counted once
    models: tuple[ModelFootprint, ...]
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def load(cls, path: Path) -> "FleetMeasurement":
        from mme.fsutil import read_versioned_json

        data = read_versioned_json(path, SCHEMA_VERSION, missing=f"--measurements {path}: no such file",
                                   remedy="measure again without --measurements")
        try:
            return cls(str(data["memory_kind"]), int(data["baseline_bytes"]), int(data["overhead_bytes"]),
                       tuple(ModelFootprint(**m) for m in data["models"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{path} is not a fleet measurement ({exc}); measure again without --measurements") from None

    def footprint(self, target: str) -> ModelFootprint:
        return next(m for m in self.models if m.target == target)


def measure_fleet(artifacts: list[Path], reporter: Reporter, *, server_kind: str = "local", memory: str = "auto",
                  concurrency: int = 200, binary: bool = False) -> FleetMeasurement:
    """One copy of each artifact on its own empty Triton, measured as ``mme capacity`` does."""
    from packager.manifest import Manifest
    from sizing.capacity import measure_capacity

    footprints, baselines, overheads, kinds = [], [], [], set()
    for index, artifact in enumerate(artifacts, start=1):
        manifest = Manifest.load(artifact)
        reporter.info(f"  [{index}/{len(artifacts)}] {manifest.model} ({manifest.format})")
        report = measure_capacity(artifact, threshold=0.9, limit_bytes=None, probe_copies=1, verify=False,
                                  max_copies=1, reporter=Reporter(quiet=True), server_kind=server_kind, memory=memory,
                                  concurrency=concurrency, binary=binary, measure_unload=True)
        step = report.steps[0]
        footprints.append(ModelFootprint(manifest.model, manifest.tarball, manifest.format, str(artifact),
                                         int(step.rest_delta_bytes or step.delta_bytes), int(step.delta_bytes),
                                         round(step.load_seconds, 3), report.unload_seconds or 0.0))
        baselines.append(report.baseline_bytes)
        overheads.append(report.overhead_bytes)
        kinds.add(report.memory_kind)
        reporter.info(f"      {step.delta_bytes / MIB:.0f} MiB loaded ({(step.rest_delta_bytes or 0) / MIB:.0f} at rest), "
                      f"load {step.load_seconds:.2f} s, unload {report.unload_seconds or 0:.2f} s")
    return FleetMeasurement(" / ".join(sorted(kinds)), int(statistics.median(baselines)), max(overheads),
                            tuple(footprints))


# --- the traffic mix ---------------------------------------------------------------------


def parse_mix(text: str, rps: float | None, names: list[tuple[str, str]]) -> dict[str, float]:
    """Requests/s per target of ``names`` ((model, tarball name) in catalogue order): ``zipf:S``
    (with --rps: the catalogue's order is the popularity order), or a TOML file with ``[rates]``
    (model or tarball name = requests/s) or ``zipf = S`` and ``rps = R``."""
    by_name = {model: target for model, target in names} | {target: target for _, target in names}
    order = [target for _, target in names]
    if text.startswith("zipf:"):
        try:
            exponent = float(text.removeprefix("zipf:"))
        except ValueError:
            raise UsageError(f"--mix {text}: zipf:S takes a number, e.g. zipf:1.1") from None
        if rps is None:
            raise UsageError(f"--mix {text} needs --rps R: the requests/s over the whole fleet")
        return zipf_rates(order, exponent, rps)
    path = Path(text)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--mix {text}: no such file; give zipf:S with --rps R, or a TOML file with [rates]") from None
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"--mix {text}: cannot read it as TOML ({exc})") from None
    if "rates" in data:
        rates = {}
        for name, value in data["rates"].items():
            if name not in by_name:
                raise UsageError(f"--mix {text}: {name!r} is not in the catalogue ({', '.join(m for m, _ in names)})")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise UsageError(f"--mix {text}: the rate of {name} must be a number of requests/s, 0 or more")
            rates[by_name[name]] = float(value)
        return {t: rates.get(t, 0.0) for t in order}
    if "zipf" in data:
        total = data.get("rps", rps)
        if total is None:
            raise UsageError(f"--mix {text}: give rps = R next to zipf (or --rps R)")
        return zipf_rates(order, float(data["zipf"]), float(total))
    raise UsageError(f"--mix {text}: give a [rates] table (model = requests/s) or zipf = S with rps = R")


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
    from mme.charts import GRID_ALPHA, LEGEND_FONT_SIZE, figure, png

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


def run_fleet_capacity(args: argparse.Namespace) -> int:
    from sizing.capacity import CONCURRENCY
    from mme.instances import gpu_memory, load_instances

    reporter = Reporter(quiet=args.quiet)
    if args.mix is None:
        raise UsageError("--catalogue sizes a fleet for a traffic mix: add --mix zipf:1.1 --rps 20, or --mix FILE")
    if not 0 <= args.max_cold_share < 1:
        raise UsageError(f"--max-cold-share must be at least 0 and below 1 (got {args.max_cold_share})")
    out = Path(args.out)
    if args.measurements:
        measurement = FleetMeasurement.load(Path(args.measurements))
        rates = parse_mix(args.mix, args.rps, [(m.model, m.target) for m in measurement.models])
    else:
        from packager.catalogue import catalogue_artifacts
        from packager.manifest import Manifest

        artifacts = catalogue_artifacts(Path(args.catalogue), Path(args.artifacts), args.catalogue_format)
        manifests = [Manifest.load(a) for a in artifacts]
        rates = parse_mix(args.mix, args.rps, [(m.model, m.tarball) for m in manifests])  # before the long part
        reporter.info(f"==> measuring {len(artifacts)} models one copy each (as mme capacity does)")
        measurement = measure_fleet(artifacts, reporter, server_kind=args.server, memory=args.memory,
                                    concurrency=args.concurrency or CONCURRENCY, binary=args.binary)
    out = ensure_writable_dir(out)
    if not args.measurements:
        write_json_atomic(out / MEASUREMENTS, measurement.to_dict())
    memories: list[tuple[str, int]] = []
    if args.memory_limit:
        memories.append((f"this host ({args.memory_limit / MIB:.0f} MiB)", int(args.memory_limit)))
    instances = load_instances(Path(args.instances)) if args.instances else load_instances()
    memories += [(name, gpu_memory(row)[0]) for name, row in instances.items()]  # usable, where known
    rows = plan_fleet(measurement, rates, memories, args.threshold, args.max_cold_share, args.sim_duration,
                      use_rest=args.at_rest, seed=args.seed)
    settings = {"threshold": args.threshold, "max_cold_share": args.max_cold_share, "duration_s": args.sim_duration,
                "counted": "at rest" if args.at_rest else "loaded", "seed": args.seed, "mix": args.mix, "rps": args.rps}
    paths = write_plan(out, measurement, rates, rows, settings)
    print(plan_table(rows))
    for path in paths:
        print(f"written {path}")
    if not args.measurements:
        print(f"written {out / MEASUREMENTS} (plan again without measuring: --measurements {out / MEASUREMENTS})")
    return 0


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
