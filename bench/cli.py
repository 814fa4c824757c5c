"""``mme bench`` (the load generator) and ``mme bench-worker`` (a worker on another machine).

Everything a user can get wrong is checked here, in the ``mme`` process, before the run
starts: payload, shape, targets, the endpoint answering. The run itself happens in a fresh
``python -m bench.run`` process (Locust monkey-patches the standard library on import), which
writes ``<out>/<run-id>/``; this process prints that directory at the end. Ctrl-C stops the
run and keeps what was measured.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from mme.argtypes import positive_float, positive_int
from mme.errors import MmeError, OutputDirError, UsageError
from mme.progress import Reporter

DEFAULT_WAIT = "0.05,0.5"
DEFAULT_MAX_INFLIGHT = 1000
CHILD_GRACE_S = 60.0  # after Ctrl-C, how long the generator may take to save its results


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
                        "(default: AWS's SageMaker runtime for --region)")
    target.add_argument("--region", help="AWS region (default: botocore's configured region, else us-east-1)")
    target.add_argument("--mode", choices=("multi", "single"), default="multi",
                        help="multi: a TargetModel per request (MME); single: a real-time endpoint (default: multi)")
    target.add_argument("--model", help="model name in the target names (default: the artifact's)")
    target.add_argument("--copies", type=positive_int, default=1, metavar="N",
                        help="spread requests over <model>-v1..vN.tar.gz (default: 1)")
    target.add_argument("--distribution", default="uniform", metavar="uniform|zipf:S",
                        help="how targets are picked: uniform, or Zipf-skewed toward v1 (e.g. zipf:1.1)")
    target.add_argument("--target-template", default=None, metavar="TEMPLATE",
                        help="target names if copies are named differently (default: '{model}-v{i}.tar.gz')")
    target.add_argument("--instance-type", help="recorded in run.json, e.g. ml.g5.2xlarge (default: 'local' for local URLs)")

    body = p.add_argument_group("payload")
    body.add_argument("--artifact", metavar="DIR", help="artifacts/<model>/<format>: send its manifest's sample request")
    body.add_argument("--binary", action="store_true", help="with --artifact: the binary+json sample instead of JSON")
    body.add_argument("--payload", metavar="FILE", help="send this file's bytes")
    body.add_argument("--content-type", metavar="CT", help="Content-Type of --payload (default for .json: application/json)")
    body.add_argument("--accept", default="*/*", help="Accept header (default: %(default)s)")

    load = p.add_argument_group("load shape")
    load.add_argument("--shape", default="staged", metavar="SHAPE",
                      help="staged (the article's 10..200 users over 340 s), ramp, constant, file:PATH (JSON list of "
                      '{"duration": cumulative_end_s, "users": n, "spawn_rate": r}) or open-loop (default: staged)')
    load.add_argument("--users", type=positive_int, help="ramp/constant: users")
    load.add_argument("--duration", type=positive_float, metavar="S", help="ramp/constant/open-loop: seconds")
    load.add_argument("--steps", type=positive_int, help="ramp: stages the ramp is reported in (default: up to 10)")
    load.add_argument("--rate", type=positive_float, metavar="R", help="open-loop: requests per second, all generators")
    load.add_argument("--max-inflight", type=positive_int, default=DEFAULT_MAX_INFLIGHT, metavar="N",
                      help="open-loop: cap on requests in flight; arrivals beyond it start late and are counted (1000)")
    load.add_argument("--time-scale", type=positive_float, metavar="F",
                      help="staged/file: run the shape F times as long (0.1: the 340 s staged shape in 34 s)")
    load.add_argument("--wait", type=_wait_range, default=_wait_range(DEFAULT_WAIT), metavar="MIN,MAX",
                      help=f"closed loop: seconds each user waits between requests (default: {DEFAULT_WAIT})")

    gen = p.add_argument_group("generator")
    gen.add_argument("--client", choices=("fast", "boto3"), default="fast",
                     help="fast: SigV4 over geventhttpclient; boto3: the articles' invoke_endpoint (default: fast)")
    gen.add_argument("--workers", type=positive_int, default=1, metavar="K",
                     help="K > 1: a Locust master and K local worker processes (default: 1, one process, no master; "
                     "with --expect-workers only the remote workers generate load unless K > 1)")
    gen.add_argument("--expect-workers", type=int, default=0, metavar="N",
                     help="also wait for N 'mme bench-worker' processes from other machines")
    gen.add_argument("--master-bind-host", default=None, metavar="HOST",
                     help="where the master listens (default: 127.0.0.1; 0.0.0.0 with --expect-workers)")
    gen.add_argument("--master-port", type=int, default=0, metavar="PORT", help="master port (default: any free port)")
    gen.add_argument("--worker-wait", type=positive_float, default=60.0, metavar="S",
                     help="how long to wait for workers to connect (default: 60)")
    gen.add_argument("--timeout", type=positive_float, default=60.0, metavar="S", help="per-request timeout (default: 60)")
    gen.add_argument("--seed", type=int, help="seed for target picking")

    stop = p.add_argument_group("stop conditions and output")
    stop.add_argument("--stop-on-failure", action="store_true", help="stop at the first failed request")
    stop.add_argument("--max-p95-ms", type=positive_float, metavar="X", help="stop when a stage's p95 latency exceeds X ms")
    stop.add_argument("--out", default="results", help="results root; the run goes to OUT/<run-id>/ (default: %(default)s)")
    stop.add_argument("--run-id", help="name of the run directory (default: <UTC time>-<model or endpoint>)")
    stop.add_argument("--progress-interval", type=positive_float, default=5.0, metavar="S",
                      help="seconds between progress lines on stderr (default: 5)")
    stop.add_argument("--metrics-interval", type=positive_float, default=10.0, metavar="S",
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
    p.add_argument("--master-port", type=int, default=5557, help="its --master-port (default: %(default)s)")
    p.set_defaults(func=run_worker)


# -- mme bench ------------------------------------------------------------------------------
def build_config(args: argparse.Namespace, run_id: str, run_dir: Path):
    from bench import payload as payloads
    from bench.config import BenchConfig
    from bench.endpoint import check_reachable, resolve_address, resolve_credentials
    from bench.stages import build_plan
    from bench.targets import DEFAULT_TEMPLATE, parse_distribution, target_names

    if args.artifact and args.payload:
        raise UsageError("give --artifact or --payload, not both")
    if args.binary and not args.artifact:
        raise UsageError("--binary picks the artifact's binary sample request; it needs --artifact")
    if args.content_type and not args.payload:
        raise UsageError("--content-type goes with --payload (an artifact's content type is in its manifest)")
    if args.artifact:
        payload = payloads.from_artifact(Path(args.artifact), binary=args.binary)
    elif args.payload:
        payload = payloads.from_file(Path(args.payload), args.content_type)
    elif args.mode == "single":
        payload = payloads.default_single_model()
    else:
        raise UsageError("a multi-model bench needs a request body: --artifact artifacts/<model>/<format> "
                         "or --payload FILE --content-type CT")

    distribution = parse_distribution(args.distribution)
    if args.mode == "multi":
        model = args.model or payload.model
        if not model:
            raise UsageError("name the model for the target names with --model (or use --artifact)")
        targets = target_names(model, args.copies, args.target_template or DEFAULT_TEMPLATE)
    else:
        if args.copies != 1 or args.target_template or args.distribution != "uniform":
            raise UsageError("--mode single sends no TargetModel: --copies, --distribution and --target-template "
                             "apply to multi-model endpoints")
        model, targets = args.model or payload.model, ()

    plan = build_plan(args.shape, users=args.users, duration_s=args.duration, rate=args.rate,
                      time_scale=args.time_scale, steps=args.steps)
    if args.rate is not None and not plan.open_loop:
        raise UsageError("--rate applies to --shape open-loop")
    if args.expect_workers < 0:
        raise UsageError(f"--expect-workers must be 0 or more (got {args.expect_workers})")
    if not 0 <= args.master_port < 65536:
        raise UsageError(f"--master-port must be between 0 and 65535 (got {args.master_port})")
    if args.expect_workers and not args.master_port:
        raise UsageError("remote workers need a known port: give --master-port (e.g. 5557) with --expect-workers")

    address = resolve_address(args.endpoint, args.endpoint_url, args.region)
    _, credentials_note = resolve_credentials(address)
    check_reachable(address)

    bind = args.master_bind_host or ("0.0.0.0" if args.expect_workers else "127.0.0.1")
    return BenchConfig(
        run_id=run_id, run_dir=str(run_dir), endpoint=address.name, endpoint_url=address.url,
        custom_url=address.custom_url, region=address.region, mode=args.mode, model=model, format=payload.format,
        instance_type=args.instance_type or ("local" if address.is_local else None), targets=targets,
        distribution=str(distribution), client=args.client, workers=args.workers, expect_workers=args.expect_workers,
        master_bind_host=bind, master_port=args.master_port, worker_wait_s=args.worker_wait, plan=plan.to_json(),
        shape=plan.kind, time_scale=args.time_scale, wait_min_s=args.wait[0], wait_max_s=args.wait[1],
        max_inflight=args.max_inflight, content_type=payload.content_type, accept=args.accept or None,
        payload_b64=base64.b64encode(payload.body).decode(), payload_source=payload.source,
        stop_on_failure=args.stop_on_failure, max_p95_ms=args.max_p95_ms, timeout_s=args.timeout,
        progress_interval_s=args.progress_interval, metrics_interval_s=args.metrics_interval, quiet=args.quiet, credentials_note=credentials_note, seed=args.seed,
    )


def new_run_id(label: str | None, now: datetime | None = None) -> str:
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%d-%H%M%S")
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "-", label or "").strip("-.")
    return f"{stamp}-{clean}" if clean else stamp


def _make_run_dir(out: Path, run_id: str, explicit: bool) -> tuple[str, Path]:
    try:
        out.mkdir(parents=True, exist_ok=True)
        candidate, n = run_id, 1
        while True:
            run_dir = out / candidate
            try:
                run_dir.mkdir()
                return candidate, run_dir
            except FileExistsError:
                if explicit:
                    raise OutputDirError(f"{run_dir} already exists; choose another --run-id") from None
                n += 1
                candidate = f"{run_id}-{n}"
    except OSError as exc:
        raise OutputDirError(f"cannot create the run directory under {out} ({exc.strerror}); choose another --out") from None


def _child_env() -> dict:
    root = str(Path(__file__).resolve().parent.parent)
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))


class _Terminated(Exception):
    """SIGTERM reached mme bench."""


def _raise_terminated(signum, frame) -> None:
    raise _Terminated


def _run_child(command: list[str], reporter: Reporter) -> tuple[int, int | None]:
    """Run the generator process; Ctrl-C and SIGTERM are passed on (the generator stops its
    users and saves what was measured). Returns its exit code and the signal that stopped the
    run, if any."""
    child = subprocess.Popen(command, env=_child_env())
    stopped_by: int | None = None
    main_thread = threading.current_thread() is threading.main_thread()  # only it may set handlers
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    try:
        while True:
            try:
                return child.wait(timeout=CHILD_GRACE_S if stopped_by else None), stopped_by
            except (KeyboardInterrupt, _Terminated) as exc:
                sig = signal.SIGINT if isinstance(exc, KeyboardInterrupt) else signal.SIGTERM
                if stopped_by is None:
                    stopped_by = sig
                    if child.poll() is None:
                        child.send_signal(sig)
                    continue
                child.kill()
                return child.wait(), stopped_by
            except subprocess.TimeoutExpired:
                reporter.warn("the load generator did not stop in time; killing it (results may be partial)")
                child.kill()
                return child.wait(), stopped_by
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def run_bench(args: argparse.Namespace) -> int:
    reporter = Reporter(quiet=args.quiet)
    # Everything is checked before the run directory exists: nothing is created for a run that cannot start.
    config = build_config(args, "", Path())
    label = config.model or config.endpoint
    run_id, run_dir = _make_run_dir(Path(args.out), args.run_id or new_run_id(label), bool(args.run_id))
    config = replace(config, run_id=run_id, run_dir=str(run_dir.resolve()))
    with tempfile.TemporaryDirectory(prefix="mme-bench-") as tmp:
        config_path = Path(tmp) / "config.json"
        config.write(config_path)
        code, stopped_by = _run_child([sys.executable, "-m", "bench.run", "--config", str(config_path)], reporter)
    if code == 0:
        print(run_dir)
        return 0 if stopped_by is None else 128 + stopped_by  # 130 for Ctrl-C, 143 for SIGTERM
    if (run_dir / "requests.csv").exists():
        print(f"partial results in {run_dir}", file=sys.stderr)
    if code in (2, 3):
        return code  # the generator printed the one-line error
    raise MmeError(f"the load generator exited with {code}; see the messages above")


# -- mme bench-worker -------------------------------------------------------------------------
def run_worker(args: argparse.Namespace) -> int:
    reporter = Reporter(quiet=args.quiet)
    reporter.info(f"==> bench worker joining {args.master_host}:{args.master_port}; Ctrl-C leaves")
    command = [sys.executable, "-m", "bench.worker", "--master-host", args.master_host, "--master-port", str(args.master_port)]
    code, _ = _run_child(command, reporter)
    return code
