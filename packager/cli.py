"""``mme package``: argument parsing only; the work is in ``packager.pipeline``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from mme.argtypes import int_list, non_negative_float, non_negative_int, positive_float, positive_int
from mme.progress import Reporter

if TYPE_CHECKING:
    from packager.pipeline import PackageRequest

# the options that only mean something with --on sagemaker: (argparse dest, option)
SAGEMAKER_OPTIONS = (("instance_type", "--instance-type"), ("s3", "--s3"), ("role", "--role"), ("image_uri", "--image-uri"),
                     ("region", "--region"), ("s3_endpoint_url", "--s3-endpoint-url"), ("shard_size", "--shard-size"),
                     ("parallel_jobs", "--parallel-jobs"), ("max_runtime", "--max-runtime"), ("volume_gb", "--volume-gb"),
                     ("timeout", "--timeout"), ("poll_interval", "--poll-interval"), ("state_dir", "--state-dir"),
                     ("retry", "--retry"), ("dry_run", "--dry-run"))


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
    p.add_argument("--formats", default="torchscript,onnx,cpu-local",
                   help="comma-separated: torchscript, onnx, cpu-local, tensorrt, torch-tensorrt, or 'all' "
                   "(default: %(default)s)")
    p.add_argument("--out", type=Path, default=Path("artifacts"), help="output root (default: %(default)s)")
    p.add_argument("--family", choices=("timm", "huggingface"), help="force the model family")
    weights = p.add_mutually_exclusive_group()
    weights.add_argument("--pretrained", dest="weights", action="store_const", const="pretrained",
                         help="require pretrained weights from the hub (default: use them when reachable)")
    weights.add_argument("--no-pretrained", dest="weights", action="store_const", const="random",
                         help="random weights, same architecture and size (benchmarks)")
    weights.add_argument("--weights", dest="weights_path", type=Path, metavar="PATH",
                         help="local checkpoint file, or a local Hugging Face model directory")
    p.add_argument("--image-size", type=positive_int, help="square image side (default: the model's, usually 224)")
    p.add_argument("--seq-len", type=positive_int, help="max sequence length for text models (default: 128)")
    p.add_argument("--max-batch-size", type=positive_int, default=16, help="Triton max_batch_size (default: %(default)s)")
    p.add_argument("--opset", type=positive_int, default=18, help="ONNX opset, 17 or newer (default: %(default)s)")
    p.add_argument("--precision", choices=("fp32", "tf32", "fp16"), default="fp32",
                   help="precision of the TensorRT formats: fp32 (TF32 off), tf32 (matrix products in TF32 on "
                   "Ampere+), fp16 (default: %(default)s)")
    p.add_argument("--hardware-compatible", action="store_true",
                   help="build TensorRT engines that load on every Ampere-or-newer GPU (compute capability 8.0+), "
                   "not only on this GPU's architecture; somewhat slower")
    p.add_argument("--atol", type=positive_float,
                   help="absolute validation tolerance: an output passes where |export - PyTorch| <= atol + rtol x "
                   "|PyTorch| (default: the family's, 1e-4; 1e-2 for tf32, 5e-2 for fp16 engines)")
    p.add_argument("--rtol", type=non_negative_float,
                   help="relative validation tolerance beside --atol, numpy.allclose's (default: 1e-3 for fp32, "
                   "room for large logits and another device's arithmetic; 1e-2 for tf32 and fp16 engines; 0: absolute only)")
    p.add_argument("--dynamic-batching", action=argparse.BooleanOptionalAction, default=True,
                   help="enable Triton's dynamic batcher (default: on)")
    p.add_argument("--preferred-batch-sizes", type=int_list, default=(), metavar="N,N",
                   help="dynamic batcher preferred batch sizes (default: none)")
    p.add_argument("--max-queue-delay-us", type=non_negative_int, default=100, help="dynamic batcher delay (default: %(default)s)")
    p.add_argument("--instance-count", type=positive_int, default=1, help="model instances per GPU/CPU")
    p.add_argument("--instance-kind", choices=("gpu", "cpu"), help="override KIND_GPU / KIND_CPU")
    p.add_argument("--warmup", action="store_true", help="add a batch-1 model_warmup to config.pbtxt")
    p.add_argument("--cpu-threads", type=non_negative_int, default=2,
                   help="ONNX Runtime intra-op threads in the cpu-local model (0 = all cores) (default: %(default)s)")
    p.add_argument("--workspace-gib", type=positive_float, default=4.0, help="TensorRT builder workspace (default: %(default)s)")
    p.add_argument("--triton-release", help="serving release the artifacts target (default: mme/versions.toml's, the newest "
                   "with a SageMaker image; python -m mme.versions --list)")
    p.add_argument("--with-tokenizer", action="store_true",
                   help="text models (BERT, DistilBERT): package a Triton ensemble of the model's WordPiece tokenizer "
                   "and the encoder, so requests send text (a BYTES tensor TEXT) instead of token ids")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed for random weights and sample inputs")
    p.add_argument("--json", action="store_true", help="print the packaged artifacts as JSON on stdout")
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
    from mme.errors import UsageError

    if args.list:
        return _list(args)
    if args.catalogue and args.model:
        raise UsageError(f"mme package: give a MODEL or --catalogue FILE, not both ({args.model!r} and {args.catalogue})")
    if not args.model and not args.catalogue:
        raise UsageError("mme package: give a MODEL (e.g. resnet50), --catalogue FILE or --list (see 'mme package --help')")

    from packager.pipeline import package

    if args.on == "sagemaker" and not args.catalogue:
        raise UsageError("--on sagemaker packages a --catalogue FILE (one model's TensorRT plan: mme compile --on sagemaker)")
    if args.on == "local":
        check_local_only(args)
    if args.catalogue:
        from packager.catalogue import run_catalogue

        return run_catalogue(args)
    request = request_from_args(args)
    reporter = Reporter(quiet=args.quiet)
    artifacts = package(request, reporter)
    for artifact in artifacts:
        m = artifact.manifest
        size = artifact.tarball.stat().st_size / 1e6
        reporter.info(
            f"  {m.format:<15} -> {artifact.directory}  (max |diff| {m.validation.max_abs_diff:.2e}, "
            f"{m.tarball} {size:.1f} MB, weights: {m.weights})"
        )
    if args.json:
        json.dump([a.manifest.to_dict() | {"directory": str(a.directory)} for a in artifacts], sys.stdout, indent=2)
        print()
    return 0


def check_local_only(args: argparse.Namespace) -> None:
    """Refuse the SageMaker options without ``--on sagemaker`` (they would be ignored)."""
    from mme.errors import UsageError

    given = [option for dest, option in SAGEMAKER_OPTIONS if getattr(args, dest, None) not in (None, False)]
    if given:
        raise UsageError(f"{given[0]} goes with --catalogue FILE --on sagemaker (packaging in SageMaker training jobs)")


def request_from_args(args: argparse.Namespace) -> "PackageRequest":
    """The PackageRequest of parsed ``mme package`` arguments (also what a catalogue entry becomes)."""
    from packager.formats import parse_formats
    from packager.formats.base import ExportOptions
    from packager.model import ModelRequest
    from packager.pipeline import PackageRequest
    from packager.triton_config import TritonOptions

    weights = "local" if args.weights_path else (args.weights or "auto")
    return PackageRequest(
        model=ModelRequest(
            name=args.model, weights=weights, weights_path=args.weights_path,
            image_size=args.image_size, seq_len=args.seq_len, seed=args.seed,
        ),
        formats=parse_formats(args.formats),
        out=args.out,
        family=args.family,
        export=ExportOptions(
            opset=args.opset, precision=args.precision,
            cpu_threads=args.cpu_threads, workspace_gib=args.workspace_gib, hardware_compatible=args.hardware_compatible,
        ),
        triton=TritonOptions(
            max_batch_size=args.max_batch_size, dynamic_batching=args.dynamic_batching,
            preferred_batch_sizes=args.preferred_batch_sizes, max_queue_delay_us=args.max_queue_delay_us,
            instance_count=args.instance_count,
            instance_kind={"gpu": "KIND_GPU", "cpu": "KIND_CPU", None: None}[args.instance_kind],
            warmup=args.warmup,
        ),
        atol=args.atol,
        rtol=args.rtol,
        triton_release=args.triton_release,
        with_tokenizer=args.with_tokenizer,
    )


def _list(args: argparse.Namespace) -> int:
    from packager import registry
    from packager.formats import FORMATS
    from packager.sources import timm_source

    pattern = args.model
    for family, names in registry.list_models(pattern, args.family).items():
        if family == timm_source.FAMILY and not pattern:
            featured = ", ".join(timm_source.FEATURED)
            print(f"{family}: {len(names)} models (filter with 'mme package --list PATTERN'); from the articles: {featured}")
            continue
        print(f"{family}: {len(names)} models")
        for name in names:
            print(f"  {name}")
    print("formats:")
    for name, fmt in FORMATS.items():
        print(f"  {name:<15} {fmt.description}")
    return 0
