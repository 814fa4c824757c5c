"""The local SageMaker (``mme cloud``) end to end, with unchanged boto3 clients pointed at it by
the standard endpoint variables only: the first article's hosting calls, real endpoints on the
local Triton, failures as SageMaker reports them, updates, deletion that leaves nothing behind,
CloudWatch figures, and ``mme deploy`` / ``mme delete`` / ``mme metrics`` taking their AWS paths."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psutil
import pytest

from mme.aws.images import triton_image_uri
from mme.cli import main
from tests.aws_fixtures import LOCAL_CLOUD_BUCKET

pytestmark = pytest.mark.integration

ROLE = "arn:aws:iam::000000000000:role/SageMakerExecution"
BUCKET = LOCAL_CLOUD_BUCKET
AMI = "al2023-ami-sagemaker-inference-gpu-4-1"  # the host 25.09 needs on ml.g5 (mme deploy sets it)


@pytest.fixture
def cloud(local_cloud):
    return local_cloud


@pytest.fixture
def clients(cloud):
    import boto3

    return boto3.client("sagemaker"), boto3.client("sagemaker-runtime"), boto3.client("s3")


def _push_copies(s3, packaged, prefix: str, copies: int) -> None:
    for i in range(copies):
        s3.upload_file(str(packaged.tarball), BUCKET, f"{prefix}{packaged.manifest.model}-v{i}.tar.gz")


def _create(sm, name: str, container: dict, instance_type: str = "ml.g5.2xlarge", count: int = 1,
            ami: str | None = AMI) -> None:
    sm.create_model(ModelName=f"{name}-model", ExecutionRoleArn=ROLE, PrimaryContainer=container)
    variant = {"VariantName": "AllTraffic", "ModelName": f"{name}-model", "InstanceType": instance_type,
               "InitialInstanceCount": count, "InitialVariantWeight": 1}
    if ami:
        variant["InferenceAmiVersion"] = ami
    sm.create_endpoint_config(EndpointConfigName=f"{name}-config", ProductionVariants=[variant])
    sm.create_endpoint(EndpointName=name, EndpointConfigName=f"{name}-config")


def _triton_pids(cloud, name: str) -> list[int]:
    runtime = cloud.hosting.runtime_of("us-east-1", name)
    members = getattr(runtime, "members", [runtime])
    return [pid for member in members for pid in member.server.pids()]


def test_the_articles_hosting_calls_run_unchanged(cloud, clients, packaged_test_resnet) -> None:
    """create_model (MultiModel, the Triton image) -> endpoint config -> endpoint -> the waiter ->
    invoke_endpoint with TargetModel for several copies -> delete, as the first article's notebook."""
    sm, runtime, s3 = clients
    model = packaged_test_resnet.manifest.model
    _push_copies(s3, packaged_test_resnet, "models/", 3)
    container = {"Image": triton_image_uri("us-east-1"), "ModelDataUrl": f"s3://{BUCKET}/models/", "Mode": "MultiModel"}
    _create(sm, "article-mme", container)
    assert sm.describe_endpoint(EndpointName="article-mme")["EndpointStatus"] in ("Creating", "InService")
    sm.get_waiter("endpoint_in_service").wait(EndpointName="article-mme", WaiterConfig={"Delay": 1, "MaxAttempts": 120})
    described = sm.describe_endpoint(EndpointName="article-mme")
    assert described["ProductionVariants"][0]["CurrentInstanceCount"] == 1
    assert described["EndpointArn"] == "arn:aws:sagemaker:us-east-1:000000000000:endpoint/article-mme"

    body = packaged_test_resnet.sample("json")
    for i in range(3):
        reply = runtime.invoke_endpoint(EndpointName="article-mme", TargetModel=f"{model}-v{i}.tar.gz", Body=body,
                                        ContentType="application/json")
        assert "outputs" in json.loads(reply["Body"].read())
    with pytest.raises(runtime.exceptions.ValidationError, match="Endpoint nope of account 000000000000 not found"):
        runtime.invoke_endpoint(EndpointName="nope", TargetModel=f"{model}-v0.tar.gz", Body=body,
                                ContentType="application/json")
    pids = _triton_pids(cloud, "article-mme")
    assert pids and all(psutil.pid_exists(p) for p in pids)

    sm.delete_endpoint(EndpointName="article-mme")
    sm.get_waiter("endpoint_deleted").wait(EndpointName="article-mme", WaiterConfig={"Delay": 1, "MaxAttempts": 5})
    sm.delete_endpoint_config(EndpointConfigName="article-mme-config")
    sm.delete_model(ModelName="article-mme-model")
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
    assert sm.list_endpoints()["Endpoints"] == [] and sm.list_models()["Models"] == []


def test_sagemakers_refusals(cloud, clients) -> None:
    sm, _, _ = clients
    image = triton_image_uri("us-east-1")
    container = {"Image": image, "ModelDataUrl": f"s3://{BUCKET}/m/", "Mode": "MultiModel"}
    sm.create_model(ModelName="m", ExecutionRoleArn=ROLE, PrimaryContainer=container)
    with pytest.raises(sm.exceptions.ClientError, match='Cannot create already existing model ".*:model/m"'):
        sm.create_model(ModelName="m", ExecutionRoleArn=ROLE, PrimaryContainer=container)
    with pytest.raises(sm.exceptions.ClientError, match="not a SageMaker Triton image"):
        sm.create_model(ModelName="m2", ExecutionRoleArn=ROLE,
                        PrimaryContainer={**container, "Image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/mine:1"})
    variant = {"VariantName": "AllTraffic", "ModelName": "missing", "InstanceType": "ml.g5.xlarge", "InitialInstanceCount": 1}
    with pytest.raises(sm.exceptions.ClientError, match='Could not find model ".*:model/missing"'):
        sm.create_endpoint_config(EndpointConfigName="c", ProductionVariants=[variant])
    with pytest.raises(sm.exceptions.ClientError, match="does not know the memory of ml.c5.xlarge"):
        sm.create_endpoint_config(EndpointConfigName="c", ProductionVariants=[{**variant, "ModelName": "m",
                                                                               "InstanceType": "ml.c5.xlarge"}])
    with pytest.raises(sm.exceptions.ClientError, match="Could not find endpoint configuration"):
        sm.create_endpoint(EndpointName="e", EndpointConfigName="c")
    with pytest.raises(sm.exceptions.ClientError, match="Could not find endpoint"):
        sm.describe_endpoint(EndpointName="e")


def test_failures_end_the_endpoint_failed_with_a_reason(cloud, clients, packaged_test_resnet) -> None:
    sm, _, s3 = clients
    image = triton_image_uri("us-east-1")
    # model data that is not there
    _create(sm, "no-data", {"Image": image, "ModelDataUrl": f"s3://{BUCKET}/nothing/model.tar.gz", "Mode": "SingleModel"})
    # the 470 driver of ml.g5's default host cannot start 25.09 (aws/deep-learning-containers#4990)
    _push_copies(s3, packaged_test_resnet, "ok/", 1)
    _create(sm, "old-driver", {"Image": image, "ModelDataUrl": f"s3://{BUCKET}/ok/", "Mode": "MultiModel"}, ami=None)
    for name, reason in (("no-data", "Failed to download model data(bucket: mme-cloud-test, key: nothing/model.tar.gz)"),
                         ("old-driver", "did not pass the ping health check")):
        with pytest.raises(Exception, match="Failed"):
            sm.get_waiter("endpoint_in_service").wait(EndpointName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
        described = sm.describe_endpoint(EndpointName=name)
        assert described["EndpointStatus"] == "Failed"
        assert reason in described["FailureReason"]
    assert "driver 470" in sm.describe_endpoint(EndpointName="old-driver")["FailureReason"]


def test_update_swaps_the_runtime_once_the_new_one_answers(cloud, clients, packaged_test_resnet) -> None:
    sm, runtime, s3 = clients
    model = packaged_test_resnet.manifest.model
    _push_copies(s3, packaged_test_resnet, "u/", 2)
    container = {"Image": triton_image_uri("us-east-1"), "ModelDataUrl": f"s3://{BUCKET}/u/", "Mode": "MultiModel"}
    _create(sm, "upd", container)
    waiter = sm.get_waiter("endpoint_in_service")
    waiter.wait(EndpointName="upd", WaiterConfig={"Delay": 1, "MaxAttempts": 120})
    with pytest.raises(sm.exceptions.ClientError, match="Could not find endpoint configuration"):
        sm.update_endpoint(EndpointName="upd", EndpointConfigName="upd-config-2")
    sm.create_endpoint_config(EndpointConfigName="upd-config-2", ProductionVariants=[
        {"VariantName": "AllTraffic", "ModelName": "upd-model", "InstanceType": "ml.g5.2xlarge",
         "InitialInstanceCount": 2, "InferenceAmiVersion": AMI}])
    sm.update_endpoint(EndpointName="upd", EndpointConfigName="upd-config-2")
    assert sm.describe_endpoint(EndpointName="upd")["EndpointStatus"] == "Updating"
    with pytest.raises(sm.exceptions.ClientError, match="Cannot update in-progress endpoint"):
        sm.update_endpoint(EndpointName="upd", EndpointConfigName="upd-config")
    waiter.wait(EndpointName="upd", WaiterConfig={"Delay": 1, "MaxAttempts": 120})
    described = sm.describe_endpoint(EndpointName="upd")
    assert described["EndpointConfigName"] == "upd-config-2"
    assert described["ProductionVariants"][0]["CurrentInstanceCount"] == 2
    assert len(cloud.hosting.runtime_of("us-east-1", "upd").members) == 2
    reply = runtime.invoke_endpoint(EndpointName="upd", TargetModel=f"{model}-v1.tar.gz",
                                    Body=packaged_test_resnet.sample("json"), ContentType="application/json")
    assert reply["ResponseMetadata"]["HTTPStatusCode"] == 200
    sm.delete_endpoint(EndpointName="upd")


def test_mme_deploy_metrics_and_delete_take_their_aws_paths(cloud, clients, packaged_test_resnet, tmp_path: Path,
                                                             capsys) -> None:
    sm, runtime, s3 = clients
    model = packaged_test_resnet.manifest.model
    prefix = f"s3://{BUCKET}/deploy/"
    state = str(tmp_path / "state")
    assert main(["push", str(packaged_test_resnet.directory), "--s3", prefix, "--copies", "2",
                 "--allow-random-weights"]) == 0
    deploy = ["deploy", "--s3", prefix, "--instance-type", "ml.g5.2xlarge", "--role", ROLE, "--name", "cli",
              "--poll-interval", "1", "--timeout", "300", "--state-dir", state]
    started = time.perf_counter()
    assert main(deploy) == 0
    body = packaged_test_resnet.sample("json")
    window_start = datetime.now(timezone.utc) - timedelta(minutes=1)
    for i in (0, 1, 0, 1, 0):
        runtime.invoke_endpoint(EndpointName="cli", TargetModel=f"{model}-v{i}.tar.gz", Body=body,
                                ContentType="application/json")
    print(f"deploy -> first 5 invocations: {time.perf_counter() - started:.1f} s")
    assert main(deploy) == 0  # the same deploy again goes on from what exists
    assert "exists" in capsys.readouterr().out
    # another prefix under the same name is refused by what SageMaker describes (no state file to go by)
    assert main(["push", str(packaged_test_resnet.directory), "--s3", f"s3://{BUCKET}/other/",
                 "--allow-random-weights"]) == 0
    other = [*deploy[:2], f"s3://{BUCKET}/other/", *deploy[3:-1], str(tmp_path / "other-state")]
    assert main(other) == 2
    assert "model cli-model already exists with" in capsys.readouterr().err

    time.sleep(1.5)  # the metrics feed's next interval
    out = tmp_path / "metrics"
    assert main(["metrics", "--endpoint", "cli", "--start", window_start.strftime("%Y-%m-%dT%H:%M:%SZ"),
                 "--out", str(out)]) == 0
    series = {(s["metric"], s["stat"]): s for s in json.loads((out / "cloudwatch_metrics.json").read_text())["series"]}
    assert sum(v for _, v in series[("Invocations", "Sum")]["points"]) == 5
    assert sum(v for _, v in series[("ModelCacheHit", "Sum")]["points"]) == 3  # 2 loads, then 3 hits
    p50 = [v for _, v in series[("ModelLatency", "p50")]["points"]]
    assert p50 and all(v > 0 for v in p50)

    pids = _triton_pids(cloud, "cli")
    assert main(["delete", "--endpoint", "cli", "--delete-s3", "--state-dir", state]) == 0
    assert sm.list_endpoints()["Endpoints"] == [] and sm.list_endpoint_configs()["EndpointConfigs"] == []
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix="deploy/")["KeyCount"] == 0
    assert cloud.hosting.running() == []
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_mme_deploy_exits_with_the_reason_of_a_failed_endpoint(cloud, clients, tmp_path: Path, capsys) -> None:
    _, _, s3 = clients
    s3.put_object(Bucket=BUCKET, Key="broken/model.tar.gz", Body=b"not a tarball",
                  Metadata={"mme-model": "model", "mme-format": "onnx"})
    code = main(["deploy", "--s3", f"s3://{BUCKET}/broken/model.tar.gz", "--mode", "single", "--instance-type",
                 "ml.g5.2xlarge", "--role", ROLE, "--name", "broken", "--poll-interval", "1", "--timeout", "120",
                 "--state-dir", str(tmp_path)])
    assert code == 3
    err = capsys.readouterr().err
    assert "endpoint broken Failed:" in err and "model.tar.gz" in err


def test_unsigned_hosting_requests_are_refused(cloud) -> None:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(cloud.url + "/", data=b"{}", method="POST",
                                     headers={"X-Amz-Target": "SageMaker.ListEndpoints",
                                              "Content-Type": "application/x-amz-json-1.1"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 403
    assert json.loads(caught.value.read())["__type"] == "MissingAuthenticationTokenException"
