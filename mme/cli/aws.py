"""``mme push | deploy | delete | metrics | compile``: the cloud commands.

Registered by ``register(subparsers)``; boto3 and the command modules are imported only
when a command runs. Plans and results go to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from urllib.parse import urlsplit
from typing import Any, Callable

from mme.argtypes import byte_size, positive_float, positive_int
from mme.progress import Reporter
from packager.formats.gpu import PRECISIONS
from packager.options import add_option


def register(subparsers: Any) -> None:
    register_push(subparsers)
    register_deploy(subparsers)
    register_delete(subparsers)
    register_metrics(subparsers)
    register_compile(subparsers)


# name -> (one-line help, description): what `mme --help` and `mme <name> --help` say.
_TEXT = {
    "push": (
        "upload an artifact's MME tarball (and N copies, server-side) to an S3 prefix",
        "Upload <name>.tar.gz once, make <name>-v0..v{N-1}.tar.gz by server-side copy, skip objects whose "
        "sha256 metadata already matches, verify every write. Refuses random-weight artifacts unless allowed.",
    ),
    "deploy": (
        "create a SageMaker endpoint (multi-model by default) on the Triton image and wait for it",
        "CreateModel -> CreateEndpointConfig -> CreateEndpoint, after checking instance type, role, region, "
        "credentials, bucket and tarballs. A state file lists what was created (for 'mme delete'); running the "
        "same command again carries on from what exists.",
    ),
    "delete": (
        "delete an endpoint, its endpoint config and model (and with --delete-s3 its S3 prefix)",
        "Deletes what the deployment's state file lists (or what the endpoint refers to), tolerating "
        "resources that are already gone, then removes the state file. Safe to run twice.",
    ),
    "metrics": (
        "fetch an endpoint's CloudWatch metrics for a run window and save them (JSON + CSV)",
        "GetMetricData at a 60 s period: invocations, latencies, errors, MME model loading and cache, "
        "CPU/memory/GPU utilisation. With --run the window and endpoint come from the run's run.json and the files "
        "go into the run directory.",
    ),
    "compile": (
        "build a TensorRT plan from an ONNX artifact in a SageMaker training job on the target GPU",
        "Runs a training job on --instance-type in the serving image (so TensorRT version and GPU match "
        "the endpoint), downloads the plan into artifacts/<model>/tensorrt/ and writes its manifest.",
    ),
}


def _command(subparsers: Any, name: str, run: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    summary, description = _TEXT[name]
    p = subparsers.add_parser(name, help=summary, description=description)
    p.set_defaults(func=run)
    return p


def _aws_options(p: argparse.ArgumentParser, *, s3_endpoint: bool = True) -> None:
    """--region, and --s3-endpoint-url for the commands that read or write s3:// URIs."""
    p.add_argument("--region", help="AWS region (default: AWS_REGION / the profile's region)")
    if s3_endpoint:
        p.add_argument("--s3-endpoint-url", "--endpoint-url", dest="s3_endpoint_url", metavar="URL",
                       help="S3-compatible endpoint for the s3:// URIs (e.g. a local test server)")


def _wait_options(p: argparse.ArgumentParser, timeout_s: float) -> None:
    p.add_argument("--timeout", type=positive_float, default=timeout_s, metavar="S",
                   help=f"give up waiting after S seconds ({timeout_s:.0f})")
    p.add_argument("--poll-interval", type=positive_float, default=30.0, metavar="S", help="seconds between status checks (30)")


def _state_dir_option(p: argparse.ArgumentParser, default: str, where: str) -> None:
    p.add_argument("--state-dir", default=default, help=f"where {where} (default: %(default)s)")


def _print_plan(lines: list[str], dry_run: bool, nothing: str) -> bool:
    """Print a plan; True when it was a dry run (and say so)."""
    for line in lines:
        print(line)
    if dry_run:
        print(f"dry run: {nothing}")
    return dry_run


# --- push ----------------------------------------------------------------------------------


def register_push(subparsers: Any) -> None:
    p = _command(subparsers, "push", run_push)
    p.add_argument("artifact", nargs="?", help="artifacts/<model>/<format> made by 'mme package'")
    p.add_argument("--catalogue", type=Path, metavar="FILE",
                   help="push every model of a catalogue packaged by 'mme package --catalogue FILE' to the one --s3 "
                   "prefix (a fleet's multi-model endpoint); each entry's --format artifact")
    p.add_argument("--format", dest="push_format", metavar="FORMAT",
                   help="with --catalogue: the format to push of each entry (default: the entry's first format)")
    p.add_argument("--out", type=Path, default=Path("artifacts"),
                   help="with --catalogue: where it was packaged (default: %(default)s)")
    p.add_argument("--s3", required=True, metavar="URI", help="destination prefix, s3://bucket/prefix")
    p.add_argument("--copies", type=int, default=0, metavar="N", help="also make <name>-v0..v{N-1}.tar.gz (default: 0)")
    p.add_argument("--dry-run", action="store_true", help="print what would be uploaded, copied and skipped; write nothing")
    p.add_argument("--allow-random-weights", action="store_true", help="push an artifact packaged with random weights (load tests)")
    p.add_argument("--instance-type", help="check the artifact loads on this instance type's GPU (TensorRT plans: "
                   "the compute capability they were built for) and that a SageMaker host image's NVIDIA driver "
                   "there runs its release's CUDA")
    p.add_argument("--image-uri", help="the image you will serve with, for a release AWS publishes no SageMaker image "
                   "for (recorded; mme deploy uses it)")
    p.add_argument("--multipart-threshold", type=byte_size, default=64 << 20, help="multipart upload above this size (64M)")
    p.add_argument("--multipart-chunksize", type=byte_size, default=64 << 20, help="part size of multipart uploads (64M)")
    p.add_argument("--max-concurrency", type=positive_int, default=4, help="parallel part uploads (4)")
    _aws_options(p)


def run_push(args: argparse.Namespace) -> int:
    from mme.aws.session import S3Uri, connect
    from mme.errors import MmeError, UsageError
    from serving.deploy.s3push import push

    if bool(args.artifact) == bool(args.catalogue):
        raise UsageError("mme push: give an ARTIFACT directory or --catalogue FILE (one of them)")
    if args.push_format and not args.catalogue:
        raise UsageError("--format picks a format of each catalogue entry; it goes with --catalogue")
    destination = S3Uri.parse(args.s3)
    from packager.catalogue import catalogue_artifacts

    artifacts = catalogue_artifacts(args.catalogue, args.out, args.push_format) if args.catalogue else [Path(args.artifact)]
    aws = connect(args.region, need_region=False)
    s3 = aws.client("s3", args.s3_endpoint_url)
    reporter = Reporter(quiet=args.quiet)
    failed = []
    for artifact in artifacts:
        try:
            push(s3, _push_request(args, artifact, destination), reporter)
        except MmeError as exc:
            if not args.catalogue:
                raise
            failed.append(artifact)
            reporter.warn(f"{artifact}: not pushed: {exc}")
    if args.catalogue:
        print(f"catalogue: {len(artifacts) - len(failed)} of {len(artifacts)} artifacts pushed to {destination}")
    return min(len(failed), 100)


def _push_request(args: argparse.Namespace, artifact: Path, destination):
    from mme.aws.s3 import TransferSettings
    from serving.deploy.s3push import PushRequest

    return PushRequest(
        artifact=artifact, destination=destination, copies=args.copies,
        allow_random_weights=args.allow_random_weights, dry_run=args.dry_run,
        instance_type=args.instance_type, image_uri=args.image_uri,
        settings=TransferSettings(args.multipart_threshold, args.multipart_chunksize, args.max_concurrency),
    )


# --- deploy ----------------------------------------------------------------------------------


def register_deploy(subparsers: Any) -> None:
    p = _command(subparsers, "deploy", deploy_command)
    p.add_argument("--s3", required=True, metavar="URI", help="s3://bucket/prefix holding the tarballs (single mode: or one .tar.gz)")
    p.add_argument("--instance-type", required=True, help="e.g. ml.g5.2xlarge")
    p.add_argument("--role", required=True, metavar="ARN", help="SageMaker execution role (arn:aws:iam::<account>:role/<name>)")
    p.add_argument("--mode", choices=("multi", "single"), default="multi", help="multi-model endpoint, or one model (default: multi)")
    p.add_argument("--target", metavar="NAME.tar.gz", help="single mode: the tarball under the prefix")
    p.add_argument("--image-uri", help="serving image (default: sagemaker-tritonserver of the artifacts' release for the region)")
    p.add_argument("--triton-release", help="release of mme/versions.toml for the image (default: the pushed artifacts')")
    p.add_argument("--name", help="endpoint name (default: mme-<last prefix segment>); model and config get -model / -config")
    p.add_argument("--instance-count", type=positive_int, default=1, help="instances behind the endpoint (default: 1)")
    p.add_argument("--inference-ami-version", metavar="NAME",
                   help="the variant's host image, which decides its NVIDIA driver: one of botocore's "
                   "ProductionVariantInferenceAmiVersion values (see mme/hosts.toml; e.g. "
                   "al2023-ami-sagemaker-inference-gpu-4-1: driver 580, CUDA 13.0). Default: the one the image's CUDA "
                   "needs when the instance family's default host cannot start it, else none")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra container environment (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="check everything and print the exact requests; create nothing")
    p.add_argument("--no-wait", dest="wait", action="store_false", help="return once creation has started")
    _wait_options(p, 3600.0)
    _state_dir_option(p, ".mme/deployments", "deployment state files go")
    _aws_options(p)


def deploy_command(args: argparse.Namespace) -> int:
    from mme.aws.session import connect
    from mme.aws.state import DeploymentStore
    from serving.deploy import endpoint as deploy
    from serving.models.copies import FIRST_COPY, copy_name

    request = deploy.DeployRequest(
        s3=args.s3, instance_type=args.instance_type, role_arn=args.role, mode=args.mode, image_uri=args.image_uri,
        triton_release=args.triton_release, name=args.name, region=args.region, target=args.target,
        instance_count=args.instance_count, environment=deploy.parse_env(args.env), wait=args.wait,
        timeout_s=args.timeout, poll_interval_s=args.poll_interval, state_dir=Path(args.state_dir),
        s3_endpoint_url=args.s3_endpoint_url, dry_run=args.dry_run, inference_ami_version=args.inference_ami_version,
    )
    deploy.check_deploy_request(request)  # before any AWS call
    reporter = Reporter(quiet=args.quiet)
    aws = connect(args.region)
    plan = deploy.plan_deploy(request, aws.session, aws.client("s3", args.s3_endpoint_url), reporter)
    if _print_plan(plan.lines(), args.dry_run, "nothing was created"):
        return 0
    store = DeploymentStore(Path(args.state_dir))
    state = deploy.run_deploy(plan, aws.client("sagemaker"), store, reporter, wait=args.wait,
                              timeout_s=args.timeout, poll_s=args.poll_interval)
    print(f"endpoint {plan.endpoint}: {state.status} ({plan.region}, {plan.instance_type}); state in {store.path(plan.endpoint)}")
    target = f"TargetModel='{copy_name('<name>', FIRST_COPY)}', " if plan.mode == "multi" else ""
    print(f"  invoke: boto3.client('sagemaker-runtime', region_name='{plan.region}').invoke_endpoint("
          f"EndpointName='{plan.endpoint}', {target}ContentType='application/json', Body=...)")
    print(f"  it is billed while it exists: mme delete --endpoint {plan.endpoint} [--delete-s3]")
    return 0


# --- delete ----------------------------------------------------------------------------------


def register_delete(subparsers: Any) -> None:
    p = _command(subparsers, "delete", delete_command)
    p.add_argument("--endpoint", required=True, help="endpoint name")
    p.add_argument("--delete-s3", action="store_true", help="also delete every object under the deployment's S3 prefix")
    p.add_argument("--s3", metavar="URI", help="the prefix to delete when no state file records it")
    p.add_argument("--dry-run", action="store_true", help="print what would be deleted")
    _state_dir_option(p, ".mme/deployments", "deployment state files are")
    _aws_options(p)


def delete_command(args: argparse.Namespace) -> int:
    from mme.aws.session import connect
    from mme.aws.state import DeploymentStore
    from serving.deploy import delete

    store = DeploymentStore(Path(args.state_dir))
    deployment = store.load(args.endpoint)
    aws = connect(args.region or (deployment.region if deployment else None))
    sm = aws.client("sagemaker")
    plan = delete.plan_delete(args.endpoint, sm, aws.region, deployment, args.delete_s3, args.s3, store.path(args.endpoint))
    if _print_plan(plan.lines(), args.dry_run, "nothing was deleted"):
        return 0
    endpoint_url = args.s3_endpoint_url or (deployment.s3_endpoint_url if deployment else None)
    s3 = aws.client("s3", endpoint_url) if plan.s3_uri else None
    outcome = delete.run_delete(plan, sm, s3, store, Reporter(quiet=args.quiet))
    print(f"deleted endpoint {args.endpoint}: " + ", ".join(f"{k}: {v}" for k, v in outcome.items()))
    return 0


# --- metrics ---------------------------------------------------------------------------------


def register_metrics(subparsers: Any) -> None:
    p = _command(subparsers, "metrics", run_metrics)
    p.add_argument("--endpoint", help="endpoint name (default with --run: the run's endpoint)")
    window = p.add_mutually_exclusive_group(required=True)
    window.add_argument("--run", metavar="RESULTS_DIR", help="a bench run directory (run.json gives started_at/ended_at)")
    window.add_argument("--start", metavar="ISO", help="window start, e.g. 2024-05-01T12:00:00Z (with --end)")
    p.add_argument("--end", metavar="ISO", help="window end (with --start; default: now)")
    p.add_argument("--variant", default="AllTraffic", help="production variant (default: %(default)s)")
    p.add_argument("--out", help="directory for the files without --run (default: results/metrics-<endpoint>-<start>)")
    _aws_options(p, s3_endpoint=False)


def run_metrics(args: argparse.Namespace) -> int:
    from datetime import datetime, timezone

    from mme.aws.errors import AwsError
    from mme.aws.session import connect
    from serving.deploy import cloudwatch

    reporter = Reporter(quiet=args.quiet)
    region = args.region
    if args.run:
        from bench.results import RunInfo

        run_dir = Path(args.run)
        info = RunInfo.read(run_dir)
        if args.end:
            raise AwsError("--end goes with --start; with --run the window is the run's started_at .. ended_at")
        if not info.ended_at:
            raise AwsError(f"{run_dir}/run.json has no ended_at (the run did not finish); pass --start and --end instead")
        endpoint = args.endpoint or info.endpoint
        start = cloudwatch.parse_time(info.started_at, "run.json started_at")
        end = cloudwatch.parse_time(info.ended_at, "run.json ended_at")
        region = region or info.region or None
        out_dir = run_dir
    else:
        if not args.endpoint:
            raise AwsError("--endpoint is required with --start/--end")
        endpoint = args.endpoint
        start = cloudwatch.parse_time(args.start, "--start")
        end = cloudwatch.parse_time(args.end, "--end") if args.end else datetime.now(timezone.utc)
        out_dir = Path(args.out) if args.out else Path("results") / f"metrics-{endpoint}-{start.strftime('%Y%m%dT%H%M%SZ')}"
    window = cloudwatch.Window.around(start, end)
    for note in cloudwatch.window_warnings(window):
        reporter.warn(note)
    aws = connect(region)
    region = aws.region
    client = aws.client("cloudwatch")
    run_url = info.endpoint_url if args.run else None
    if run_url and urlsplit(client.meta.endpoint_url).hostname.endswith((".amazonaws.com", ".amazonaws.com.cn")):
        reporter.warn(f"the run used endpoint_url {run_url} but CloudWatch is AWS's ({client.meta.endpoint_url}): it "
                      "only has metrics of SageMaker endpoints (mme cloud's CloudWatch has its endpoints')")
    report = cloudwatch.fetch(client, endpoint, args.variant, window, region)
    for line in cloudwatch.summary_lines(report):
        print(line)
    if report.points == 0:
        reporter.warn(
            f"CloudWatch returned no datapoints for {endpoint}/{args.variant} in {region} between {report.start} and "
            f"{report.end}; check the endpoint name, region and window (datapoints arrive a few minutes late)"
        )
    for message in report.messages:
        reporter.warn(f"CloudWatch: {message}")
    json_path, csv_path = cloudwatch.save(report, out_dir)
    print(f"written {json_path} and {csv_path}")
    return 0


# --- compile ---------------------------------------------------------------------------------


def register_compile(subparsers: Any) -> None:
    p = _command(subparsers, "compile", compile_command)
    p.add_argument("--on", required=True, choices=("sagemaker",), help="where to build: sagemaker (a training job)")
    p.add_argument("--instance-type", required=True, help="the GPU instance type you will serve on, e.g. ml.g5.2xlarge")
    p.add_argument("--artifact", required=True, help="artifacts/<model>/onnx made by 'mme package --formats onnx'")
    p.add_argument("--s3", required=True, metavar="URI", help="working prefix for the job's inputs and output")
    p.add_argument("--role", required=True, metavar="ARN", help="SageMaker execution role")
    p.add_argument("--image-uri", help="build image (default: the SageMaker Triton image of the artifact's release); an "
                   "NVIDIA (NGC-based) image: the job starts through its /opt/nvidia/nvidia_entrypoint.sh")
    p.add_argument("--triton-release", help="release of mme/versions.toml (default: the artifact's)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp16",
                   help="fp32 (TF32 off), tf32, or fp16 (default: %(default)s)")
    p.add_argument("--hardware-compatible", action="store_true",
                   help="an engine that loads on every Ampere-or-newer GPU, not only the instance's")
    p.add_argument("--max-batch-size", type=positive_int, help="profile's max batch (default: the manifest's)")
    add_option(p, "workspace_mib")  # mme package's --workspace-mib: one name, one unit, one default
    p.add_argument("--out", help="artifact directory to write (default: artifacts/<model>/tensorrt)")
    p.add_argument("--retry", action="store_true", help="start a new job after a failed or stopped one")
    p.add_argument("--dry-run", action="store_true", help="print the job request; upload and create nothing")
    _wait_options(p, 5400.0)
    p.add_argument("--max-runtime", type=positive_int, default=3600, metavar="S", help="the job's MaxRuntimeInSeconds (3600)")
    p.add_argument("--volume-gb", type=positive_int, default=30, help="the job's disk (30)")
    _state_dir_option(p, ".mme/compile", "compile state files go")
    _aws_options(p)


def compile_command(args: argparse.Namespace) -> int:
    from mme.aws.session import connect
    from mme.aws.state import StateDir
    from packager.remote import compile as remote
    from packager.remote.plan import CompileRequest, check_compile_request, load_onnx_artifact, plan_compile

    request = CompileRequest(
        artifact=Path(args.artifact), s3=args.s3, instance_type=args.instance_type, role_arn=args.role,
        region=args.region, image_uri=args.image_uri, triton_release=args.triton_release, precision=args.precision,
        hardware_compatible=args.hardware_compatible, max_batch_size=args.max_batch_size, workspace_mib=args.workspace_mib, out=Path(args.out) if args.out else None,
        volume_gb=args.volume_gb, max_runtime_s=args.max_runtime, timeout_s=args.timeout,
        poll_interval_s=args.poll_interval, state_dir=Path(args.state_dir), s3_endpoint_url=args.s3_endpoint_url,
        retry=args.retry, dry_run=args.dry_run,
    )
    check_compile_request(request)
    artifact = load_onnx_artifact(request.artifact)
    reporter = Reporter(quiet=args.quiet)
    aws = connect(args.region)
    s3 = aws.client("s3", args.s3_endpoint_url)
    store = StateDir(Path(args.state_dir), "compile job")
    plan = plan_compile(request, aws.region, s3, store, artifact, reporter)
    if _print_plan(plan.lines(), args.dry_run, "nothing was uploaded or started"):
        return 0
    out = remote.run_compile(plan, artifact, aws.client("sagemaker"), s3, store, reporter,
                             timeout_s=args.timeout, poll_s=args.poll_interval)
    print(f"written {out} (TensorRT plan built on {plan.instance_type}; manifest.json records the TensorRT version and GPU)")
    return 0
