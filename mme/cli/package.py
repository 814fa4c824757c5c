"""``mme package``: argument parsing only. The package options are the table of
``packager.options``; the work is in ``packager.pipeline`` (one model) and
``packager.catalogue_run`` (a catalogue)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mme.argtypes import positive_float, positive_int
from mme.errors import UsageError
from mme.progress import Reporter
from packager.options import add_package_options, request_from_args

if TYPE_CHECKING:
    from packager.remote.catalogue_plan import JobsRequest

# the options that only mean something with --on sagemaker: (argparse dest, option)
SAGEMAKER_OPTIONS = (("instance_type", "--instance-type"), ("s3", "--s3"), ("role", "--role"), ("image_uri", "--image-uri"),
                     ("region", "--region"), ("s3_endpoint_url", "--s3-endpoint-url"), ("shard_size", "--shard-size"),
                     ("parallel_jobs", "--parallel-jobs"), ("max_runtime", "--max-runtime"), ("volume_gb", "--volume-gb"),
                     ("timeout", "--timeout"), ("poll_interval", "--poll-interval"), ("state_dir", "--state-dir"),
                     ("retry", "--retry"), ("dry_run", "--dry-run"))
REQUIRED = ("instance_type", "s3", "role", "image_uri")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "package",
        help="export a timm / Hugging Face model, validate it, lay out Triton + MME artifacts",
        description="Export MODEL to TorchScript / ONNX / TensorRT / the cpu-local format, validate every "
        "export against PyTorch, and write artifacts/<model>/<format>/ (Triton model directory, MME "
        "tarball, sample requests, manifest.json).",
    )
    p.add_argument("model", nargs="?", help="timm name (resnet50), Hugging Face name (bert-base-uncased) or hub id")
    p.add_argument("--list", action="store_true", help="list known models (MODEL, if given, is a filter like 'convnext*')")
    p.add_argument("--json", action="store_true", help="print the packaged artifacts as JSON on stdout")
    add_package_options(p)
    fleet = p.add_argument_group("catalogue (many models)")
    fleet.add_argument("--catalogue", type=Path, metavar="FILE",
                       help="package every model of a TOML catalogue ([defaults] and [[model]] tables with this "
                       "command's options, e.g. formats, image_size, seq_len, max_batch_size, with_tokenizer); entries "
                       "already packaged for the same options are skipped; writes catalogue-summary.{csv,json,md} "
                       "under --out; the exit code is the number of entries that failed")
    fleet.add_argument("--jobs", type=positive_int, default=1, metavar="N",
                       help="with --catalogue: entries packaged at once, each in its own process; a job starts only "
                       "while the memory it will need is free (default: %(default)s)")
    fleet.add_argument("--on", choices=("local", "sagemaker"), default="local",
                       help="with --catalogue: package here (local, the default) or in SageMaker training jobs on the "
                       "GPU instance type you will serve on (sagemaker: TensorRT engines built where they run; the "
                       "artifacts are downloaded into --out)")
    jobs = p.add_argument_group("SageMaker jobs (--catalogue FILE --on sagemaker)")
    jobs.add_argument("--instance-type", help="GPU instance type the jobs run on: the one you will serve on, e.g. ml.g5.2xlarge")
    jobs.add_argument("--s3", metavar="URI", help="working prefix for each job's inputs and output, s3://bucket/prefix")
    jobs.add_argument("--role", metavar="ARN", help="SageMaker execution role of the jobs")
    jobs.add_argument("--image-uri", help="the builder image in ECR (make docker-build, then docker push), e.g. "
                      "<account>.dkr.ecr.<region>.amazonaws.com/mme-builder:25.09")
    jobs.add_argument("--region", help="AWS region (default: AWS_REGION / the profile's region)")
    jobs.add_argument("--s3-endpoint-url", metavar="URL", help="S3-compatible endpoint for the s3:// URIs")
    jobs.add_argument("--shard-size", type=positive_int, metavar="N", help="catalogue entries per training job (default: 1)")
    jobs.add_argument("--parallel-jobs", type=positive_int, metavar="N",
                      help="training jobs running at once; one the instance quota refuses waits (default: 4)")
    jobs.add_argument("--max-runtime", type=positive_int, metavar="S", help="each job's MaxRuntimeInSeconds (default: 14400)")
    jobs.add_argument("--volume-gb", type=positive_int, help="each job's disk (default: 50)")
    jobs.add_argument("--timeout", type=positive_float, metavar="S",
                      help="stop waiting after S seconds; the jobs keep running (default: 21600)")
    jobs.add_argument("--poll-interval", type=positive_float, metavar="S", help="seconds between status checks (default: 30)")
    jobs.add_argument("--state-dir", type=Path, help="where the jobs' state files go (default: .mme/package-jobs)")
    jobs.add_argument("--retry", action="store_true", help="start new jobs for shards whose job failed or left entries unpackaged")
    jobs.add_argument("--dry-run", action="store_true", help="print the jobs and their requests; upload and start nothing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.list:
        return _list(args)
    if args.catalogue and args.model:
        raise UsageError(f"mme package: give a MODEL or --catalogue FILE, not both ({args.model!r} and {args.catalogue})")
    if not args.model and not args.catalogue:
        raise UsageError("mme package: give a MODEL (e.g. resnet50), --catalogue FILE or --list (see 'mme package --help')")
    if args.on == "sagemaker" and not args.catalogue:
        raise UsageError("--on sagemaker packages a --catalogue FILE (one model's TensorRT plan: mme compile --on sagemaker)")
    if args.on == "local":
        check_local_only(args)
    reporter = Reporter(quiet=args.quiet)
    if args.catalogue:
        from packager.catalogue_run import package_catalogue

        remote = jobs_request_from_args(args) if args.on == "sagemaker" else None
        return package_catalogue(args.catalogue, args.out, reporter, jobs=args.jobs, remote=remote)

    from packager.pipeline import package

    artifacts = package(request_from_args(args, reporter), reporter)
    for artifact in artifacts:
        reporter.info(artifact.line())
    if args.json:
        json.dump([a.manifest.to_dict() | {"directory": str(a.directory)} for a in artifacts], sys.stdout, indent=2)
        print()
    return 0


def check_local_only(args: argparse.Namespace) -> None:
    """Refuse the SageMaker options without ``--on sagemaker`` (they would be ignored)."""
    given = [option for dest, option in SAGEMAKER_OPTIONS if getattr(args, dest, None) not in (None, False)]
    if given:
        raise UsageError(f"{given[0]} goes with --catalogue FILE --on sagemaker (packaging in SageMaker training jobs)")


def jobs_request_from_args(args: argparse.Namespace) -> "JobsRequest":
    """The SageMaker side of ``--catalogue FILE --on sagemaker``, checked before anything is written."""
    from packager.remote.catalogue_plan import JobsRequest, check_jobs_request

    missing = [option for dest, option in SAGEMAKER_OPTIONS if dest in REQUIRED and not getattr(args, dest)]
    if missing:
        raise UsageError(f"--on sagemaker needs {', '.join(missing)}: the GPU instance type you will serve on, a working "
                         "S3 prefix, the SageMaker execution role and the builder image in ECR (make docker-build, "
                         "then docker push it)")

    def given(dest: str, field: str) -> Any:  # the option, else JobsRequest's default
        value = getattr(args, dest)
        return JobsRequest.__dataclass_fields__[field].default if value is None else value

    request = JobsRequest(
        s3=args.s3, instance_type=args.instance_type, role_arn=args.role, image_uri=args.image_uri, region=args.region,
        shard_size=given("shard_size", "shard_size"), parallel_jobs=given("parallel_jobs", "parallel_jobs"),
        jobs=args.jobs, volume_gb=given("volume_gb", "volume_gb"), max_runtime_s=given("max_runtime", "max_runtime_s"),
        timeout_s=given("timeout", "timeout_s"), poll_interval_s=given("poll_interval", "poll_interval_s"),
        state_dir=Path(given("state_dir", "state_dir")), s3_endpoint_url=args.s3_endpoint_url,
        retry=bool(args.retry), dry_run=bool(args.dry_run),
    )
    check_jobs_request(request)
    return request


def _list(args: argparse.Namespace) -> int:
    from packager import registry
    from packager.formats import FORMATS

    pattern = args.model
    for family in registry.FAMILIES:
        if args.family and family.name != args.family:
            continue
        names = family.list_models(pattern)
        featured = family.source.featured
        if featured and not pattern:
            print(f"{family.name}: {len(names)} models (filter with 'mme package --list PATTERN'); from the articles: "
                  f"{', '.join(featured)}")
            continue
        print(f"{family.name}: {len(names)} models")
        for name in names:
            print(f"  {name}")
    print("formats:")
    for name, fmt in FORMATS.items():
        print(f"  {name:<15} {fmt.description}")
    return 0
