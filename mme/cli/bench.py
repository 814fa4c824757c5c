"""``mme bench`` (the load generator) and ``mme bench-worker`` (a worker on another machine).

The options fill a :class:`bench.request.BenchRequest` (their defaults are its defaults);
``bench.request.start_bench`` checks it and runs it. This module prints the run directory
at the end, or where partial results are. Ctrl-C stops the run and keeps what was measured.
"""

from __future__ import annotations

import argparse
import sys

from bench.child import run_child
from bench.config import WORKER_MASTER_PORT
from bench.request import DEFAULTS, BenchRequest, start_bench, worker_token_env
from bench.stages import PEAK_USERS_STEP
from mme.argtypes import non_negative_float, positive_float, positive_int, share
from mme.errors import MmeError
from mme.progress import Reporter

DEFAULT_WAIT = ",".join(f"{s:g}" for s in DEFAULTS.load.wait)


def register(subparsers) -> None:
    register_bench(subparsers)
    register_worker(subparsers)


def _wait_range(text: str) -> tuple[float, float]:
    parts = text.split(",")
    try:
        low, high = (float(parts[0]), float(parts[1])) if len(parts) == 2 else (float(parts[0]),) * 2
    except ValueError:
        low, high = -1.0, -1.0
    if not 0 <= low <= high:
        raise argparse.ArgumentTypeError(f"must be MIN,MAX seconds with 0 <= MIN <= MAX, got {text!r}")
    return low, high


def peak_users(text: str) -> int:
    """``--peak-users`` (``mme bench`` and the demos): a multiple of PEAK_USERS_STEP, refused when
    the command line is parsed, before a demo packages or measures anything."""
    users = positive_int(text)
    if users % PEAK_USERS_STEP:
        raise argparse.ArgumentTypeError(f"must be a multiple of {PEAK_USERS_STEP} (the staged shape's levels are "
                                         f"shares of its peak), got {text!r}")
    return users


def register_bench(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="load-test a SageMaker endpoint (multi-model or real-time) with Locust",
        description="Send SigV4-signed InvokeEndpoint requests in a load shape (the article's staged shape by "
        "default), spread over N model copies on a multi-model endpoint, and save every request, every stage and "
        "the endpoint's metrics under --out/<run-id>/ for 'mme report'.",
    )
    target = p.add_argument_group("endpoint and targets")
    target.add_argument("--endpoint", required=True, metavar="NAME", help="endpoint name ('mme serve' answers for its --endpoint-name, default: local)")
    target.add_argument("--endpoint-url", metavar="URL", help="runtime URL, e.g. http://127.0.0.1:8080 for 'mme serve' "
                        "(default: the address boto3 is configured with, e.g. AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME for 'mme cloud', else AWS's SageMaker runtime for --region)")
    target.add_argument("--region", help="AWS region (default: botocore's configured region, else us-east-1)")
    target.add_argument("--mode", choices=("multi", "single"), default=DEFAULTS.endpoint.mode,
                        help="multi: a TargetModel per request (MME); single: a real-time endpoint (default: multi)")
    target.add_argument("--model", help="model name in the target names (default: the artifact's)")
    target.add_argument("--copies", type=positive_int, default=DEFAULTS.targets.copies, metavar="N",
                        help="spread requests over <model>-v0..v{N-1}.tar.gz (default: the copies a local 'mme serve' "
                        "answers for, else its <model>.tar.gz; 1 elsewhere)")
    target.add_argument("--distribution", default=DEFAULTS.targets.distribution, metavar="uniform|zipf:S",
                        help="how targets are picked: uniform, or Zipf-skewed toward v0 (e.g. zipf:1.1; default: %(default)s)")
    target.add_argument("--target-template", default=DEFAULTS.targets.template, metavar="TEMPLATE",
                        help="target names if copies are named differently (default: '{model}-v{i}.tar.gz')")
    target.add_argument("--instance-type", help="recorded in run.json, e.g. ml.g5.2xlarge (default: 'local' for local URLs)")

    body = p.add_argument_group("payload")
    fleet = p.add_argument_group("a fleet (--mix)")
    fleet.add_argument("--mix", metavar="MIX", help="send every model of --catalogue its own sample request with this "
                       "popularity: zipf:S (the catalogue's order is the popularity order) or a TOML file with [rates] "
                       "(model = requests/s), as for 'mme capacity --catalogue'")
    fleet.add_argument("--catalogue", metavar="FILE", help="the catalogue packaged by 'mme package --catalogue FILE'")
    fleet.add_argument("--artifacts", default=DEFAULTS.fleet.artifacts, metavar="DIR",
                       help="where the catalogue was packaged (default: %(default)s)")
    fleet.add_argument("--format", dest="mix_format", metavar="FORMAT",
                       help="the format of each entry to send (default: the entry's first)")
    fleet.add_argument("--rps", type=positive_float, help="a Zipf mix's total requests/s (only its ratios pick targets)")
    body.add_argument("--artifact", metavar="DIR", help="artifacts/<model>/<format>: send its manifest's sample request")
    body.add_argument("--binary", action="store_true", help="with --artifact: the binary+json sample instead of JSON")
    body.add_argument("--payload", metavar="FILE", help="send this file's bytes")
    body.add_argument("--content-type", metavar="CT", help="Content-Type of --payload (default for .json: application/json)")
    body.add_argument("--accept", default=DEFAULTS.payload.accept, help="Accept header (default: %(default)s)")

    load = p.add_argument_group("load shape")
    load.add_argument("--shape", default=DEFAULTS.load.shape, metavar="SHAPE",
                      help="staged (the article's 10..200 users over 340 s), ramp, constant, file:PATH (JSON list of "
                      '{"duration": cumulative_end_s, "users": n, "spawn_rate": r}) or open-loop (default: staged)')
    load.add_argument("--users", type=positive_int, help="ramp/constant: users")
    load.add_argument("--duration", type=positive_float, metavar="S",
                      help="seconds: the whole run for ramp, constant and open-loop; for staged and file shapes the "
                      "same stages stretched or compressed to this length (staged: 340 s unless given)")
    load.add_argument("--steps", type=positive_int, help="ramp: stages the ramp is reported in (default: up to 10)")
    load.add_argument("--rate", type=positive_float, metavar="R", help="open-loop: requests per second, all generators")
    load.add_argument("--max-inflight", type=positive_int, default=DEFAULTS.load.max_inflight, metavar="N",
                      help="open-loop: cap on requests in flight; arrivals beyond it start late and are counted (1000)")
    load.add_argument("--warmup", action="store_true",
                      help="before the first stage, send each target one request and wait until it answers (its model "
                      "loaded), so the stages measure a warm endpoint; reported apart, in run.json's warmup")
    load.add_argument("--in-process", type=non_negative_float, default=DEFAULTS.load.in_process, metavar="SECONDS",
                      help="before the load, run the artifact's model in this process (ONNX Runtime, batch 1, one call "
                      "after another) on its sample request for SECONDS: the report puts the endpoint's throughput next "
                      "to it; onnx and cpu-local artifacts, with --artifact (default: off)")
    load.add_argument("--time-scale", type=positive_float, metavar="F",
                      help="staged/file: run the shape F times as long (0.1: the 340 s staged shape in 34 s)")
    load.add_argument("--peak-users", type=peak_users, default=DEFAULTS.load.peak_users, metavar="N",
                      help="staged: the article's stages with their users scaled to peak at N, a multiple of 20 "
                      "(20: 1, 2, 4, 6 ... 20 users; default: its 10 ... 200)")
    load.add_argument("--wait", type=_wait_range, default=DEFAULTS.load.wait, metavar="MIN,MAX",
                      help=f"closed loop: seconds each user waits between requests (default: {DEFAULT_WAIT})")

    gen = p.add_argument_group("generator")
    gen.add_argument("--client", choices=("fast", "boto3"), default=DEFAULTS.client.kind,
                     help="fast: SigV4 over geventhttpclient; boto3: the articles' invoke_endpoint (default: fast)")
    gen.add_argument("--workers", type=positive_int, default=DEFAULTS.generators.workers, metavar="K",
                     help="K > 1: a Locust master and K local worker processes (default: 1, one process, no master; "
                     "with --expect-workers only the remote workers generate load unless K > 1)")
    gen.add_argument("--expect-workers", type=int, default=DEFAULTS.generators.expect_workers, metavar="N",
                     help="also wait for N 'mme bench-worker' processes from other machines")
    gen.add_argument("--master-bind-host", default=DEFAULTS.generators.master_bind_host, metavar="ADDRESS",
                     help="where the master listens (default: 127.0.0.1, this machine only); give this host's "
                     "address to accept 'mme bench-worker' from other machines")
    gen.add_argument("--master-port", type=int, default=DEFAULTS.generators.master_port, metavar="PORT",
                     help=f"master port (default: {WORKER_MASTER_PORT} with --expect-workers, mme bench-worker's default; "
                     "else any free port)")
    gen.add_argument("--worker-token", default=DEFAULTS.generators.worker_token, metavar="TOKEN",
                     help="shared secret workers must present (default: $MME_BENCH_WORKER_TOKEN, else one is "
                     "made for the run and printed in the line that says how to join)")
    gen.add_argument("--worker-wait", type=positive_float, default=DEFAULTS.generators.worker_wait, metavar="S",
                     help="how long to wait for workers to connect (default: 60)")
    gen.add_argument("--timeout", type=positive_float, default=DEFAULTS.client.timeout, metavar="S", help="per-request timeout (default: 60)")
    gen.add_argument("--seed", type=int, help="seed for target picking")

    stop = p.add_argument_group("stop conditions and output")
    stop.add_argument("--stop-on-failure", action="store_true", help="stop at the first failed request")
    stop.add_argument("--max-p95-ms", type=positive_float, metavar="X", help="stop when a stage's p95 latency exceeds X ms")
    stop.add_argument("--drain", type=non_negative_float, metavar="S",
                      help="when the run ends (shape done, a stop condition, Ctrl-C), no new request starts and those "
                           "in flight get S seconds to answer; any still in flight then are recorded as cut off "
                           "(default: --timeout). A second Ctrl-C cuts the drain short")
    stop.add_argument("--max-failure-rate", type=share, default=DEFAULTS.stops.max_failure_rate, metavar="F",
                      help="exit with code 1 when more than this share of requests failed (default: %(default)s)")
    stop.add_argument("--out", default=DEFAULTS.output.out, help="results root; the run goes to OUT/<run-id>/ (default: %(default)s)")
    stop.add_argument("--run-id", help="name of the run directory (default: <UTC time>-<model or endpoint>)")
    stop.add_argument("--progress-interval", type=positive_float, default=DEFAULTS.output.progress_interval, metavar="S",
                      help="seconds between progress lines on stderr (default: 5)")
    stop.add_argument("--metrics-interval", type=positive_float, default=DEFAULTS.output.metrics_interval, metavar="S",
                      help="seconds between snapshots of the endpoint's metrics within a stage, where it serves "
                           "/metrics.json (also one before the run and one at each stage end; default: 10)")
    p.set_defaults(func=run_bench)


def register_worker(subparsers) -> None:
    p = subparsers.add_parser(
        "bench-worker",
        help="join a running 'mme bench --expect-workers N' from another machine as a load-generator worker",
        description="Connect to a bench master, receive its configuration (endpoint, payload, targets) and generate "
        "the load it assigns; each worker reads AWS credentials from its own botocore chain.",
    )
    p.add_argument("--master-host", required=True, help="the machine running 'mme bench'")
    p.add_argument("--master-port", type=int, default=WORKER_MASTER_PORT,
                   help="its --master-port (default: %(default)s, the master's default with --expect-workers)")
    p.add_argument("--token", default=None, help="the master's worker token, as its 'waiting for' line prints it "
                   "(default: $MME_BENCH_WORKER_TOKEN)")
    p.set_defaults(func=run_worker)


# -- mme bench ------------------------------------------------------------------------------
def run_bench(args: argparse.Namespace) -> int:
    from bench.config import TOO_MANY_FAILURES

    result = start_bench(BenchRequest.from_args(args), Reporter(quiet=args.quiet))
    if result.code in (0, TOO_MANY_FAILURES):
        print(result.run_dir)
        if result.stopped_by is not None:
            return 128 + result.stopped_by  # 130 for Ctrl-C, 143 for SIGTERM
        return 1 if result.code else 0  # the generator said which failures, and how many
    if result.partial:
        print(f"partial results in {result.run_dir}", file=sys.stderr)
    if result.code in (2, 3):
        return result.code  # the generator printed the one-line error
    raise MmeError(f"the load generator exited with {result.code}; see the messages above")


# -- mme bench-worker -------------------------------------------------------------------------
def run_worker(args: argparse.Namespace) -> int:
    reporter = Reporter(quiet=args.quiet)
    reporter.info(f"==> bench worker joining {args.master_host}:{args.master_port}; Ctrl-C leaves")
    command = [sys.executable, "-m", "bench.worker", "--master-host", args.master_host, "--master-port", str(args.master_port)]
    code, _ = run_child(command, reporter, worker_token_env(args.token))  # the environment, not 'ps', carries it
    return code
