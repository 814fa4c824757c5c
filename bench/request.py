"""What a load test was asked for, typed: ``BenchRequest``, and ``start_bench`` that checks it
and runs it.

``mme bench`` fills a request from its options (their defaults are this record's defaults);
library callers (``mme demo``) build one directly. Everything a user can get wrong is
checked in ``build_config`` before the run directory exists: payload, shape, targets, the
endpoint answering. The run itself happens in a fresh ``python -m bench.run`` process
(Locust monkey-patches the standard library on import), which writes ``<out>/<run-id>/``;
Ctrl-C and SIGTERM are passed on to it, so it stops its users and saves what was measured.
The workers' token (``--worker-token``) reaches it through its environment, never a file.
"""

from __future__ import annotations

import argparse
import base64
import re
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from mme.errors import OutputDirError, UsageError
from mme.process import child_env
from mme.progress import Reporter

if TYPE_CHECKING:
    from bench.config import BenchConfig

CHILD_GRACE_S = 60.0  # after Ctrl-C and the drain, how long the generator may take to save its results


@dataclass(frozen=True)
class BenchRequest:
    """One load test. Field names are ``mme bench``'s option names; defaults are its defaults."""

    endpoint: str
    endpoint_url: str | None = None
    region: str | None = None
    mode: str = "multi"  # multi: a TargetModel per request; single: a real-time endpoint
    model: str | None = None
    copies: int | None = None  # None: as a local endpoint serves them, else 1
    distribution: str = "uniform"
    target_template: str | None = None
    instance_type: str | None = None
    artifact: str | None = None
    binary: bool = False
    payload: str | None = None
    content_type: str | None = None
    accept: str = "*/*"
    shape: str = "staged"
    users: int | None = None
    duration: float | None = None
    steps: int | None = None
    rate: float | None = None
    max_inflight: int = 1000
    time_scale: float | None = None
    wait: tuple[float, float] = (0.05, 0.5)
    client: str = "fast"
    workers: int = 1
    expect_workers: int = 0
    master_bind_host: str | None = None  # default: loopback only
    master_port: int | None = None  # None: WORKER_MASTER_PORT with --expect-workers, else any free port
    worker_token: str | None = None  # default: $MME_BENCH_WORKER_TOKEN, else one made for the run
    worker_wait: float = 60.0
    timeout: float = 60.0
    seed: int | None = None
    stop_on_failure: bool = False
    max_p95_ms: float | None = None
    drain: float | None = None  # seconds requests in flight get when the run ends; default: timeout
    max_failure_rate: float = 0.01  # exit non-zero above this share of failed requests
    warmup: bool = False  # load every target before the first stage
    in_process: float = 0.0  # seconds of the artifact's model run in-process before the load (0: not)
    mix: str | None = None  # a fleet's traffic (zipf:S or a TOML file of rates) over --catalogue's models
    catalogue: str | None = None
    artifacts: str = "artifacts"  # where --catalogue was packaged
    mix_format: str | None = None  # the format of each entry sent (default: its first)
    rps: float | None = None  # a zipf mix's total requests/s (only its ratios matter to a closed loop)
    out: str = "results"
    run_id: str | None = None
    progress_interval: float = 5.0
    metrics_interval: float = 10.0
    quiet: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "BenchRequest":
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


DEFAULTS = BenchRequest(endpoint="")


@dataclass(frozen=True)
class BenchResult:
    """How a run ended: the generator's exit code, the signal that stopped it (if any) and its directory."""

    run_dir: Path
    code: int
    stopped_by: int | None = None

    @property
    def partial(self) -> bool:
        return (self.run_dir / "requests.csv").exists()


def build_config(request: BenchRequest, run_id: str, run_dir: Path) -> "BenchConfig":
    """The generator's configuration, every option checked (UsageError names the one to fix)."""
    from bench import payload as payloads
    from bench.config import LOOPBACK, WORKER_MASTER_PORT, BenchConfig
    from bench.endpoint import check_reachable, fetch_mode, fetch_targets, resolve_address, resolve_credentials
    from bench.stages import build_plan
    from bench.targets import parse_distribution, resolve_targets

    r = request
    mix = _mix(r)
    if r.artifact and r.payload:
        raise UsageError("give --artifact or --payload, not both")
    if r.binary and not r.artifact and mix is None:
        raise UsageError("--binary picks the artifact's binary sample request; it needs --artifact (or --mix)")
    if r.content_type and not r.payload:
        raise UsageError("--content-type goes with --payload (an artifact's content type is in its manifest)")
    if r.in_process < 0:
        raise UsageError(f"--in-process must be 0 or more seconds (got {r.in_process:g})")
    if r.in_process:
        from bench.in_process import check_artifact

        check_artifact(r.artifact)
    if r.artifact:
        payload = payloads.from_artifact(Path(r.artifact), binary=r.binary)
    elif r.payload:
        payload = payloads.from_file(Path(r.payload), r.content_type)
    elif mix is not None:
        payload = mix.payloads[0]
    elif r.mode == "single":
        payload = payloads.default_single_model()
    else:
        raise UsageError("a multi-model bench needs a request body: --artifact artifacts/<model>/<format> "
                         "or --payload FILE --content-type CT")

    distribution = parse_distribution(r.distribution)
    model: str | None
    if mix is not None:
        model = Path(str(r.catalogue)).stem  # the fleet's name: the run is about all its models
    elif r.mode == "multi":
        model = r.model or payload.model
        if not model:
            raise UsageError("name the model for the target names with --model (or use --artifact)")
    else:
        if r.copies is not None or r.target_template or r.distribution != "uniform":
            raise UsageError("--mode single sends no TargetModel: --copies, --distribution and --target-template "
                             "apply to multi-model endpoints")
        model = r.model or payload.model

    plan = build_plan(r.shape, users=r.users, duration_s=r.duration, rate=r.rate, time_scale=r.time_scale,
                      steps=r.steps)
    if r.rate is not None and not plan.open_loop:
        raise UsageError("--rate applies to --shape open-loop")
    if r.expect_workers < 0:
        raise UsageError(f"--expect-workers must be 0 or more (got {r.expect_workers})")
    master_port = r.master_port if r.master_port is not None else (WORKER_MASTER_PORT if r.expect_workers else 0)
    if not 0 <= master_port < 65536:
        raise UsageError(f"--master-port must be between 0 and 65535 (got {master_port})")
    if r.expect_workers and not master_port:
        raise UsageError(f"remote workers need a known port: leave --master-port out ({WORKER_MASTER_PORT}, "
                         "mme bench-worker's default) or give one with --expect-workers")
    if r.worker_token is not None and not r.worker_token.strip():
        raise UsageError("--worker-token is empty; give a shared secret, or leave it out and use the one printed")
    if r.master_bind_host is not None and not r.master_bind_host.strip():
        raise UsageError("--master-bind-host is empty; give the address remote workers reach this machine at")

    address = resolve_address(r.endpoint, r.endpoint_url, r.region)
    _, credentials_note = resolve_credentials(address)
    check_reachable(address)
    served_mode = fetch_mode(address.url) if address.custom_url else None
    if served_mode is not None and served_mode != r.mode:
        raise UsageError(f"the endpoint at {address.url} is a real-time endpoint (mme serve --mode single): pass "
                         "--mode single" if served_mode == "single" else
                         f"the endpoint at {address.url} is a multi-model endpoint: leave --mode single out")
    targets: tuple[str, ...] = ()
    if mix is not None:
        served = fetch_targets(address.url) if address.custom_url else None
        missing = [t for t in mix.targets if served is not None and t not in served]
        if missing:
            raise UsageError(f"the endpoint at {address.url} does not serve {', '.join(missing[:4])} of the catalogue; "
                             "serve the catalogue's artifacts (mme serve --models DIR with every tarball)")
        targets = mix.targets
    elif r.mode == "multi" and model:  # checked above: a multi-model bench has a model name
        served = fetch_targets(address.url) if address.custom_url else None
        targets = resolve_targets(model, r.copies, r.target_template, served, f"the endpoint at {address.url}")

    # Locust's master protocol is unauthenticated: loopback unless the user names an address.
    bind = r.master_bind_host or LOOPBACK
    return BenchConfig(
        run_id=run_id, run_dir=str(run_dir), endpoint=address.name, endpoint_url=address.url,
        custom_url=address.custom_url, region=address.region, mode=r.mode, model=model, format=payload.format,
        instance_type=r.instance_type or ("local" if address.is_local else None), targets=targets,
        distribution=str(distribution), client=r.client, workers=r.workers, expect_workers=r.expect_workers,
        master_bind_host=bind, master_port=master_port, worker_wait_s=r.worker_wait, plan=plan.to_json(),
        shape=plan.kind, time_scale=r.time_scale, wait_min_s=r.wait[0], wait_max_s=r.wait[1],
        max_inflight=r.max_inflight, content_type=payload.content_type, accept=r.accept or None,
        payload_b64=base64.b64encode(payload.body).decode(), payload_source=payload.source,
        stop_on_failure=r.stop_on_failure, max_p95_ms=r.max_p95_ms, timeout_s=r.timeout,
        drain_s=r.timeout if r.drain is None else r.drain, max_failure_rate=r.max_failure_rate, warmup=r.warmup,
        progress_interval_s=r.progress_interval, metrics_interval_s=r.metrics_interval, quiet=r.quiet,
        credentials_note=credentials_note, seed=r.seed,
        mix=None if mix is None else mix.to_json() | {"spec": r.mix, "catalogue": r.catalogue},
        mix_payloads=None if mix is None else [[base64.b64encode(p.body).decode(), p.content_type] for p in mix.payloads],
    )


def _mix(r: BenchRequest):
    """The fleet mix of ``r`` (None without --mix), every conflicting option refused."""
    if r.mix is None:
        if r.catalogue:
            raise UsageError("--catalogue goes with --mix (the traffic over its models)")
        return None
    if not r.catalogue:
        raise UsageError("--mix needs --catalogue FILE: the models whose sample requests are sent")
    clash = [flag for flag, used in (("--artifact", r.artifact), ("--payload", r.payload), ("--copies", r.copies),
                                     ("--model", r.model), ("--target-template", r.target_template),
                                     ("--mode single", r.mode == "single"), ("--in-process", r.in_process),
                                     ("--distribution", r.distribution != "uniform")) if used]
    if clash:
        raise UsageError(f"--mix sends each catalogue model its own sample request: leave {', '.join(clash)} out")
    from bench.mix import build_mix

    return build_mix(r.mix, r.catalogue, r.artifacts, r.mix_format, r.rps, r.binary)


def worker_token_env(token: str | None) -> dict[str, str]:
    """The environment entry that hands a given workers' token to a child process (none:
    the child reads ``$MME_BENCH_WORKER_TOKEN``, or the master makes one)."""
    from bench.config import TOKEN_ENV

    return {TOKEN_ENV: token} if token else {}


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


class _Terminated(Exception):
    """SIGTERM reached the process that started the run."""


def _raise_terminated(signum, frame) -> None:
    raise _Terminated


def run_child(command: list[str], reporter: Reporter, extra_env: Mapping[str, str] | None = None,
              grace_s: float = CHILD_GRACE_S) -> tuple[int, int | None]:
    """Run a generator process (``extra_env`` added to its environment); Ctrl-C and SIGTERM
    are passed on: the first makes the generator drain and save what was measured, the second
    cuts its drain short, a third (or ``grace_s`` without an end) kills it. The child has a
    process group of its own, so a terminal's Ctrl-C reaches it once, through here. Returns its
    exit code and the signal that stopped the run, if any."""
    child = subprocess.Popen(command, env=child_env(extra=extra_env), process_group=0)
    stopped_by: int | None = None
    signals = 0
    main_thread = threading.current_thread() is threading.main_thread()  # only it may set handlers
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    try:
        while True:
            try:
                return child.wait(timeout=grace_s if stopped_by else None), stopped_by
            except (KeyboardInterrupt, _Terminated) as exc:
                sig = signal.SIGINT if isinstance(exc, KeyboardInterrupt) else signal.SIGTERM
                signals += 1
                stopped_by = stopped_by or sig
                if signals <= 2:
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


def start_bench(request: BenchRequest, reporter: Reporter) -> BenchResult:
    """Check ``request``, make its run directory and run the load generator to its end."""
    # Everything is checked before the run directory exists: nothing is created for a run that cannot start.
    config = build_config(request, "", Path())
    if request.in_process and request.artifact:
        from bench.in_process import measure_in_process

        baseline = measure_in_process(Path(request.artifact), request.in_process, reporter)
        config = replace(config, in_process=baseline.to_dict())
    label = config.model or config.endpoint
    run_id, run_dir = _make_run_dir(Path(request.out), request.run_id or new_run_id(label), bool(request.run_id))
    config = replace(config, run_id=run_id, run_dir=str(run_dir.resolve()))
    with tempfile.TemporaryDirectory(prefix="mme-bench-") as tmp:
        config_path = Path(tmp) / "config.json"
        config.write(config_path)
        code, stopped_by = run_child([sys.executable, "-m", "bench.run", "--config", str(config_path)], reporter,
                                     worker_token_env(request.worker_token), grace_s=config.drain_s + CHILD_GRACE_S)
    return BenchResult(run_dir, code, stopped_by)
