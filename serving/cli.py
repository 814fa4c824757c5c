"""``mme serve``: a local SageMaker multi-model endpoint on a real Triton server."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import threading

from mme.argtypes import byte_size, fraction, positive_float, positive_int
from mme.progress import Reporter
from serving.monitor.memory import MEMORY_KINDS
from serving.runtime.sigv4_verify import ACCESS_KEY_ENV, SECRET_KEY_ENV
from serving.triton.factory import SERVER_CHOICES, server_help
from serving.triton.sagemaker_serve import MODES, MULTI


def add_triton_network(p: argparse.ArgumentParser) -> None:
    from serving.triton.config import NETWORK_ENV, NETWORKS, default_network

    p.add_argument("--triton-network", choices=NETWORKS, default=default_network(),
                   help="where the local and system server kinds run Triton: 'private', a network namespace of its own "
                        "reached through a Unix socket (needs unshare); 'host', this host's network, where its "
                        "SageMaker port listens on 0.0.0.0 for anyone who can reach the host "
                        f"(default: %(default)s; set ${NETWORK_ENV} to change it)")


def register(subparsers) -> None:
    register_serve(subparsers)
    register_capacity(subparsers)


def register_serve(subparsers) -> None:
    p = subparsers.add_parser(
        "serve",
        help="run a local SageMaker multi-model endpoint in front of a real Triton server",
        description="Serve <name>.tar.gz objects from a directory or S3 prefix the way a SageMaker MME does: "
        "load on first request, evict least recently used models past the memory threshold. Any "
        "sagemaker-runtime client works with endpoint_url=http://HOST:PORT.",
    )
    p.add_argument("--catalogue", metavar="FILE",
                   help="serve every model of a catalogue packaged by 'mme package --catalogue FILE' (multi-model; "
                   "each entry's tarball, named <model>.tar.gz, as 'mme push --catalogue' uploads them)")
    p.add_argument("--artifacts", default="artifacts", help="with --catalogue: where it was packaged (default: %(default)s)")
    p.add_argument("--format", dest="catalogue_format", metavar="FORMAT",
                   help="with --catalogue: the format served of each entry (default: the entry's first)")
    p.add_argument("--models", help="directory (e.g. artifacts/resnet50/cpu-local) or s3://bucket/prefix; "
                   "with --mode single: the model's .tar.gz or its artifact directory")
    p.add_argument("--mode", choices=MODES, default=MULTI,
                   help="multi: a multi-model endpoint, requests name a TargetModel; single: a real-time endpoint "
                   "serving one model.tar.gz as SageMaker's Triton image does without SAGEMAKER_MULTI_MODEL (the model "
                   "loaded at start, requests name no TargetModel) (default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default: %(default)s); on any other address anyone who can reach it can "
                   "invoke, load and evict models unless --require-signature")
    p.add_argument("--port", type=int, default=8080, help="port (default: %(default)s; 0 = any free port)")
    p.add_argument("--memory-threshold", type=fraction, default=0.9, help="evict above this share of the limit (0.9)")
    p.add_argument("--memory-limit", type=byte_size, help="memory the models may use, e.g. 4G (default: GPU memory, or host RAM)")
    p.add_argument("--copies", type=int, default=0, metavar="N",
                   help="also answer for <name>-v1..vN.tar.gz from <name>.tar.gz (no duplicate files)")
    p.add_argument("--instances", type=positive_int, default=1, metavar="N",
                   help="run the endpoint on N instances, each a local MME with its own Triton and --memory-limit, "
                   "behind a router that sends a model's requests to an instance holding it, else to a random one "
                   "(as SageMaker routes an MME with N instances) (default: %(default)s)")
    add_triton_network(p)
    p.add_argument("--server", choices=SERVER_CHOICES, default="auto", help=server_help())
    p.add_argument("--cache-dir", help="where tarballs are extracted as <dir>/<hash>/model (default: /opt/ml/models "
                   "for a Triton that loads only from there, i.e. 2.70+ with --server system; else a temporary directory)")
    p.add_argument("--memory", choices=MEMORY_KINDS, default="auto",
                   help="what the threshold counts: gpu (NVML, whole device), host (RSS of Triton's process tree), "
                   "or auto: the GPU when one is visible unless the models run on the CPU; auto refuses on a GPU host "
                   "without NVML (install it: make install-gpu; or accept host RSS: --memory host) (default: auto)")
    p.add_argument("--s3-endpoint-url", help="S3-compatible endpoint for s3:// sources")
    p.add_argument("--disk-limit", type=byte_size,
                   help="disk the extracted models may use, e.g. 20G; past it the least recently used models that are "
                   "not loaded are deleted, as SageMaker does when the instance disk fills (default: what the cache holds "
                   "plus 90%% of the free space on its filesystem at start)")
    sage = p.add_argument_group("SageMaker's answers (defaults as SageMaker's)")
    sage.add_argument("--endpoint-name", default="local",
                      help="the EndpointName this endpoint answers for; others get ValidationError (default: %(default)s)")
    sage.add_argument("--variant-name", default="AllTraffic",
                      help="its production variant; another TargetVariant gets ValidationError (default: %(default)s)")
    sage.add_argument("--account", default="000000000000", help="AWS account id in error messages and LogStreamArn (default: %(default)s)")
    sage.add_argument("--region", default="us-east-1", help="AWS region in error messages and LogStreamArn (default: %(default)s)")
    sage.add_argument("--model-wait-timeout", type=positive_float, default=60.0, metavar="S",
                      help="a request whose model is still downloading or loading after S seconds gets 429 "
                      "ModelNotReadyException while the load goes on (default: 60, as SageMaker)")
    sage.add_argument("--invocation-timeout", type=positive_float, default=60.0, metavar="S",
                      help="an invocation the container has not answered in S seconds gets ModelError with "
                      "OriginalStatusCode 0 (default: 60, as SageMaker)")
    sage.add_argument("--load-timeout", type=positive_float, default=600.0, metavar="S",
                      help="a model load the container has not finished in S seconds fails its requests with "
                      "InternalFailure (default: %(default)s)")
    sage.add_argument("--allow-unsigned", action="store_true",
                      help="accept requests without a SigV4 signature (SageMaker answers them 403; signatures are "
                      "verified only with --require-signature)")
    sage.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                      help="environment of the serving container, as the SageMaker model's Environment: "
                      "SAGEMAKER_TRITON_* settings start Triton as SageMaker's image does (repeatable; "
                      "SAGEMAKER_TRITON_* variables of this shell are honoured too)")
    access = p.add_argument_group("access (for an endpoint others can reach)")
    access.add_argument("--require-signature", action="store_true",
                        help="answer only invocations SigV4-signed with --access-key-id/--secret-access-key, as AWS "
                        "checks them (other keys: UnrecognizedClientException; wrong secret or a signature older "
                        "than 15 minutes: InvalidSignatureException); /ping, /metrics, /models and /targets stay open")
    access.add_argument("--access-key-id", default=os.environ.get(ACCESS_KEY_ENV),
                        help=f"the access key clients sign with (default: ${ACCESS_KEY_ENV})")
    access.add_argument("--secret-access-key", default=os.environ.get(SECRET_KEY_ENV),
                        help=f"its secret (default: ${SECRET_KEY_ENV}, which keeps it off the command line)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from serving.triton.sagemaker_serve import parse_env_assignments, sagemaker_settings_from_environ

    settings = {**sagemaker_settings_from_environ(os.environ), **parse_env_assignments(args.env)}
    with contextlib.ExitStack() as stack:
        models = _models_to_serve(args, stack)
        return _serve(args, models, settings)


def _models_to_serve(args: argparse.Namespace, stack: contextlib.ExitStack) -> str:
    """--models, or a directory of the --catalogue's tarballs (removed when serve ends)."""
    import tempfile
    from pathlib import Path

    from mme.errors import UsageError

    if bool(args.models) == bool(args.catalogue):
        raise UsageError("mme serve: give --models DIR_OR_S3 or --catalogue FILE (one of them)")
    if not args.catalogue:
        return args.models
    if args.mode == "single":
        raise UsageError("--catalogue serves many models: a multi-model endpoint (leave --mode single out)")
    from packager.catalogue import catalogue_artifacts, fleet_directory

    directories = catalogue_artifacts(Path(args.catalogue), Path(args.artifacts), args.catalogue_format)
    fleet = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mme-fleet-", dir=args.artifacts)))
    return str(fleet_directory(directories, fleet))


def _serve(args: argparse.Namespace, models: str, settings: dict) -> int:
    from pathlib import Path

    from serving.runtime.exposure import client_example, targets_text
    from serving.runtime.local_endpoint import LocalEndpoint, LocalEndpointOptions

    options = LocalEndpointOptions(
        models=models, host=args.host, port=args.port, memory_threshold=args.memory_threshold,
        memory_limit_bytes=args.memory_limit, copies=args.copies, server_kind=args.server,
        cache_dir=Path(args.cache_dir) if args.cache_dir else None, s3_endpoint_url=args.s3_endpoint_url,
        memory=args.memory, endpoint_name=args.endpoint_name, variant_name=args.variant_name, account=args.account,
        region=args.region, model_wait_timeout_s=args.model_wait_timeout, invocation_timeout_s=args.invocation_timeout,
        allow_unsigned=args.allow_unsigned, load_timeout_s=args.load_timeout, sagemaker_env=settings,
        disk_limit_bytes=args.disk_limit, require_signature=args.require_signature,
        access_key_id=args.access_key_id, secret_access_key=args.secret_access_key, triton_network=args.triton_network,
        mode=args.mode,
    )
    reporter = Reporter(quiet=args.quiet)
    if args.instances > 1:
        return _serve_fleet(args, options, models, reporter)
    endpoint = LocalEndpoint(options, reporter)

    def banner() -> None:
        if endpoint.model is not None:
            reporter.info(f"==> local real-time endpoint at {endpoint.url} ({endpoint.model.tarball}; "
                          f"{endpoint.server.name} pid {endpoint.server.pid}; memory: {endpoint.meter.description})")
            reporter.info(f"    model: {endpoint.model.default_model} (SAGEMAKER_TRITON_DEFAULT_MODEL_NAME), loaded; "
                          "requests name no TargetModel")
        else:
            reporter.info(f"==> local MME at {endpoint.url} (models from {args.catalogue or models}; {endpoint.server.name} pid "
                          f"{endpoint.server.pid}; memory: {endpoint.meter.description})")
            reporter.info(f"    TargetModel: {targets_text(endpoint.targets) or 'none yet'}")
        reporter.info(f"    try it: {client_example(endpoint, options)}")
        if endpoint.server.network is not None:
            reporter.info(f"    Triton runs {endpoint.server.network.describe()}")
        if settings:
            reporter.info(f"    Triton started as SageMaker's image starts it, with {', '.join(sorted(settings))}")
        reporter.info(f"    metrics: {endpoint.url}/metrics (Prometheus), {endpoint.url}/metrics.json; Ctrl-C stops")

    return _run_until_stopped(endpoint, banner, reporter)


def _run_until_stopped(server, banner, reporter: Reporter) -> int:
    """Start ``server`` (a LocalEndpoint or LocalFleet), print ``banner()``, serve until Ctrl-C or SIGTERM."""
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        server.start_in_thread()
        banner()
        stop.wait()
    except KeyboardInterrupt:
        reporter.info("==> stopping")
    finally:
        # More Ctrl-Cs (or SIGTERMs) while stopping must not cut the cleanup short: that would leave
        # Triton's work directory and shared-memory segments behind. The stop takes seconds.
        previous_int = signal.signal(signal.SIGINT, lambda *_: reporter.warn("still stopping; one moment"))
        signal.signal(signal.SIGTERM, lambda *_: None)
        try:
            server.stop()
        finally:
            signal.signal(signal.SIGINT, previous_int)
            signal.signal(signal.SIGTERM, previous)
    return 0


def _serve_fleet(args: argparse.Namespace, options, models: str, reporter: Reporter) -> int:
    """``--instances N``: N local MMEs behind the router (serving/runtime/fleet_router.py)."""
    from serving.runtime.exposure import client_example, targets_text
    from serving.runtime.fleet_router import LocalFleet

    fleet = LocalFleet(options, args.instances, reporter)

    def banner() -> None:
        limit = options.memory_limit_bytes
        each = f"each with {limit / 2**20:.0f} MiB" if limit else "each with the whole memory"
        reporter.info(f"==> local MME at {fleet.url} on {args.instances} instances (models from "
                      f"{args.catalogue or models}; {each})")
        for index, member in enumerate(fleet.members):
            reporter.info(f"    instance {index}: {member.url} ({member.server.name} pid {member.server.pid}; "
                          f"memory: {member.meter.description})")
        reporter.info(f"    TargetModel: {targets_text(fleet.targets) or 'none yet'}")
        reporter.info(f"    try it: {client_example(fleet, options)}")
        reporter.info(f"    metrics: {fleet.url}/metrics.json (all instances), {fleet.url}/models; the reply header "
                      "X-Mme-Instance says which instance answered; Ctrl-C stops")

    return _run_until_stopped(fleet, banner, reporter)


def register_capacity(subparsers) -> None:
    p = subparsers.add_parser(
        "capacity",
        help="count how many copies of a packaged model fit under a memory threshold, and check the prediction",
        description="Start an empty Triton server, load copies of ARTIFACT one by one through the MME container "
        "API, measure after each, predict how many fit under the threshold, then load to the threshold to check. "
        "With --endpoint NAME: the same loop against a deployed multi-model endpoint, copies made in S3 by "
        "server-side copy and memory read through a small gpu-metrics model deployed beside them.",
    )
    p.add_argument("artifact", nargs="?", help="artifacts/<model>/<format> made by 'mme package' (or --artifact)")
    p.add_argument("--threshold", type=fraction, default=0.9, help="share of the memory limit (default: 0.9)")
    p.add_argument("--memory-limit", type=byte_size, help="memory to fill, e.g. 2G (default: the GPU's memory, or this host's RAM)")
    add_triton_network(p)
    p.add_argument("--server", choices=SERVER_CHOICES, default="auto",
                   help="Triton to load into, as for mme serve (default: auto; TensorRT and ONNX formats need docker or system)")
    p.add_argument("--memory", choices=MEMORY_KINDS, default="auto",
                   help="what is counted: gpu (NVML), host (RSS of Triton's process tree), or auto: the GPU when one "
                   "is visible unless the models run on the CPU; auto refuses on a GPU host without NVML (install it: "
                   "make install-gpu; or accept host RSS: --memory host) (default: auto)")
    p.add_argument("--probe-copies", type=positive_int, default=None,
                   help="copies measured for the prediction (default: 3; local loop)")
    p.add_argument("--no-verify", dest="verify", action="store_false", help="predict only; don't load to the threshold")
    p.add_argument("--concurrency", type=positive_int, default=None, metavar="N",
                   help="callers the endpoint will serve at once: their requests in flight take memory of their own, "
                   "counted once before the copies (default: 200, the staged shape's peak users; local loop)")
    p.add_argument("--binary", action="store_true",
                   help="those callers send the binary+json sample request, as 'mme bench --binary' does (default: the "
                   "JSON one, which Triton parses into buffers of its own; local loop)")
    p.add_argument("--at-rest", action="store_true",
                   help="predict from each copy's memory right after its load instead of after requests at its max "
                   "batch size (the articles' count; copies grow under load; both are reported either way)")
    p.add_argument("--cycles", type=int, default=0, metavar="N", help="leak check: load and unload one copy N times")
    p.add_argument("--max-copies", type=positive_int, default=200, help="stop verifying after this many copies (default: %(default)s)")
    p.add_argument("--instances", help="TOML table of instance types to project onto (see mme/instances.toml)")
    p.add_argument("--out", default="results", help="where the JSON report goes (default: %(default)s)")
    fleet = p.add_argument_group("a fleet of different models (--catalogue)")
    fleet.add_argument("--catalogue", metavar="FILE",
                       help="size a multi-model endpoint for every model of a catalogue packaged by 'mme package "
                       "--catalogue FILE': measure one copy of each, then simulate the LRU cache on --mix for "
                       "each instance (this host under --memory-limit, and the GPU instance types)")
    fleet.add_argument("--mix", metavar="MIX", help="the traffic: zipf:S (with --rps; the catalogue's order is the "
                       "popularity order) or a TOML file with [rates] (model = requests/s) or zipf = S and rps = R")
    fleet.add_argument("--rps", type=positive_float, help="requests/s over the whole fleet, for a Zipf mix")
    fleet.add_argument("--max-cold-share", type=float, default=0.01, metavar="F",
                       help="the share of requests that may wait for a model load (default: %(default)g)")
    fleet.add_argument("--sim-duration", type=positive_float, default=3600.0, metavar="S",
                       help="seconds of traffic simulated per instance count (default: %(default)g)")
    fleet.add_argument("--measurements", metavar="FILE",
                       help="plan from a saved fleet-measurements.json instead of measuring again")
    fleet.add_argument("--artifacts", default="artifacts", help="where the catalogue was packaged (default: %(default)s)")
    fleet.add_argument("--format", dest="catalogue_format", metavar="FORMAT",
                       help="the format measured of each entry (default: the entry's first)")
    fleet.add_argument("--seed", type=int, default=0, help="seed of the simulated traffic (default: %(default)s)")
    remote = p.add_argument_group("deployed endpoint (--endpoint)")
    remote.add_argument("--endpoint", help="name of a deployed multi-model endpoint (or 'local' with --endpoint-url)")
    remote.add_argument("--endpoint-url", help="SageMaker runtime URL, e.g. http://127.0.0.1:8080 for 'mme serve'")
    remote.add_argument("--region", help="AWS region (default: the configured one)")
    remote.add_argument("--s3", help="s3://bucket/prefix the endpoint serves (its ModelDataUrl)")
    remote.add_argument("--s3-endpoint-url", help="S3-compatible endpoint for --s3")
    remote.add_argument("--artifact", dest="remote_artifact", metavar="ARTIFACT",
                        help="the same as ARTIFACT: artifacts/<model>/<format> (with --endpoint, its tarball is copied "
                        "and invoked)")
    p.set_defaults(func=run_capacity)


_REMOTE_OPTIONS = (("endpoint_url", "--endpoint-url"), ("region", "--region"), ("s3", "--s3"),
                   ("s3_endpoint_url", "--s3-endpoint-url"))


def _check_capacity_args(args: argparse.Namespace) -> None:
    from mme.errors import UsageError

    # ARTIFACT and --artifact are one thing, for either loop
    if args.artifact and args.remote_artifact and args.artifact != args.remote_artifact:
        raise UsageError(f"ARTIFACT {args.artifact} and --artifact {args.remote_artifact} differ; give the artifact once")
    args.artifact = args.remote_artifact = args.artifact or args.remote_artifact
    if args.endpoint is None:
        given = [flag for name, flag in _REMOTE_OPTIONS if getattr(args, name) is not None]
        if given:
            raise UsageError(f"{', '.join(given)} only apply with --endpoint NAME (the loop against a deployed endpoint)")
        if args.artifact is None:
            raise UsageError("pass ARTIFACT (artifacts/<model>/<format>) for the local loop, or --endpoint NAME "
                             "--s3 s3://bucket/prefix ARTIFACT for a deployed endpoint")
        return
    local = [flag for flag, used in (("--memory-limit", args.memory_limit is not None),
                                     ("--probe-copies", args.probe_copies is not None),
                                     ("--no-verify", not args.verify), ("--cycles", args.cycles != 0),
                                     ("--at-rest", args.at_rest), ("--concurrency", args.concurrency is not None),
                                     ("--binary", args.binary),
                                     ("--server", args.server != "auto"), ("--memory", args.memory != "auto")) if used]
    if local:
        raise UsageError(f"{', '.join(local)} only apply to the local loop, not with --endpoint: the endpoint's "
                         "memory is what the gpu-metrics model reports and copies load until --threshold or --max-copies")
    if not args.endpoint.strip():
        raise UsageError("--endpoint needs the name of a deployed multi-model endpoint")
    if args.s3 is None:
        raise UsageError("--endpoint needs --s3 s3://bucket/prefix: the prefix the endpoint serves models from")
    if args.remote_artifact is None:
        raise UsageError("--endpoint needs ARTIFACT (artifacts/<model>/<format>): the model whose copies are loaded")


def run_capacity(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sizing.capacity import CONCURRENCY, format_table, measure_capacity, write_report
    from mme.instances import load_instances

    if args.catalogue:
        from mme.errors import UsageError
        from sizing.fleet import run_fleet_capacity

        if args.artifact or args.remote_artifact or args.endpoint:
            raise UsageError("--catalogue sizes a fleet from its own artifacts: leave ARTIFACT and --endpoint out")
        return run_fleet_capacity(args)
    if args.mix or args.measurements:
        from mme.errors import UsageError

        raise UsageError("--mix and --measurements go with --catalogue FILE (a fleet of models)")
    _check_capacity_args(args)
    reporter = Reporter(quiet=args.quiet)
    instances = load_instances(Path(args.instances)) if args.instances else None
    if args.endpoint is not None:
        return _run_remote_capacity(args, reporter, instances)
    report = measure_capacity(
        Path(args.artifact), threshold=args.threshold, limit_bytes=args.memory_limit,
        probe_copies=args.probe_copies or 3, verify=args.verify, cycles=max(0, args.cycles),
        max_copies=args.max_copies, instances=instances, reporter=reporter, server_kind=args.server, memory=args.memory,
        triton_network=args.triton_network, at_rest=args.at_rest, concurrency=args.concurrency or CONCURRENCY,
        binary=args.binary,
    )
    print(format_table(report))
    path = write_report(report, Path(args.out))
    print(f"written {path}")
    return 0


def _run_remote_capacity(args: argparse.Namespace, reporter: Reporter, instances) -> int:
    from pathlib import Path

    from mme.fsutil import ensure_writable_dir
    from sizing.capacity_remote import EndpointInvoker, RemoteCapacityRequest, measure_remote_capacity, runtime_client
    from mme.aws.session import S3Uri, connect
    from sizing.capacity import format_table, write_report

    destination = S3Uri.parse(args.s3)
    out = ensure_writable_dir(Path(args.out))
    aws = connect(args.region, local_endpoint_url=args.endpoint_url)  # a local endpoint needs no real region
    s3 = aws.client("s3", endpoint_url=args.s3_endpoint_url)
    invoker = EndpointInvoker(runtime_client(aws.session, args.endpoint_url), args.endpoint)
    request = RemoteCapacityRequest(args.endpoint, destination, Path(args.remote_artifact), args.threshold,
                                    args.max_copies)
    result = measure_remote_capacity(s3, invoker, request, instances=instances, reporter=reporter)
    print(format_table(result.report))
    print(f"copies: {len(result.copied)} created by server-side copy, {len(result.reused)} already in {destination}; "
          f"stopped at {result.stopped}; memory source {result.source}")
    path = write_report(result.report, out)
    print(f"written {path}")
    return 0
