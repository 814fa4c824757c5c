"""What a load test was asked for, typed: ``BenchRequest``, and ``start_bench`` that checks it
and runs it.

``mme bench`` fills a request from its options, one sub-record per option group (their
defaults are these records' defaults); library callers (``mme demo``) build one directly. Everything a user can get wrong is
checked in ``build_bench_config`` before the run directory exists: payload, shape, targets, the
endpoint answering. The run itself happens in a fresh ``python -m bench.run`` process
(Locust monkey-patches the standard library on import), which writes ``<out>/<run-id>/``;
Ctrl-C and SIGTERM are passed on to it, so it stops its users and saves what was measured.
The workers' token (``--worker-token``) reaches it through its environment, never a file.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import get_type_hints

from bench import payload as payloads
from bench.child import CHILD_GRACE_S, run_child
from bench.config import (
    LOOPBACK,
    TOKEN_ENV,
    TOO_MANY_FAILURES,
    WORKER_MASTER_PORT,
    BenchConfig,
    ClientSettings,
    EndpointSettings,
    GeneratorSettings,
    InProcessResult,
    LoadSettings,
    MixPlan,
    RunOutput,
    StopConditions,
    TargetSettings,
)
from bench.endpoint import check_reachable, fetch_mode, fetch_targets, resolve_address, resolve_credentials
from bench.in_process import check_in_process_artifact, measure_in_process
from bench.mix import build_mix
from bench.results import REQUESTS_FILE
from bench.stages import build_load_plan
from bench.targets import parse_distribution, resolve_targets, served_renumbering
from mme.errors import MmeError, OutputDirError, UsageError
from mme.progress import Reporter


def _option(dest: str) -> dict[str, str]:
    """A field's metadata naming its ``mme bench`` option where the field's own name differs."""
    return {"option": dest}


@dataclass(frozen=True)
class EndpointOptions:
    name: str = field(metadata=_option("endpoint"))  # --endpoint
    url: str | None = field(default=None, metadata=_option("endpoint_url"))
    region: str | None = None
    mode: str = "multi"  # multi: a TargetModel per request; single: a real-time endpoint
    instance_type: str | None = None


@dataclass(frozen=True)
class TargetOptions:
    model: str | None = None
    copies: int | None = None  # None: as a local endpoint serves them, else 1
    distribution: str = "uniform"
    template: str | None = field(default=None, metadata=_option("target_template"))
    seed: int | None = None


@dataclass(frozen=True)
class PayloadOptions:
    artifact: str | None = None
    binary: bool = False
    file: str | None = field(default=None, metadata=_option("payload"))  # --payload
    content_type: str | None = None
    accept: str = "*/*"


@dataclass(frozen=True)
class FleetOptions:
    mix: str | None = None  # a fleet's traffic (zipf:S or a TOML file of rates) over --catalogue's models
    catalogue: str | None = None
    artifacts: str = "artifacts"  # where --catalogue was packaged
    format: str | None = field(default=None, metadata=_option("mix_format"))  # of each entry sent (default: its first)
    rps: float | None = None  # a zipf mix's total requests/s (only its ratios matter to a closed loop)


@dataclass(frozen=True)
class LoadOptions:
    shape: str = "staged"
    users: int | None = None
    duration: float | None = None
    steps: int | None = None
    rate: float | None = None
    max_inflight: int = 1000
    time_scale: float | None = None
    peak_users: int | None = None  # staged: the article's stages scaled to peak at this many users
    wait: tuple[float, float] = (0.05, 0.5)
    warmup: bool = False  # load every target before the first stage
    in_process: float = 0.0  # seconds of the artifact's model run in-process before the load (0: not)


@dataclass(frozen=True)
class ClientOptions:
    kind: str = field(default="fast", metadata=_option("client"))  # --client
    timeout: float = 60.0


@dataclass(frozen=True)
class GeneratorOptions:
    workers: int = 1
    expect_workers: int = 0
    master_bind_host: str | None = None  # default: loopback only
    master_port: int | None = None  # None: WORKER_MASTER_PORT with --expect-workers, else any free port
    worker_token: str | None = None  # default: $MME_BENCH_WORKER_TOKEN, else one made for the run
    worker_wait: float = 60.0


@dataclass(frozen=True)
class StopOptions:
    stop_on_failure: bool = False
    max_p95_ms: float | None = None
    drain: float | None = None  # seconds requests in flight get when the run ends; default: the timeout
    max_failure_rate: float = 0.01  # exit non-zero above this share of failed requests


@dataclass(frozen=True)
class OutputOptions:
    out: str = "results"
    run_id: str | None = None
    progress_interval: float = 5.0
    metrics_interval: float = 10.0
    quiet: bool = False


@dataclass(frozen=True)
class BenchRequest:
    """One load test, in ``mme bench``'s option groups. A field's option is its name (or the
    ``option`` in its metadata); defaults are the options' defaults."""

    endpoint: EndpointOptions
    targets: TargetOptions = field(default_factory=TargetOptions)
    payload: PayloadOptions = field(default_factory=PayloadOptions)
    fleet: FleetOptions = field(default_factory=FleetOptions)
    load: LoadOptions = field(default_factory=LoadOptions)
    client: ClientOptions = field(default_factory=ClientOptions)
    generators: GeneratorOptions = field(default_factory=GeneratorOptions)
    stops: StopOptions = field(default_factory=StopOptions)
    output: OutputOptions = field(default_factory=OutputOptions)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "BenchRequest":
        groups = get_type_hints(cls)
        return cls(**{g.name: groups[g.name](**{f.name: getattr(args, f.metadata.get("option", f.name))
                                                for f in fields(groups[g.name])})
                      for g in fields(cls)})


DEFAULTS = BenchRequest(endpoint=EndpointOptions(name=""))


@dataclass(frozen=True)
class BenchResult:
    """How a run ended: the generator's exit code, the signal that stopped it (if any) and its directory."""

    run_dir: Path
    code: int
    stopped_by: int | None = None

    @property
    def partial(self) -> bool:
        return (self.run_dir / REQUESTS_FILE).exists()


def build_bench_config(request: BenchRequest, run_id: str, run_dir: Path,
                       reporter: Reporter | None = None) -> BenchConfig:
    """The generator's configuration, every option checked (UsageError names the one to fix)."""
    e, t, p, load = request.endpoint, request.targets, request.payload, request.load
    mix = _mix(request)
    if p.artifact and p.file:
        raise UsageError("give --artifact or --payload, not both")
    if p.binary and not p.artifact and mix is None:
        raise UsageError("--binary picks the artifact's binary sample request; it needs --artifact (or --mix)")
    if p.content_type and not p.file:
        raise UsageError("--content-type goes with --payload (an artifact's content type is in its manifest)")
    if load.in_process < 0:
        raise UsageError(f"--in-process must be 0 or more seconds (got {load.in_process:g})")
    if load.in_process:
        check_in_process_artifact(p.artifact)
    if p.artifact:
        payload = payloads.from_artifact(Path(p.artifact), binary=p.binary)
    elif p.file:
        payload = payloads.from_file(Path(p.file), p.content_type)
    elif mix is not None:
        payload = mix.payloads[0]
    elif e.mode == "single":
        payload = payloads.default_single_model()
    else:
        raise UsageError("a multi-model bench needs a request body: --artifact artifacts/<model>/<format> "
                         "or --payload FILE --content-type CT")

    distribution = parse_distribution(t.distribution)
    model: str | None
    if mix is not None:
        model = Path(mix.catalogue).stem  # the fleet's name: the run is about all its models
    elif e.mode == "multi":
        model = t.model or payload.model
        if not model:
            raise UsageError("name the model for the target names with --model (or use --artifact)")
    else:
        if t.copies is not None or t.template or t.distribution != "uniform":
            raise UsageError("--mode single sends no TargetModel: --copies, --distribution and --target-template "
                             "apply to multi-model endpoints")
        model = t.model or payload.model

    plan = build_load_plan(load.shape, users=load.users, duration_s=load.duration, rate=load.rate,
                      time_scale=load.time_scale, steps=load.steps, peak_users=load.peak_users)
    if load.rate is not None and not plan.open_loop:
        raise UsageError("--rate applies to --shape open-loop")
    generators = _generators(request.generators)

    address = resolve_address(e.name, e.url, e.region)
    _, credentials_note = resolve_credentials(address)
    check_reachable(address)
    served_mode = fetch_mode(address.url) if address.custom_url else None
    if served_mode is not None and served_mode != e.mode:
        raise UsageError(f"the endpoint at {address.url} is a real-time endpoint (mme serve --mode single): pass "
                         "--mode single" if served_mode == "single" else
                         f"the endpoint at {address.url} is a multi-model endpoint: leave --mode single out")
    targets: tuple[str, ...] = ()
    if mix is not None:
        served = fetch_targets(address.url) if address.custom_url else None
        missing = [name for name in mix.targets if served is not None and name not in served]
        if missing:
            raise UsageError(f"the endpoint at {address.url} does not serve {', '.join(missing[:4])} of the catalogue; "
                             "serve the catalogue's artifacts (mme serve --models DIR with every tarball)")
        targets = mix.targets
    elif e.mode == "multi" and model:  # checked above: a multi-model bench has a model name
        served = fetch_targets(address.url) if address.custom_url else None
        targets = resolve_targets(model, t.copies, t.template, served, f"the endpoint at {address.url}")
        renumbered = served_renumbering(model, served, f"the endpoint at {address.url}")
        if renumbered and reporter is not None:
            reporter.warn(renumbered)

    o, c, s = request.output, request.client, request.stops
    return BenchConfig(
        output=RunOutput(run_id, run_dir, o.progress_interval, o.metrics_interval, o.quiet),
        endpoint=EndpointSettings(address, e.mode, e.instance_type or ("local" if address.is_local else None),
                                  credentials_note),
        targets=TargetSettings(model, targets, distribution, t.seed, mix),
        payload=payload,
        load=LoadSettings(plan, load.time_scale, load.wait, load.max_inflight, load.warmup),
        client=ClientSettings(c.kind, p.accept or None, c.timeout),
        generators=generators,
        stops=StopConditions(s.stop_on_failure, s.max_p95_ms, c.timeout if s.drain is None else s.drain,
                             s.max_failure_rate),
    )


def _generators(g: GeneratorOptions) -> GeneratorSettings:
    """The generator processes of the run, checked; the master binds loopback unless an address is named
    (Locust's master protocol is unauthenticated)."""
    if g.expect_workers < 0:
        raise UsageError(f"--expect-workers must be 0 or more (got {g.expect_workers})")
    master_port = g.master_port if g.master_port is not None else (WORKER_MASTER_PORT if g.expect_workers else 0)
    if not 0 <= master_port < 65536:
        raise UsageError(f"--master-port must be between 0 and 65535 (got {master_port})")
    if g.expect_workers and not master_port:
        raise UsageError(f"remote workers need a known port: leave --master-port out ({WORKER_MASTER_PORT}, "
                         "mme bench-worker's default) or give one with --expect-workers")
    if g.worker_token is not None and not g.worker_token.strip():
        raise UsageError("--worker-token is empty; give a shared secret, or leave it out and use the one printed")
    if g.master_bind_host is not None and not g.master_bind_host.strip():
        raise UsageError("--master-bind-host is empty; give the address remote workers reach this machine at")
    return GeneratorSettings(g.workers, g.expect_workers, g.master_bind_host or LOOPBACK, master_port, g.worker_wait)


def _mix(r: BenchRequest) -> MixPlan | None:
    """The fleet mix of ``r`` (None without --mix), every conflicting option refused."""
    f = r.fleet
    if f.mix is None:
        if f.catalogue:
            raise UsageError("--catalogue goes with --mix (the traffic over its models)")
        return None
    if not f.catalogue:
        raise UsageError("--mix needs --catalogue FILE: the models whose sample requests are sent")
    clash = [flag for flag, used in (("--artifact", r.payload.artifact), ("--payload", r.payload.file),
                                     ("--copies", r.targets.copies), ("--model", r.targets.model),
                                     ("--target-template", r.targets.template),
                                     ("--mode single", r.endpoint.mode == "single"),
                                     ("--in-process", r.load.in_process),
                                     ("--distribution", r.targets.distribution != "uniform")) if used]
    if clash:
        raise UsageError(f"--mix sends each catalogue model its own sample request: leave {', '.join(clash)} out")
    return build_mix(f.mix, f.catalogue, f.artifacts, f.format, f.rps, r.payload.binary)


def worker_token_env(token: str | None) -> dict[str, str]:
    """The environment entry that hands a given workers' token to a child process (none:
    the child reads ``$MME_BENCH_WORKER_TOKEN``, or the master makes one)."""
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


def start_bench(request: BenchRequest, reporter: Reporter, in_process: InProcessResult | None = None) -> BenchResult:
    """Check ``request``, make its run directory and run the load generator to its end.
    ``in_process``: the baseline ``load.in_process`` asks for, measured already (the demos size
    the load from it), so it is recorded rather than measured again."""
    # Everything is checked before the run directory exists: nothing is created for a run that cannot start.
    config = build_bench_config(request, "", Path(), reporter)
    artifact, seconds = request.payload.artifact, request.load.in_process
    if seconds and artifact:
        config = replace(config, in_process=in_process or measure_in_process(Path(artifact), seconds, reporter))
    out = request.output
    label = config.targets.model or config.endpoint.address.name
    run_id, run_dir = _make_run_dir(Path(out.out), out.run_id or new_run_id(label), bool(out.run_id))
    config = replace(config, output=replace(config.output, run_id=run_id, run_dir=run_dir.resolve()))
    with tempfile.TemporaryDirectory(prefix="mme-bench-") as tmp:
        config_path = Path(tmp) / "config.json"
        config.write(config_path)
        code, stopped_by = run_child([sys.executable, "-m", "bench.run", "--config", str(config_path)], reporter,
                                     worker_token_env(request.generators.worker_token),
                                     grace_s=config.stops.drain_s + CHILD_GRACE_S)
    return BenchResult(run_dir, code, stopped_by)


def run_to_end(request: BenchRequest, quiet: bool = False) -> Path:
    """Run ``request`` to its end and return its run directory; a run stopped by a signal or
    ending with a failure is an MmeError saying so (what the benchmark scripts want)."""
    result = run_to_finding(request, quiet)
    if result.broke:
        raise MmeError(f"the staged load ended with exit code {result.code}; see the message above")
    return result.run_dir


@dataclass(frozen=True)
class LoadOutcome:
    """A run that went to its end: its directory, and whether its failures passed
    ``--max-failure-rate`` (the load broke the endpoint: what the demos report as their finding)."""

    run_dir: Path
    broke: bool
    code: int = 0


def run_to_finding(request: BenchRequest, quiet: bool = False, in_process: InProcessResult | None = None) -> LoadOutcome:
    """Run ``request`` to its end: its directory, and whether the load broke the endpoint (more
    failures than ``stops.max_failure_rate``; ``mme bench`` exits non-zero on that, the demos
    report it). A run stopped by a signal, or that could not run, is an MmeError saying so."""
    result = start_bench(request, Reporter(quiet=quiet), in_process)
    if result.stopped_by is not None:
        raise MmeError(f"the staged load was stopped (signal {result.stopped_by}); what it measured is in {result.run_dir}")
    if result.code not in (0, TOO_MANY_FAILURES):
        raise MmeError(f"the staged load ended with exit code {result.code}; see the message above")
    print(result.run_dir)
    return LoadOutcome(result.run_dir, result.code == TOO_MANY_FAILURES, result.code)
