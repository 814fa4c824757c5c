"""``mme cloud``: SageMaker hosting, its runtime, S3 and CloudWatch on one local address
(``serving/cloud``), so push, deploy, bench, metrics and delete run unchanged against this machine."""

from __future__ import annotations

import argparse
import os

from mme.argtypes import byte_size, fraction, positive_float
from mme.cli.serve import _run_until_stopped, add_triton_network
from mme.progress import Reporter
from serving.monitor.memory import DEFAULT_MEMORY_THRESHOLD, MEMORY_KINDS
from serving.triton.factory import SERVER_CHOICES, server_help

DUMMY_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "mme-local", "AWS_SECRET_ACCESS_KEY": "mme-local"}


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "cloud",
        help="run SageMaker hosting, its runtime, S3 and CloudWatch locally, for unchanged boto3 scripts and mme commands",
        description="One local address that answers the SageMaker hosting API (CreateModel, CreateEndpointConfig, "
        "CreateEndpoint, UpdateEndpoint, Describe/List/Delete), InvokeEndpoint, S3 and CloudWatch. Each endpoint "
        "created is a real local endpoint on Triton reading its ModelDataUrl from this S3. Point any client here "
        "with AWS_ENDPOINT_URL_SAGEMAKER, AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME, AWS_ENDPOINT_URL_CLOUDWATCH and "
        "AWS_ENDPOINT_URL_S3 (printed at start).",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument("--port", type=int, default=4566, help="port (default: %(default)s; 0 = any free port)")
    p.add_argument("--memory-limit", type=byte_size,
                   help="each instance's memory limit, e.g. 2G (default: the instance type's GPU memory, from "
                   "mme/instances.toml; CPU instance types need this)")
    p.add_argument("--memory-threshold", type=fraction, default=DEFAULT_MEMORY_THRESHOLD,
                   help="evict above this share of the limit (default: %(default)s)")
    p.add_argument("--memory", choices=MEMORY_KINDS, default="auto", help="what the limit counts (as mme serve)")
    p.add_argument("--server-kind", choices=SERVER_CHOICES, default="auto", help=server_help())
    p.add_argument("--account", default="000000000000", help="the 12-digit account in ARNs (default: %(default)s)")
    p.add_argument("--metrics-interval", type=positive_float, default=5.0, metavar="S",
                   help="seconds between each endpoint's CloudWatch publications (default: %(default)s)")
    add_triton_network(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mme.errors import UsageError
    from serving.cloud.hosting import CloudOptions
    from serving.cloud.server import LocalCloud

    if not (args.account.isdigit() and len(args.account) == 12):
        raise UsageError(f"--account must be a 12-digit AWS account id (got {args.account!r})")
    if not 0 <= args.port < 65536:
        raise UsageError(f"--port must be between 0 and 65535 (got {args.port})")
    for name, value in DUMMY_CREDENTIALS.items():  # its own S3 reads are signed; nothing checks the key
        os.environ.setdefault(name, value)
    options = CloudOptions(host=args.host, port=args.port, account=args.account, memory_limit_bytes=args.memory_limit,
                           memory_threshold=args.memory_threshold, memory=args.memory, server_kind=args.server_kind,
                           triton_network=args.triton_network, metrics_interval_s=args.metrics_interval)
    reporter = Reporter()
    cloud = LocalCloud(options, reporter)

    def banner() -> None:
        reporter.info(f"==> local SageMaker hosting, runtime, S3 and CloudWatch on {cloud.url} (Ctrl-C stops it "
                      "and every endpoint it runs)")
        reporter.info("    point boto3 and mme here:")
        for name, value in cloud.environment().items():
            reporter.info(f"    export {name}={value}")

    return _run_until_stopped(cloud, banner, reporter)
