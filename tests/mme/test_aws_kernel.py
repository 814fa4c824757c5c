"""The AWS kernel's one preamble (``connect``), the deploy resources' table against
botocore's SageMaker service model, and the copy-name API push and deploy share."""

from __future__ import annotations

import pytest

from mme.aws.errors import CredentialsError
from mme.aws.session import connect
from mme.aws.state import KINDS
from serving.models.copies import CopyName, copy_name, is_copy, parse_copy_name
from serving.deploy.resources import BY_KIND, CREATION_ORDER, ENDPOINT, ENDPOINT_CONFIG, MODEL


def test_connect_checks_the_region_and_credentials(aws_env, monkeypatch):
    aws = connect("us-west-2")
    assert aws.region == "us-west-2"
    sm = aws.client("sagemaker")
    assert sm.meta.region_name == "us-west-2" and sm.meta.config.retries["mode"] == "standard"
    assert aws.client("s3", "http://127.0.0.1:9").meta.endpoint_url == "http://127.0.0.1:9"
    with pytest.raises(CredentialsError, match="is not a region where SageMaker runs; did you mean"):
        connect("us-west-22")

    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(CredentialsError, match="no AWS region configured; pass --region"):
        connect()
    assert connect(need_region=False).region == ""
    # a local stand-in for the endpoint: any region signs, and us-east-1 serves when none is set
    assert connect(local_endpoint_url="http://127.0.0.1:8080").region == "us-east-1"
    assert connect("eu-west-1", local_endpoint_url="http://127.0.0.1:8080").region == "eu-west-1"

    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(CredentialsError, match="no AWS credentials found"):
        connect("us-east-1")
    assert connect("us-east-1", need_credentials=False).region == "us-east-1"


def test_the_resource_table_matches_the_sagemaker_service_model(aws_env):
    import boto3

    sm = boto3.session.Session(region_name="us-east-1").client("sagemaker")
    model = sm.meta.service_model
    assert tuple(r.kind for r in reversed(CREATION_ORDER)) == KINDS, "deletion order is creation order reversed"
    assert BY_KIND == {"model": MODEL, "endpoint-config": ENDPOINT_CONFIG, "endpoint": ENDPOINT}
    for resource in CREATION_ORDER:
        for method in (resource.describe, resource.create, resource.delete):
            operation = model.operation_model(sm.meta.method_to_api_mapping[method])
            assert resource.name_param in operation.input_shape.members, (method, resource.name_param)
        described = model.operation_model(sm.meta.method_to_api_mapping[resource.describe]).output_shape.members
        assert resource.name_param in described


def test_conflicts_name_the_first_differing_field():
    request = {"ModelName": "m", "PrimaryContainer": {"Image": "i", "ModelDataUrl": "s3://b/p/", "Mode": "MultiModel"}}
    same = {"ModelName": "m", "Containers": [dict(request["PrimaryContainer"], Environment={})]}
    assert MODEL.conflicts(same, request) is None
    other = {"PrimaryContainer": dict(request["PrimaryContainer"], Mode="SingleModel")}
    assert MODEL.conflicts(other, request) == ("Mode", "SingleModel", "MultiModel")
    assert ENDPOINT.conflicts({"EndpointConfigName": "old"}, {"EndpointConfigName": "new"}) == (
        "EndpointConfigName", "old", "new")
    assert ENDPOINT_CONFIG.conflicts({}, {"ProductionVariants": [{"ModelName": "m", "InstanceType": "ml.g5.xlarge"}]}) == (
        "ModelName", None, "m")


@pytest.mark.parametrize("name,parsed", [
    ("resnet50-v3.tar.gz", CopyName("resnet50", 3)),
    ("my-model-v-v12.tar.gz", CopyName("my-model-v", 12)),
    ("resnet50.tar.gz", None),
    ("resnet50-v3.tar", None),
    ("resnet50-vx.tar.gz", None),
])
def test_copy_names_parse_as_copy_name_writes_them(name, parsed):
    assert parse_copy_name(name) == parsed and is_copy(name) is (parsed is not None)
    if parsed is not None:
        assert copy_name(parsed.base, parsed.index) == name and parsed.base == f"{parsed.stem}.tar.gz"
