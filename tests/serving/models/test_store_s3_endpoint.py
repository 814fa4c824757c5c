"""The local MME serving straight from an S3 prefix (a real moto server over HTTP)."""

from __future__ import annotations

import pytest

import boto3

from mme.progress import Reporter
from serving.runtime.local_endpoint import LocalEndpoint, LocalEndpointOptions

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def test_serve_from_s3_prefix(moto_server, aws_env, packaged_test_resnet):
    s3 = boto3.client("s3", endpoint_url=moto_server.endpoint_url, region_name="us-east-1")
    s3.create_bucket(Bucket="mme-models")
    for i in (1, 2):
        s3.upload_file(str(packaged_test_resnet.tarball), "mme-models", f"prod/resnet/test_resnet-v{i}.tar.gz")
    options = LocalEndpointOptions(models="s3://mme-models/prod/resnet", port=0, server_kind="local",
                                   s3_endpoint_url=moto_server.endpoint_url)
    body = (packaged_test_resnet.directory / "sample_request.json").read_bytes()
    with LocalEndpoint(options, Reporter(quiet=True)) as ep:
        sm = boto3.client("sagemaker-runtime", endpoint_url=ep.url, region_name="us-east-1")
        for target in ("test_resnet-v2.tar.gz", "test_resnet-v2.tar.gz", "test_resnet-v1.tar.gz"):
            reply = sm.invoke_endpoint(EndpointName="local", TargetModel=target, ContentType="application/json", Body=body)
            assert reply["ResponseMetadata"]["HTTPStatusCode"] == 200
        assert ep.cache.stats.downloads == 2
        snapshot = ep.endpoint.snapshot()
        assert snapshot["counts"]["ModelLoads"] == 2 and snapshot["counts"]["ModelCacheHit"] == 1
        assert snapshot["latency_us"]["ModelDownloadingTime"]["count"] == 2
