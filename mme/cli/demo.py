"""``mme demo``: the whole pipeline on local defaults, no GPU and no cloud account.

package MODEL (cpu-local) -> measure how many copies fit under the memory threshold
(``mme capacity``) -> start the local MME (``mme serve``) with that many copies -> a short
staged load (the article's shape, time-compressed) spread over the copies (``mme bench``)
-> the report (``mme report``). Each step calls the library function behind that command
and hands its result (artifact record, capacity report, run directory) to the next.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from mme.argtypes import byte_size, positive_float
from mme.progress import Reporter
from serving.monitor.memory import DEFAULT_MEMORY_THRESHOLD

if TYPE_CHECKING:
    from packager.pipeline import PackagedArtifact
    from sizing.capacity_report import CapacityReport

DEMO_ENDPOINT = "local-demo"  # the EndpointName the demo's local endpoint answers for and the bench calls
DEMO_FORMAT = "cpu-local"
DEMO_PROBE_COPIES = 2


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="the main job on local defaults: package, capacity, local MME, staged load, report",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--model", default="resnet50", help="model to package (default: %(default)s)")
    p.add_argument("--out", default="artifacts", help="artifact root (default: %(default)s)")
    p.add_argument("--results", default="results", help="results root (default: %(default)s)")
    p.add_argument("--memory-limit", type=byte_size, default=2 * 2**30,
                   help="memory the local endpoint may fill (default: 2G)")
    p.add_argument("--time-scale", type=positive_float, default=0.5,
                   help="compress the article's 340 s staged shape (default: 0.5, about 3 minutes)")
    p.add_argument("--max-copies", type=int, default=20, help="cap on copies measured and served (default: %(default)s)")
    p.add_argument("--repackage", action="store_true", help="package again even if the artifact exists")
    p.set_defaults(func=run)


def _step(reporter: Reporter, number: int, text: str) -> None:
    reporter.info(f"\n==> [{number}/5] {text}")


def package_step(model: str, out: Path, repackage: bool, reporter: Reporter,
                 with_tokenizer: bool = False) -> "PackagedArtifact":
    """The cpu-local artifact of ``model`` under ``out`` (with its tokenizer: text in): the one
    there when it is of that kind, or a new one."""
    from packager.manifest import Manifest, is_artifact_directory
    from packager.model import ModelRequest, triton_model_name
    from packager.pipeline import PackagedArtifact, PackageRequest, package

    directory = out / triton_model_name(model) / DEMO_FORMAT
    if is_artifact_directory(directory) and not repackage:
        manifest = Manifest.load(directory)
        if bool(manifest.details.values.get("text_input")) == with_tokenizer:
            reporter.info(f"  {directory} exists (pass --repackage to build it again)")
            return PackagedArtifact(DEMO_FORMAT, directory, manifest)
        reporter.info(f"  {directory} exists {'without' if with_tokenizer else 'with'} a tokenizer: packaging it again")
    request = PackageRequest(model=ModelRequest(name=model), formats=(DEMO_FORMAT,), out=out,
                             with_tokenizer=with_tokenizer)
    artifact = next(a for a in package(request, reporter) if a.format == DEMO_FORMAT)
    reporter.info(f"  {artifact.format} -> {artifact.directory} (weights: {artifact.manifest.weights})")
    return artifact


def capacity_step(artifact: "PackagedArtifact", memory_limit: int, max_copies: int, out: Path,
                  reporter: Reporter) -> "CapacityReport":
    """How many copies fit under the threshold of ``memory_limit``; the table on stdout and
    the report written under ``out`` as ``mme capacity`` does."""
    from sizing.capacity import measure_capacity
    from sizing.capacity_report import format_table, write_capacity_report

    # the demo's load test sends binary bodies (bench_step) from up to 200 users at once
    report = measure_capacity(artifact.directory, threshold=DEFAULT_MEMORY_THRESHOLD, limit_bytes=memory_limit,
                              probe_copies=DEMO_PROBE_COPIES, max_copies=max_copies, reporter=reporter, binary=True)
    print(format_table(report))
    print(f"written {write_capacity_report(report, out)}")
    return report


def bench_step(endpoint_url: str, artifact: "PackagedArtifact", copies: int, time_scale: float, results: Path,
               run_id: str, quiet: bool) -> Path:
    """The staged load over ``copies`` copies (``mme bench``'s request, its other defaults kept): the run directory."""
    from bench.request import (
        BenchRequest,
        EndpointOptions,
        LoadOptions,
        OutputOptions,
        PayloadOptions,
        TargetOptions,
        run_to_end,
    )

    return run_to_end(BenchRequest(endpoint=EndpointOptions(DEMO_ENDPOINT, endpoint_url),
                                targets=TargetOptions(copies=copies),
                                payload=PayloadOptions(artifact=str(artifact.directory), binary=True),
                                load=LoadOptions(shape="staged", time_scale=time_scale),
                                output=OutputOptions(out=str(results), run_id=run_id, quiet=quiet)), quiet)


def run(args: argparse.Namespace) -> int:
    from bench.report import build_report, print_results
    from mme.fsutil import write_json_atomic
    from serving.runtime.local_endpoint import LocalEndpoint, LocalEndpointOptions

    reporter = Reporter(quiet=args.quiet)
    results = Path(args.results)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")

    _step(reporter, 1, f"package {args.model} in the cpu-local format")
    artifact = package_step(args.model, Path(args.out), args.repackage, reporter)

    _step(reporter, 2, f"how many copies fit in {args.memory_limit / 2**30:.1f} GiB at 90% (mme capacity)")
    capacity_dir = results / f"demo-{stamp}"
    capacity = capacity_step(artifact, args.memory_limit, args.max_copies, capacity_dir, reporter)
    copies = max(1, min(args.max_copies, capacity.actual_copies or capacity.predicted_copies))

    _step(reporter, 3, f"start the local multi-model endpoint with {copies} copies (mme serve)")
    # The endpoint gets the limit the copies were counted under: capacity counts each copy as it
    # is after requests at its max batch size, so they stay under the threshold while serving.
    # Triton runs in its own process; the front runs on a thread here while the load generator
    # is a child process.
    options = LocalEndpointOptions(models=str(artifact.directory), port=0, copies=copies, server_kind="local",
                                   endpoint_name=DEMO_ENDPOINT, memory_limit_bytes=args.memory_limit,
                                   memory_threshold=DEFAULT_MEMORY_THRESHOLD)
    with LocalEndpoint(options, Reporter(quiet=True)) as endpoint:
        reporter.info(f"  {endpoint.url} (Triton behind it, models load on first request)")
        _step(reporter, 4, f"staged load over the {copies} copies, time scale {args.time_scale} (mme bench)")
        run_dir = bench_step(endpoint.url, artifact, copies, args.time_scale, results,
                             f"demo-{stamp}-{artifact.manifest.model}", args.quiet)
    write_json_atomic(run_dir / "capacity.json", capacity.to_dict())

    _step(reporter, 5, "report (mme report)")
    paths = build_report([run_dir], reporter=reporter)
    print_results(paths)
    print(f"\ndemo done: open {paths.html}")
    print(f"  capacity: {capacity_dir}; artifacts: {artifact.directory}; raw results: {run_dir}")
    return 0
