"""``mme demo-fleet`` (``make demo-fleet``): a fleet of different models on one local multi-model
endpoint, on local defaults.

package a catalogue of timm's tiny models (``--jobs 2``) -> measure each one (``mme capacity
--catalogue``) and predict, by simulating the endpoint's LRU cache, each model's hit ratio under
the mix for this run -> serve the catalogue under a memory limit that holds only part of it ->
the mix as an open-loop load (``mme bench --mix``) -> the report, where each model's measured hit
ratio stands next to the predicted one.

The load is sized from what was just measured: ``--rps``, or less where the prediction (each
model's measured load and latency, the simulated cache) says that rate would keep more than half
of the MAX_IN_FLIGHT requests the endpoint was measured for in flight
(``sizing.fleet.open_loop_rate``). A load that breaks the endpoint all the same is the finding:
the report and the plan are written, the breaking point is named, and the demo exits 0.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path

from mme.argtypes import byte_size, positive_float, positive_int
from mme.errors import MmeError
from mme.progress import Reporter
from serving.monitor.memory import DEFAULT_MEMORY_THRESHOLD

FLEET_ENDPOINT = "local-fleet-demo"
FLEET_FORMAT = "cpu-local"
FLEET = ("test_resnet", "test_vit", "test_convnext", "test_efficientnet", "test_byobnet", "test_nfnet")
MAX_IN_FLIGHT = 16  # callers the open-loop load keeps in flight at most, for the endpoint's request buffers


def catalogue_text(models: tuple[str, ...]) -> str:
    entries = "\n".join(f'[[model]]\nname = "{name}"\n' for name in models)
    return (f'# mme demo-fleet: timm\'s tiny models, most popular first (the Zipf order)\n[defaults]\n'
            f'formats = ["{FLEET_FORMAT}"]\nweights = "random"\nmax_batch_size = 4\n\n{entries}')


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo-fleet",
        help="a fleet of different models on one local MME: package a catalogue, predict each model's cache hit "
        "ratio, load-test the mix, report predicted vs measured",
        description=__doc__.split("\n\n")[1],
    )
    p.add_argument("--out", default="artifacts", help="artifact root (default: %(default)s)")
    p.add_argument("--results", default="results", help="results root (default: %(default)s)")
    p.add_argument("--memory-limit", type=byte_size, default=450 * 2**20,
                   help="memory the local endpoint may fill: room for part of the fleet (default: 450M)")
    p.add_argument("--mix", default="zipf:1.1", help="traffic mix over the catalogue (default: %(default)s)")
    p.add_argument("--rps", type=positive_float, default=3.0,
                   help="requests/s over the fleet, at most (default: %(default)g; less where the prediction says the "
                   f"endpoint would hold more than {MAX_IN_FLIGHT // 2} requests in flight)")
    p.add_argument("--duration", type=positive_float, default=150.0, help="seconds of load (default: %(default)g)")
    p.add_argument("--models", default=",".join(FLEET),
                   help="the catalogue's models, most popular first (default: %(default)s)")
    p.add_argument("--jobs", type=positive_int, default=2, help="packaging jobs at once (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the load's target choices and of the simulation")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bench.per_model import FLEET_PLAN_FILE, per_model
    from bench.report import build_report, print_results
    from bench.request import (
        BenchRequest,
        EndpointOptions,
        FleetOptions,
        LoadOptions,
        OutputOptions,
        PayloadOptions,
        TargetOptions,
        run_to_finding,
    )
    from mme.cli import main as mme_main
    from mme.cli.demo import finding_lines
    from mme.fsutil import ensure_writable_dir, write_json_atomic
    from packager.catalogue import catalogue_artifacts, fleet_directory
    from serving.runtime.local_endpoint import LocalEndpoint, LocalEndpointOptions
    from sizing.fleet import mean_latency_s, open_loop_rate, predict_run
    from sizing.fleet_measure import measure_fleet
    from sizing.mix import parse_mix

    reporter = Reporter(quiet=args.quiet)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    work = ensure_writable_dir(Path(args.results) / f"demo-fleet-{stamp}")
    catalogue = work / "fleet.toml"
    fleet = tuple(m.strip() for m in args.models.split(",") if m.strip())
    if len(fleet) < 2:
        raise MmeError(f"--models needs two or more models for a fleet (got {args.models!r})")
    catalogue.write_text(catalogue_text(fleet))
    steps = 5
    reporter.info(f"\n==> [1/{steps}] package {len(fleet)} models ({', '.join(fleet)}) with --jobs {args.jobs} "
                  "(mme package --catalogue)")
    code = mme_main(["-q", "package", "--catalogue", str(catalogue), "--jobs", str(args.jobs), "--out", args.out])
    if code != 0:
        raise MmeError(f"{code} catalogue entries failed to package; see {Path(args.out) / 'catalogue-summary.md'}")
    directories = catalogue_artifacts(catalogue, Path(args.out), FLEET_FORMAT)

    reporter.info(f"\n==> [2/{steps}] measure each model, one copy (mme capacity --catalogue), and predict this run")
    measurement = measure_fleet(directories, reporter, concurrency=MAX_IN_FLIGHT, binary=True)
    names = [(m.model, m.target) for m in measurement.models]
    rates = parse_mix(args.mix, args.rps, names)
    prediction = predict_run(measurement, rates, args.memory_limit, DEFAULT_MEMORY_THRESHOLD, args.duration, seed=args.seed)
    rps = max(0.01, round(open_loop_rate(args.rps, prediction, measurement, MAX_IN_FLIGHT), 2))
    latency = mean_latency_s(prediction, measurement) or 0.0
    if rps < args.rps:
        reporter.info(f"  load: {rps:g} requests/s, not {args.rps:g}: at {args.rps:g} the prediction (mean latency "
                      f"{latency:.2f} s) keeps {args.rps * latency:.1f} requests in flight, more than half of "
                      f"{MAX_IN_FLIGHT}")
        rates = parse_mix(args.mix, rps, names)
        prediction = predict_run(measurement, rates, args.memory_limit, DEFAULT_MEMORY_THRESHOLD, args.duration,
                                 seed=args.seed)
    else:
        reporter.info(f"  load: {rps:g} requests/s: the prediction (mean latency {latency:.2f} s) keeps "
                      f"{rps * latency:.1f} requests in flight, within half of {MAX_IN_FLIGHT}")
    plan = prediction["plans"][0]
    reporter.info(f"  budget for models {plan['budget_bytes'] / 2**20:.0f} MiB of {args.memory_limit / 2**20:.0f} MiB "
                  f"(fleet {sum(m.rest_bytes for m in measurement.models) / 2**20:.0f} MiB at rest, "
                  f"{sum(m.loaded_bytes for m in measurement.models) / 2**20:.0f} MiB loaded): predicted hit ratio "
                  f"{100 * (plan['hit_ratio'] or 0):.1f}%, {100 * (plan['waited_share'] or 0):.1f}% of requests "
                  "waiting for a load")

    reporter.info(f"\n==> [3/{steps}] serve the catalogue under {args.memory_limit / 2**20:.0f} MiB (mme serve --catalogue)")
    fleet_dir = fleet_directory(directories, work / "fleet")  # the tarballs as one MME prefix holds them
    options = LocalEndpointOptions(models=str(fleet_dir), port=0, server_kind="local", endpoint_name=FLEET_ENDPOINT,
                                   memory_limit_bytes=args.memory_limit, memory_threshold=DEFAULT_MEMORY_THRESHOLD, memory="host")
    with LocalEndpoint(options, Reporter(quiet=True)) as endpoint:
        reporter.info(f"\n==> [4/{steps}] the mix {args.mix} at {rps:g} requests/s for {args.duration:g} s, open loop "
                      "(mme bench --mix)")
        request = BenchRequest(endpoint=EndpointOptions(FLEET_ENDPOINT, endpoint.url),
                               targets=TargetOptions(seed=args.seed), payload=PayloadOptions(binary=True),
                               fleet=FleetOptions(mix=args.mix, catalogue=str(catalogue), artifacts=args.out,
                                                  format=FLEET_FORMAT, rps=rps),
                               load=LoadOptions(shape="open-loop", rate=rps, duration=args.duration,
                                                max_inflight=MAX_IN_FLIGHT),
                               output=OutputOptions(out=args.results, run_id=f"demo-fleet-{stamp}-run", quiet=args.quiet))
        outcome = run_to_finding(request, args.quiet)
    run_dir = outcome.run_dir
    write_json_atomic(run_dir / FLEET_PLAN_FILE, prediction)

    reporter.info(f"\n==> [5/{steps}] report: measured vs predicted hit ratio per model (mme report)")
    paths = build_report([run_dir], reporter=reporter)
    print_results(paths)
    rows = per_model(run_dir)
    measured = [r for r in rows if r.hit_ratio is not None and r.predicted_hit_ratio is not None]
    for row in measured:
        print(f"  {row.target:<24} {row.requests:>5} requests  hit ratio measured {100 * (row.hit_ratio or 0.0):5.1f}%  "
              f"predicted {100 * (row.predicted_hit_ratio or 0.0):5.1f}%")
    successes = sum(r.requests - r.failures for r in rows)
    warm = sum((r.requests - r.failures) * (r.hit_ratio or 0.0) for r in rows)
    if successes:
        print(f"  overall: measured {100 * warm / successes:.1f}%, predicted {100 * (plan['hit_ratio'] or 0):.1f}%")
    for line in finding_lines(paths.report.runs[0].summary, outcome.broke):
        print(line)
    print(f"\ndemo done: open {paths.html}")
    print(f"  catalogue: {catalogue}; plan: {run_dir / FLEET_PLAN_FILE}; raw results: {run_dir}")
    return 0
