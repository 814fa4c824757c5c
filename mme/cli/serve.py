"""``mme serve``: a local SageMaker multi-model endpoint on a real Triton server."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import threading

from mme.argtypes import byte_size, fraction, positive_float, positive_int
from mme.progress import Reporter
from serving.monitor.memory import DEFAULT_MEMORY_THRESHOLD, MEMORY_KINDS
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
    p.add_argument("--memory-threshold", type=fraction, default=DEFAULT_MEMORY_THRESHOLD,
                   help="evict above this share of the limit (default: %(default)s)")
    p.add_argument("--memory-limit", type=byte_size, help="memory the models may use, e.g. 4G (default: GPU memory, or host RAM)")
    p.add_argument("--copies", type=int, default=0, metavar="N",
                   help="also answer for <name>-v0..v{N-1}.tar.gz from <name>.tar.gz (no duplicate files)")
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
