"""``mme demo-cloud`` / ``make demo-cloud``: the first article's whole cloud loop against this
machine: package MODEL (cpu-local) -> ``mme push`` to the local S3 with N copies -> ``mme deploy``
a multi-model endpoint -> the staged load (``mme bench``) -> ``mme metrics`` from CloudWatch ->
``mme report`` -> ``mme delete``. A local SageMaker (``mme cloud``: hosting, runtime, S3 and
CloudWatch) runs in this process; every step is the command itself, pointed there by boto3's
standard endpoint variables only, so it takes the same code path it takes against AWS."""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from mme.argtypes import byte_size, positive_float, positive_int
from mme.cli.demo import package_step
from mme.errors import MmeError
from mme.progress import Reporter

CLOUD_ENDPOINT = "mme-demo-cloud"
BUCKET = "mme-demo-cloud"
ROLE = "arn:aws:iam::{account}:role/mme-demo-cloud"
STEPS = 7


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo-cloud",
        help="the first article's cloud loop on this machine: push, deploy an MME, staged load, CloudWatch metrics, "
        "report, delete (a local SageMaker, no account)",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
    )
    p.add_argument("--model", default="resnet50", help="model to package (default: %(default)s)")
    p.add_argument("--out", default="artifacts", help="artifact root (default: %(default)s)")
    p.add_argument("--results", default="results", help="results root (default: %(default)s)")
    p.add_argument("--copies", type=positive_int, default=3, help="copies pushed and load-tested, <model>-v0.. (default: 3)")
    p.add_argument("--instance-type", default="ml.g5.2xlarge", help="the endpoint's instance type (default: %(default)s)")
    p.add_argument("--memory-limit", type=byte_size, default=2 * 2**30,
                   help="each instance's memory limit (default: 2G; the instance type's GPU memory would not fit "
                        "this machine's)")
    p.add_argument("--time-scale", type=positive_float, default=0.25,
                   help="compress the article's 340 s staged shape (default: 0.25, about 90 s)")
    p.add_argument("--repackage", action="store_true", help="package again even if the artifact exists")
    p.set_defaults(func=run)


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in os.environ (what the commands and their child processes read), restored after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _command(reporter: Reporter, number: int, argv: list[str]) -> None:
    from mme.cli import main

    reporter.info(f"\n==> [{number}/{STEPS}] mme {' '.join(argv)}")
    code = main(argv)
    if code != 0:
        raise MmeError(f"mme {argv[0]} exited with {code}; its message is above")


def _first_invoke(endpoint: str, target: str, body: bytes, content_type: str, timeout_s: float = 120.0) -> float:
    """Seconds until the endpoint answered one request for ``target`` (its first load included)."""
    import boto3

    runtime = boto3.session.Session().client("sagemaker-runtime")
    start = time.perf_counter()
    while True:
        try:
            runtime.invoke_endpoint(EndpointName=endpoint, TargetModel=target, Body=body, ContentType=content_type)
            return time.perf_counter() - start
        except runtime.exceptions.ClientError:
            if time.perf_counter() - start > timeout_s:
                raise


def run(args: argparse.Namespace) -> int:
    import boto3

    from bench.payload import from_artifact
    from serving.cloud.hosting import CloudOptions
    from serving.cloud.server import running_cloud

    reporter = Reporter(quiet=args.quiet)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    reporter.info(f"\n==> [1/{STEPS}] package {args.model} in the cpu-local format")
    artifact = package_step(args.model, Path(args.out), args.repackage, reporter)
    model = artifact.manifest.model
    options = CloudOptions(port=0, memory_limit_bytes=args.memory_limit)
    credentials = {"AWS_ACCESS_KEY_ID": "mme-local", "AWS_SECRET_ACCESS_KEY": "mme-local", "AWS_SESSION_TOKEN": ""}
    with running_cloud(options, reporter) as cloud, _environment({**credentials, **cloud.environment()}):
        os.environ.pop("AWS_SESSION_TOKEN", None)
        os.environ.pop("AWS_PROFILE", None)
        reporter.info(f"  a local SageMaker on {cloud.url}: "
                      + " ".join(f"{k}={v}" for k, v in cloud.environment().items() if k.startswith("AWS_ENDPOINT")))
        boto3.session.Session().client("s3").create_bucket(Bucket=BUCKET)
        prefix = f"s3://{BUCKET}/{model}/"
        _command(reporter, 2, ["push", str(artifact.directory), "--s3", prefix, "--copies", str(args.copies),
                               "--allow-random-weights"])
        state_dir = str(Path(args.results) / "demo-cloud-deployments")  # the local SageMaker's, apart from AWS's
        deploy_started = time.perf_counter()
        try:
            _command(reporter, 3, ["deploy", "--s3", prefix, "--instance-type", args.instance_type, "--role",
                                   ROLE.format(account=options.account), "--name", CLOUD_ENDPOINT, "--poll-interval",
                                   "1", "--timeout", "600", "--state-dir", state_dir])
            sample = from_artifact(artifact.directory, binary=True)
            _first_invoke(CLOUD_ENDPOINT, f"{model}-v0.tar.gz", sample.body, sample.content_type)
            first = time.perf_counter() - deploy_started
            reporter.info(f"  mme deploy -> first successful invoke: {first:.1f} s")
            run_id = f"demo-cloud-{stamp}-{model}"
            _command(reporter, 4, ["bench", "--endpoint", CLOUD_ENDPOINT, "--copies", str(args.copies), "--artifact",
                                   str(artifact.directory), "--binary", "--shape", "staged", "--time-scale",
                                   str(args.time_scale), "--instance-type", args.instance_type, "--out",
                                   args.results, "--run-id", run_id])
            run_dir = Path(args.results) / run_id
            time.sleep(options.metrics_interval_s + 1)  # the last requests' figures reach CloudWatch
            _command(reporter, 5, ["metrics", "--run", str(run_dir)])
            _command(reporter, 6, ["report", str(run_dir)])
        finally:
            _command(reporter, 7, ["delete", "--endpoint", CLOUD_ENDPOINT, "--delete-s3", "--state-dir", state_dir])
    print(f"\ndemo-cloud done: open {run_dir / 'report.html'}")
    print(f"  mme deploy -> first successful invoke: {first:.1f} s; raw results and CloudWatch files: {run_dir}")
    return 0
