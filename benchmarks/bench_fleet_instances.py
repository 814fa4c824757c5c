"""How well the fleet plan predicts an instance count: the demo fleet served on 1, 2, 3... local
instances (``mme serve --instances N``: each its own Triton and memory limit, behind the router),
each load-tested with the same mix, next to what the simulation predicts for that many instances.

    python benchmarks/bench_fleet_instances.py [--instances 1,2,3] [--memory-limit 400M]
        [--mix zipf:1.1] [--rps 3] [--duration 120] [--max-cold-share 0.05]

Packages ``mme demo-fleet``'s catalogue (skipped when already packaged), measures each model once
(``mme capacity --catalogue``'s measurement; ``--measurements FILE`` reuses one), then for each N:
predicts the run (``predict_run`` with N instances, from an empty endpoint, as the load test
starts) and measures it (open-loop mix through the router). Prints, per N, the predicted and
measured hit ratio and share of requests that waited for a load, and the smallest N whose share
is at most ``--max-cold-share``: predicted and measured (the instance-count error). Writes
results/bench_fleet_instances.json and .csv.
"""

from __future__ import annotations

import argparse
import csv
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mme.argtypes import byte_size, int_list  # noqa: E402
from mme.progress import Reporter  # noqa: E402


def measured_run(run_dir: Path) -> dict:
    """Overall hit ratio and waited share of a run, from its per-request cold flags."""
    from bench.per_model import per_model

    rows = per_model(run_dir)
    requests = sum(r.requests for r in rows)
    successes = sum(r.requests - r.failures for r in rows)
    cold = sum(r.cold or 0 for r in rows)
    return {"requests": requests, "failures": requests - successes, "hit_ratio": (successes - cold) / successes if successes else None,
            "waited_share": (cold + requests - successes) / requests if requests else None,
            "per_model": {r.target: r.hit_ratio for r in rows}}


def smallest(rows: list[dict], key: str, limit: float) -> int | None:
    for row in rows:
        value = row[key]
        if value is not None and value <= limit:
            return row["instances"]
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int_list, default=(1, 2, 3), help="instance counts to run (1,2,3)")
    parser.add_argument("--memory-limit", type=byte_size, default=400 * 2**20, help="memory of each instance (400M)")
    parser.add_argument("--mix", default="zipf:1.1")
    parser.add_argument("--rps", type=float, default=3.0)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of load per instance count (120)")
    parser.add_argument("--max-cold-share", type=float, default=0.05, help="the plan's target share of waited requests")
    parser.add_argument("--measurements", type=Path, help="a fleet-measurements.json to reuse (skips measuring)")
    parser.add_argument("--out", default="artifacts")
    parser.add_argument("--results", default="results")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from bench.request import (
        BenchRequest,
        EndpointOptions,
        FleetOptions,
        LoadOptions,
        OutputOptions,
        PayloadOptions,
        TargetOptions,
        run_to_end,
    )
    from mme.cli import main as mme_main
    from mme.cli.demo_fleet import FLEET, FLEET_FORMAT, MAX_IN_FLIGHT, catalogue_text
    from mme.fsutil import write_json_atomic
    from packager.catalogue import catalogue_artifacts, fleet_directory
    from serving.monitor.memory import DEFAULT_MEMORY_THRESHOLD as THRESHOLD
    from serving.runtime.fleet_router import LocalFleet
    from serving.runtime.local_endpoint import LocalEndpointOptions
    from sizing.fleet import predict_run
    from sizing.fleet_measure import FleetMeasurement, measure_fleet
    from sizing.mix import parse_mix

    reporter = Reporter()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    work = Path(args.results) / f"bench-fleet-instances-{stamp}"
    work.mkdir(parents=True)
    catalogue = work / "fleet.toml"
    catalogue.write_text(catalogue_text(FLEET))
    if mme_main(["-q", "package", "--catalogue", str(catalogue), "--jobs", "2", "--out", args.out]) != 0:
        print("packaging failed; see the catalogue summary", file=sys.stderr)
        return 1
    directories = catalogue_artifacts(catalogue, Path(args.out), FLEET_FORMAT)
    if args.measurements:
        measurement = FleetMeasurement.load(args.measurements)
    else:
        measurement = measure_fleet(directories, reporter, concurrency=MAX_IN_FLIGHT, binary=True)
        write_json_atomic(work / "fleet-measurements.json", measurement.to_dict())
    rates = parse_mix(args.mix, args.rps, [(m.model, m.target) for m in measurement.models])
    fleet_dir = fleet_directory(directories, work / "fleet")
    options = LocalEndpointOptions(models=str(fleet_dir), port=0, server_kind="local", endpoint_name="local-fleet",
                                   memory_limit_bytes=args.memory_limit, memory_threshold=THRESHOLD, memory="host")
    rows = []
    for count in args.instances:
        predicted = predict_run(measurement, rates, args.memory_limit, THRESHOLD, args.duration, instances=count,
                                seed=args.seed)["plans"][0]
        reporter.info(f"\n==> {count} instance(s) of {args.memory_limit / 2**20:.0f} MiB: predicted hit ratio "
                      f"{100 * (predicted['hit_ratio'] or 0):.1f}%, waited {100 * (predicted['waited_share'] or 0):.1f}%")
        with LocalFleet(options, count, Reporter(quiet=True), seed=args.seed) as fleet:
            request = BenchRequest(
                endpoint=EndpointOptions("local-fleet", fleet.url), targets=TargetOptions(seed=args.seed),
                payload=PayloadOptions(binary=True),
                fleet=FleetOptions(mix=args.mix, catalogue=str(catalogue), artifacts=args.out, format=FLEET_FORMAT,
                                   rps=args.rps),
                load=LoadOptions(shape="open-loop", rate=args.rps, duration=args.duration, max_inflight=MAX_IN_FLIGHT),
                output=OutputOptions(out=args.results, run_id=f"bench-fleet-instances-{stamp}-{count}", quiet=True))
            run_dir = run_to_end(request, True)
        measured = measured_run(run_dir)
        per_model = {m["target"]: m for m in predicted["simulation"]["models"]}
        rows.append({"instances": count, "predicted_hit_ratio": predicted["hit_ratio"],
                     "measured_hit_ratio": measured["hit_ratio"], "predicted_waited_share": predicted["waited_share"],
                     "measured_waited_share": measured["waited_share"], "requests": measured["requests"],
                     "failures": measured["failures"], "run_dir": str(run_dir),
                     "per_model": {t: {"predicted": (per_model.get(t) or {}).get("hit_ratio"), "measured": h}
                                   for t, h in measured["per_model"].items()}})
        reporter.info(f"  measured hit ratio {100 * (measured['hit_ratio'] or 0):.1f}%, waited "
                      f"{100 * (measured['waited_share'] or 0):.1f}% of {measured['requests']} requests")

    print(f"\n{'instances':>9} {'hit pred':>9} {'hit meas':>9} {'wait pred':>10} {'wait meas':>10} {'requests':>9}")
    for row in rows:
        def pct(v):
            return "-" if v is None else f"{100 * v:.1f}%"
        print(f"{row['instances']:>9} {pct(row['predicted_hit_ratio']):>9} {pct(row['measured_hit_ratio']):>9} "
              f"{pct(row['predicted_waited_share']):>10} {pct(row['measured_waited_share']):>10} {row['requests']:>9}")
    predicted_n = smallest(rows, "predicted_waited_share", args.max_cold_share)
    measured_n = smallest(rows, "measured_waited_share", args.max_cold_share)
    error = None if predicted_n is None or measured_n is None else predicted_n - measured_n
    print(f"smallest instance count with at most {100 * args.max_cold_share:.0f}% of requests waiting for a load: "
          f"predicted {predicted_n or 'more than tried'}, measured {measured_n or 'more than tried'}"
          + ("" if error is None else f" (error {error:+d})"))
    document = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                "rows": rows, "smallest_predicted": predicted_n, "smallest_measured": measured_n, "error": error}
    out = Path(args.results)
    write_json_atomic(out / "bench_fleet_instances.json", document)
    with open(out / "bench_fleet_instances.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["instances", "predicted_hit_ratio", "measured_hit_ratio", "predicted_waited_share",
                         "measured_waited_share", "requests", "failures"])
        for row in rows:
            writer.writerow([row[k] for k in ("instances", "predicted_hit_ratio", "measured_hit_ratio",
                                              "predicted_waited_share", "measured_waited_share", "requests", "failures")])
    print(f"written {out / 'bench_fleet_instances.json'} and .csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
