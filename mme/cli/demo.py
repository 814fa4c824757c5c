"""``mme demo``: the whole pipeline on local defaults, no GPU and no cloud account.

package MODEL (cpu-local) -> measure how many copies fit under the memory threshold
(``mme capacity``) -> start the local MME (``mme serve``) with that many copies -> a short
staged load (the article's shape, time-compressed) spread over the copies (``mme bench``)
-> the report (``mme report``). Each step calls the library function behind that command
and hands its result (artifact record, capacity report, run directory) to the next.

The load is sized from what the capacity run has just measured on this machine: the requests/s
one copy served to many callers at once and one request's latency set the staged shape's peak
users (``bench.stages.peak_users_for``: the peak offers twice that rate, 20 to 200 users), and the
copies are counted with that many requests in flight. A load that breaks the endpoint all the
same is the finding: the report and the capacity are written, the breaking point is named (the
users and requests/s of the last stage before the first failures) and the demo exits 0;
``mme bench`` alone keeps its failure-rate exit code.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from mme.argtypes import byte_size, positive_float
from mme.cli.bench import peak_users
from mme.progress import Reporter
from serving.monitor.memory import DEFAULT_MEMORY_THRESHOLD

if TYPE_CHECKING:
    from bench.summary_records import RunSummary
    from packager.pipeline import PackagedArtifact
    from sizing.capacity import ServedRate
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
    p.add_argument("--peak-users", type=peak_users, metavar="N",
                   help="peak the staged shape at N users, a multiple of 20 (default: sized from the capacity run: "
                   "the users that offer twice the requests/s one copy served, 20 to 200)")
    p.add_argument("--timeout", type=positive_float, default=60.0, metavar="S",
                   help="per-request timeout of the load (default: %(default)g, SageMaker's invocation timeout)")
    p.add_argument("--repackage", action="store_true", help="package again even if the artifact exists")
    p.set_defaults(func=run)


def peak_from(chosen: int | None, measured: tuple[float, float, str] | None, wait: tuple[float, float],
              reporter: Reporter) -> int:
    """The staged shape's peak users: ``chosen`` (--peak-users), else the demos' rule
    (:func:`bench.stages.peak_users_for`) on ``measured`` = (requests/s, latency s, where from),
    else the article's 200; the choice said on the console."""
    from bench.stages import ARTICLE_PEAK_USERS, PEAK_LOAD_MULTIPLE, peak_stages, peak_users_for

    if chosen is not None:
        peak_stages(chosen)  # a one-line UsageError for a peak that is not a multiple of 20
        reporter.info(f"  load: peak {chosen} users (--peak-users)")
        return chosen
    if measured is None:
        reporter.info(f"  load: peak {ARTICLE_PEAK_USERS} users, the article's (nothing measured to size it from)")
        return ARTICLE_PEAK_USERS
    rps, latency, source = measured
    peak = peak_users_for(rps, latency, wait)
    reporter.info(f"  load: peak {peak} users: {source} served {rps:.2f} requests/s at {1000 * latency:.0f} ms a "
                  f"request; the users offering {PEAK_LOAD_MULTIPLE:g}x that with {wait[0]:g}-{wait[1]:g} s between "
                  f"requests, rounded up to a multiple of 20 within 20-{ARTICLE_PEAK_USERS}")
    return peak


def finding_lines(summary: "RunSummary", broke: bool) -> list[str]:
    """What the demo found about failures: where the load broke the endpoint, if it did."""
    from bench.render import breaking_point_text

    o = summary.overall
    if not o.failures:
        return [f"  breaking point: {breaking_point_text(summary)}"]
    share = f"{o.failures} of {o.requests} requests failed ({100 * (o.failure_rate or 0):.1f}%)"
    head = (f"  the load broke the endpoint: {share}, above the bench's limit" if broke else
            f"  {share}, within the bench's limit")
    return [head, f"  breaking point: {breaking_point_text(summary)}"]


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
                  reporter: Reporter, peak_users: int | None = None) -> tuple["CapacityReport", int]:
    """How many copies fit under the threshold of ``memory_limit`` with the load's peak in flight;
    the table on stdout and the report written under ``out`` as ``mme capacity`` does. The peak
    (``peak_users``, else :func:`peak_from` on the first copy's served rate) is returned with it."""
    from bench.request import DEFAULTS
    from sizing.capacity import measure_capacity
    from sizing.capacity_report import format_table, write_capacity_report

    chosen: list[int] = []

    def in_flight(rate: "ServedRate") -> int:
        """The demo's peak users: as many requests in flight as the copies are counted with."""
        chosen.append(peak_from(peak_users, (rate.requests_per_s, rate.latency_s, "one copy"), DEFAULTS.load.wait,
                                reporter))
        return chosen[-1]

    # the demo's load test sends binary bodies (bench_step) from up to the peak's users at once
    report = measure_capacity(artifact.directory, threshold=DEFAULT_MEMORY_THRESHOLD, limit_bytes=memory_limit,
                              probe_copies=DEMO_PROBE_COPIES, max_copies=max_copies, reporter=reporter, binary=True,
                              concurrency=in_flight)
    print(format_table(report))
    print(f"written {write_capacity_report(report, out)}")
    return report, chosen[-1]


def bench_step(endpoint_url: str, artifact: "PackagedArtifact", copies: int, time_scale: float, peak_users: int,
               timeout: float, results: Path, run_id: str, quiet: bool) -> tuple[Path, bool]:
    """The staged load peaking at ``peak_users`` over ``copies`` copies (``mme bench``'s request, its
    other defaults kept): the run directory, and whether the load broke the endpoint."""
    from bench.request import (
        BenchRequest,
        ClientOptions,
        EndpointOptions,
        LoadOptions,
        OutputOptions,
        PayloadOptions,
        TargetOptions,
        run_to_finding,
    )

    outcome = run_to_finding(BenchRequest(endpoint=EndpointOptions(DEMO_ENDPOINT, endpoint_url),
                                          targets=TargetOptions(copies=copies),
                                          payload=PayloadOptions(artifact=str(artifact.directory), binary=True),
                                          load=LoadOptions(shape="staged", time_scale=time_scale, peak_users=peak_users),
                                          client=ClientOptions(timeout=timeout),
                                          output=OutputOptions(out=str(results), run_id=run_id, quiet=quiet)), quiet)
    return outcome.run_dir, outcome.broke


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
    capacity, peak = capacity_step(artifact, args.memory_limit, args.max_copies, capacity_dir, reporter, args.peak_users)
    copies = max(1, min(args.max_copies, capacity.actual_copies or capacity.predicted_copies))

    _step(reporter, 3, f"start the local multi-model endpoint with {copies} copies (mme serve)")
    # The endpoint gets the limit the copies were counted under: capacity counts each copy as it
    # is after requests at its max batch size, and the peak's requests in flight, so they stay
    # under the threshold while serving it.
    # Triton runs in its own process; the front runs on a thread here while the load generator
    # is a child process.
    options = LocalEndpointOptions(models=str(artifact.directory), port=0, copies=copies, server_kind="local",
                                   endpoint_name=DEMO_ENDPOINT, memory_limit_bytes=args.memory_limit,
                                   memory_threshold=DEFAULT_MEMORY_THRESHOLD)
    with LocalEndpoint(options, Reporter(quiet=True)) as endpoint:
        reporter.info(f"  {endpoint.url} (Triton behind it, models load on first request)")
        _step(reporter, 4, f"staged load peaking at {peak} users over the {copies} copies, time scale "
                           f"{args.time_scale} (mme bench)")
        run_dir, broke = bench_step(endpoint.url, artifact, copies, args.time_scale, peak, args.timeout, results,
                                    f"demo-{stamp}-{artifact.manifest.model}", args.quiet)
    write_json_atomic(run_dir / "capacity.json", capacity.to_dict())

    _step(reporter, 5, "report (mme report)")
    paths = build_report([run_dir], reporter=reporter)
    print_results(paths)
    summary = paths.report.runs[0].summary
    print(memory_line(summary, capacity))
    for line in finding_lines(summary, broke):
        print(line)
    print(f"\ndemo done: open {paths.html}")
    print(f"  capacity: {capacity_dir}; artifacts: {artifact.directory}; raw results: {run_dir}")
    return 0


def memory_line(summary: "RunSummary", capacity: "CapacityReport") -> str:
    """The endpoint's memory at each stage's end next to the threshold the copies were counted under."""
    levels = [(s.users, s.memory_utilization) for s in summary.stages if s.memory_utilization is not None]
    if not levels:
        return "  memory per stage: not measured"
    over = [users for users, used in levels if used > 100 * capacity.threshold]
    text = ", ".join(f"{users}: {used:.1f}%" for users, used in levels)
    verdict = (f"over the {capacity.threshold:.0%} threshold at {', '.join(map(str, over))} users" if over else
               f"under the {capacity.threshold:.0%} threshold at every stage")
    return f"  memory per stage (users: % of the limit): {text}; {verdict}"
