"""``mme capacity``: how many copies of a packaged model fit under a memory threshold, counted
as they serve (the work is :mod:`sizing.capacity`; ``--catalogue``: :mod:`sizing.fleet`;
``--endpoint``: :mod:`sizing.capacity_remote`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from mme.argtypes import byte_size, fraction, positive_float, positive_int
from mme.cli.serve import add_triton_network
from mme.progress import Reporter
from serving.monitor.memory import DEFAULT_MEMORY_THRESHOLD, MEMORY_KINDS
from serving.triton.factory import SERVER_CHOICES


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "capacity",
        help="count how many copies of a packaged model fit under a memory threshold, and check the prediction",
        description="Start an empty Triton server, load copies of ARTIFACT one by one through the MME container "
        "API, measure after each, predict how many fit under the threshold, then load to the threshold to check. "
        "With --endpoint NAME: the same loop against a deployed multi-model endpoint, copies made in S3 by "
        "server-side copy and memory read through a small gpu-metrics model deployed beside them.",
    )
    p.add_argument("artifact", nargs="?", help="artifacts/<model>/<format> made by 'mme package' (or --artifact)")
    p.add_argument("--threshold", type=fraction, default=DEFAULT_MEMORY_THRESHOLD,
                   help="share of the memory limit (default: %(default)s)")
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

    from mme.instances import load_instances
    from sizing.capacity import CONCURRENCY, measure_capacity
    from sizing.capacity_report import format_table, write_capacity_report

    if args.catalogue:
        from mme.errors import UsageError

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
    path = write_capacity_report(report, Path(args.out))
    print(f"written {path}")
    return 0


def _run_remote_capacity(args: argparse.Namespace, reporter: Reporter, instances) -> int:
    from pathlib import Path

    from mme.aws.session import S3Uri, connect
    from mme.fsutil import ensure_writable_dir
    from sizing.capacity_remote import EndpointInvoker, RemoteCapacityRequest, measure_remote_capacity, runtime_client
    from sizing.capacity_report import format_table, write_capacity_report

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
    path = write_capacity_report(result.report, out)
    print(f"written {path}")
    return 0


def run_fleet_capacity(args: argparse.Namespace) -> int:
    """``mme capacity --catalogue FILE --mix MIX``: measure (or read --measurements), plan, write."""
    from mme.errors import UsageError
    from mme.fsutil import ensure_writable_dir, write_json_atomic
    from mme.instances import gpu_memory, load_instances
    from packager.catalogue import catalogue_artifacts
    from packager.manifest import Manifest
    from sizing.capacity import CONCURRENCY
    from sizing.fleet import MIB, plan_fleet, plan_table, write_plan
    from sizing.fleet_measure import MEASUREMENTS, FleetMeasurement, measure_fleet
    from sizing.mix import parse_mix

    reporter = Reporter(quiet=args.quiet)
    if args.mix is None:
        raise UsageError("--catalogue sizes a fleet for a traffic mix: add --mix zipf:1.1 --rps 20, or --mix FILE")
    if not 0 <= args.max_cold_share < 1:
        raise UsageError(f"--max-cold-share must be at least 0 and below 1 (got {args.max_cold_share})")
    out = Path(args.out)
    if args.measurements:
        measurement = FleetMeasurement.load(Path(args.measurements))
        rates = parse_mix(args.mix, args.rps, [(m.model, m.target) for m in measurement.models])
    else:
        artifacts = catalogue_artifacts(Path(args.catalogue), Path(args.artifacts), args.catalogue_format)
        manifests = [Manifest.load(a) for a in artifacts]
        rates = parse_mix(args.mix, args.rps, [(m.model, m.tarball) for m in manifests])  # before the long part
        reporter.info(f"==> measuring {len(artifacts)} models one copy each (as mme capacity does)")
        measurement = measure_fleet(artifacts, reporter, server_kind=args.server, memory=args.memory,
                                    concurrency=args.concurrency or CONCURRENCY, binary=args.binary)
    out = ensure_writable_dir(out)
    if not args.measurements:
        write_json_atomic(out / MEASUREMENTS, measurement.to_dict())
    memories: list[tuple[str, int]] = []
    if args.memory_limit:
        memories.append((f"this host ({args.memory_limit / MIB:.0f} MiB)", int(args.memory_limit)))
    instances = load_instances(Path(args.instances)) if args.instances else load_instances()
    memories += [(name, gpu_memory(row)[0]) for name, row in instances.items()]  # usable, where known
    rows = plan_fleet(measurement, rates, memories, args.threshold, args.max_cold_share, args.sim_duration,
                      use_rest=args.at_rest, seed=args.seed)
    settings = {"threshold": args.threshold, "max_cold_share": args.max_cold_share, "duration_s": args.sim_duration,
                "counted": "at rest" if args.at_rest else "loaded", "seed": args.seed, "mix": args.mix, "rps": args.rps}
    paths = write_plan(out, measurement, rates, rows, settings)
    print(plan_table(rows))
    for path in paths:
        print(f"written {path}")
    if not args.measurements:
        print(f"written {out / MEASUREMENTS} (plan again without measuring: --measurements {out / MEASUREMENTS})")
    return 0
