"""``mme report``: summaries, charts and the HTML/Markdown report rebuilt from saved runs
(the work is :func:`bench.report.build_report`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.report import build_report, print_results
from mme.argtypes import positive_float
from mme.progress import Reporter


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report",
        help="summaries, charts and an HTML/Markdown report from saved 'mme bench' runs",
        description="Rebuild everything from saved results: summary.csv/summary.json and a latency/throughput "
        "chart in each run directory, a comparison chart for two or more runs (e.g. PyTorch vs TensorRT), "
        "a self-contained report.html and report.md, and with --target-tps/--p95-slo-ms the instance count "
        "that serves a target TPS at 60-70% utilisation of one instance's measured capacity.",
    )
    p.add_argument("results", nargs="+", metavar="RESULTS",
                   help="run directories written by 'mme bench' (a directory of run directories also works)")
    p.add_argument("--out", help="where report.html/report.md go (default: the run directory for one run, "
                   "results/report-<timestamp> for several)")
    p.add_argument("--target-tps", type=positive_float, metavar="T", help="size the fleet for T requests/s")
    p.add_argument("--p95-slo-ms", type=positive_float, metavar="X", help="p95 latency requirement for sizing (ms)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    reporter = Reporter(quiet=args.quiet)
    paths = build_report(args.results, Path(args.out) if args.out else None, args.target_tps, args.p95_slo_ms,
                         reporter)
    print_results(paths)
    return 0
