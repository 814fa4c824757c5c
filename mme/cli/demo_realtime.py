"""``mme demo-realtime`` / ``make demo-realtime``: the second article's flow on local defaults:
a text model packaged with its tokenizer (cpu-local; requests send text), a local real-time
endpoint serving it (``mme serve --mode single``), the staged load without TargetModel
(``mme bench --mode single``), and the report with the instances needed for a target TPS.

The load is sized from this machine: the in-process baseline, measured first, sets the staged
shape's peak users (``bench.stages.peak_users_for``: the peak offers twice its requests/s). A load
that breaks the endpoint all the same is the finding: the report and the sizing are written, the
breaking point is named, and the demo exits 0 (``mme bench`` alone exits non-zero on it)."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path

from mme.argtypes import non_negative_float, positive_float
from mme.cli.bench import peak_users
from mme.cli.demo import finding_lines, package_step, peak_from
from mme.errors import MmeError
from mme.progress import Reporter

REALTIME_MODEL = "distilbert-base-uncased"  # the second article's model
REALTIME_ENDPOINT = "local-realtime-demo"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo-realtime",
        help="the second article's flow on local defaults: package a text model, a real-time endpoint, "
        "staged load, report with the instance count for a target TPS",
        description="package MODEL with its tokenizer (cpu-local; requests send text) -> a local real-time endpoint serving it (mme serve --mode single) "
        "-> the staged load without TargetModel (mme bench --mode single) -> the report with the instances needed "
        "for --target-tps at 60%% and 70%% utilisation (mme report).",
    )
    p.add_argument("--model", default=REALTIME_MODEL, help="model to package (default: %(default)s)")
    p.add_argument("--out", default="artifacts", help="artifact root (default: %(default)s)")
    p.add_argument("--results", default="results", help="results root (default: %(default)s)")
    p.add_argument("--time-scale", type=positive_float, default=0.5,
                   help="compress the article's 340 s staged shape (default: 0.5, about 3 minutes)")
    p.add_argument("--workers", type=int, default=1, metavar="K",
                   help="load generator processes, as the article's distributed Locust (default: %(default)s)")
    p.add_argument("--target-tps", type=positive_float, default=1000.0,
                   help="size the fleet for this many requests/s (default: %(default)g, the article's)")
    p.add_argument("--p95-slo-ms", type=positive_float, default=60_000.0,
                   help="the p95 latency a stage must hold to count as the instance's capacity (default: %(default)g, "
                   "SageMaker's invocation timeout: the article sized on the load one instance held before errors)")
    p.add_argument("--in-process", type=non_negative_float, default=20.0, metavar="SECONDS",
                   help="before the load, run the same text through the packaged tokenizer and the encoder with ONNX "
                   "Runtime in this process for SECONDS: the report compares the endpoint with it (default: %(default)g; "
                   "0: skip, and the load peaks at the article's 200 users unless --peak-users)")
    p.add_argument("--peak-users", type=peak_users, metavar="N",
                   help="peak the staged shape at N users, a multiple of 20 (default: sized from the in-process "
                   "baseline: the users that offer twice its requests/s, 20 to 200)")
    p.add_argument("--timeout", type=positive_float, default=60.0, metavar="S",
                   help="per-request timeout of the load (default: %(default)g, SageMaker's invocation timeout)")
    p.add_argument("--repackage", action="store_true", help="package again even if the artifact exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The second article's flow: one text model on a real-time endpoint, sized for a target TPS."""
    from bench.in_process import measure_in_process
    from bench.render import in_process_text
    from bench.report import build_report, print_results
    from bench.request import (
        DEFAULTS,
        BenchRequest,
        ClientOptions,
        EndpointOptions,
        GeneratorOptions,
        LoadOptions,
        OutputOptions,
        PayloadOptions,
        run_to_finding,
    )
    from serving.runtime.local_endpoint import LocalEndpoint, LocalEndpointOptions

    if args.workers < 1:
        raise MmeError(f"--workers must be 1 or more (got {args.workers})")
    reporter = Reporter(quiet=args.quiet)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    steps = 4
    reporter.info(f"\n==> [1/{steps}] package {args.model} with its tokenizer (text in) in the cpu-local format")
    artifact = package_step(args.model, Path(args.out), args.repackage, reporter, with_tokenizer=True)
    baseline = (measure_in_process(artifact.directory, args.in_process, reporter) if args.in_process else None)
    peak = peak_from(args.peak_users, None if baseline is None else (baseline.requests_per_s, baseline.p50_ms / 1000.0,
                                                                      "the in-process baseline"), DEFAULTS.load.wait,
                     reporter)
    reporter.info(f"\n==> [2/{steps}] start a local real-time endpoint serving it (mme serve --mode single)")
    options = LocalEndpointOptions(models=str(artifact.directory), port=0, server_kind="local", mode="single",
                                   endpoint_name=REALTIME_ENDPOINT)
    with LocalEndpoint(options, Reporter(quiet=True)) as endpoint:
        reporter.info(f"  {endpoint.url}: {artifact.manifest.model} loaded; requests name no TargetModel")
        reporter.info(f"\n==> [3/{steps}] staged load peaking at {peak} users, time scale {args.time_scale}, "
                      f"{args.workers} worker(s) (mme bench --mode single)")
        request = BenchRequest(endpoint=EndpointOptions(REALTIME_ENDPOINT, endpoint.url, mode="single"),
                               payload=PayloadOptions(artifact=str(artifact.directory)),
                               load=LoadOptions(shape="staged", time_scale=args.time_scale, peak_users=peak,
                                                in_process=args.in_process),
                               client=ClientOptions(timeout=args.timeout),
                               generators=GeneratorOptions(workers=args.workers),
                               output=OutputOptions(out=args.results, quiet=args.quiet,
                                                    run_id=f"demo-realtime-{stamp}-{artifact.manifest.model}"))
        outcome = run_to_finding(request, args.quiet, baseline)
    run_dir = outcome.run_dir
    reporter.info(f"\n==> [4/{steps}] report, sized for {args.target_tps:g} TPS with p95 <= {args.p95_slo_ms:g} ms "
                  "(mme report)")
    paths = build_report([run_dir], target_tps=args.target_tps, p95_slo_ms=args.p95_slo_ms, reporter=reporter)
    print_results(paths)
    summary = paths.report.runs[0].summary
    if args.in_process:
        print(f"  in-process on this host: {in_process_text(summary.run.extra.get('in_process'), summary.overall.max_error_free_rps, summary.overall.sustained_rps)}")
    for line in finding_lines(summary, outcome.broke):
        print(line)
    print(f"\ndemo done: open {paths.html}")
    print(f"  artifacts: {artifact.directory}; raw results: {run_dir}")
    return 0
