"""mme deploy / mme delete against the local SageMaker (mme cloud): what SageMaker says about
existing, conflicting, failed and missing resources, observed rather than stubbed. What it cannot
show (an endpoint caught Deleting, a wait that times out, Ctrl-C inside a call, throttling) stays
with botocore's Stubber in test_deploy.py."""

from __future__ import annotations

import pytest

from mme.aws.errors import DeployError, EndpointFailed
from mme.aws.images import triton_image_uri
from mme.aws.session import boto3_session
from mme.aws.state import DeploymentStore
from mme.progress import Reporter
from serving.deploy import endpoint as deploy
from serving.deploy.delete import plan_delete, run_delete

from tests.aws_fixtures import LOCAL_CLOUD_BUCKET as BUCKET

ROLE = "arn:aws:iam::000000000000:role/SageMakerExecution"


def _clients():
    import boto3

    return boto3.client("sagemaker"), boto3.client("s3")


def _put(s3, prefix: str, names: tuple[str, ...], body: bytes = b"tarball", fmt: str = "onnx") -> str:
    for name in names:
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{name}", Body=body,
                      Metadata={"sha256": "x", "mme-model": "r50", "mme-format": fmt, "mme-triton-release": "25.09"})
    return f"s3://{BUCKET}/{prefix}"


def _plan(uri: str, tmp_path, **overrides):
    options = {"instance_type": "ml.g5.2xlarge", **overrides}
    request = deploy.DeployRequest(s3=uri, role_arn=ROLE, state_dir=tmp_path / "state", **options)
    _, s3 = _clients()
    return deploy.plan_deploy(request, boto3_session(), s3, Reporter(quiet=True))


def test_an_existing_endpoint_config_on_another_instance_type_is_a_conflict(local_cloud, tmp_path):
    sm, s3 = _clients()
    plan = _plan(_put(s3, "mme/r", ("r50.tar.gz",)), tmp_path)
    sm.create_model(**{k: v for k, v in plan.create_model.items()})
    variant = {**plan.create_endpoint_config["ProductionVariants"][0], "InstanceType": "ml.g4dn.xlarge"}
    variant.pop("InferenceAmiVersion", None)
    sm.create_endpoint_config(EndpointConfigName=plan.endpoint_config, ProductionVariants=[variant])
    store = DeploymentStore(tmp_path / "state")
    with pytest.raises(DeployError) as caught:
        deploy.run_deploy(plan, sm, store, Reporter(quiet=True))
    assert str(caught.value) == (
        "endpoint config mme-r-config already exists with InstanceType ml.g4dn.xlarge (this deploy wants ml.g5.2xlarge); "
        "remove it with 'mme delete --endpoint mme-r' or choose another --name")
    assert store.load("mme-r").resource("model").status == "existing"
    assert sm.list_endpoints()["Endpoints"] == []  # nothing was created past the conflict


def test_a_failed_endpoint_is_not_carried_on(local_cloud, tmp_path):
    sm, s3 = _clients()
    plan = _plan(_put(s3, "broken", ("model.tar.gz",), body=b"not a tarball"), tmp_path, mode="single")
    store = DeploymentStore(tmp_path / "state")
    with pytest.raises(EndpointFailed, match=f"endpoint {plan.endpoint} Failed: ") as first:
        deploy.run_deploy(plan, sm, store, Reporter(quiet=True), poll_s=0.5, timeout_s=120)
    reason = sm.describe_endpoint(EndpointName=plan.endpoint)["FailureReason"]
    assert reason and reason in str(first.value)
    created = sm.describe_model(ModelName=plan.model)["CreationTime"]
    with pytest.raises(EndpointFailed, match=f"exists and has Failed: {reason[:40]}.*; remove it"):
        deploy.run_deploy(plan, sm, store, Reporter(quiet=True), poll_s=0.5)
    assert store.load(plan.endpoint).status == "Failed" and store.load(plan.endpoint).failure_reason == reason
    assert sm.describe_model(ModelName=plan.model)["CreationTime"] == created  # found, not made again


def test_deploy_run_again_finds_everything_and_creates_nothing(local_cloud, tmp_path):
    sm, s3 = _clients()
    # an empty-bodied prefix serves on first request: the endpoint goes InService without loading anything
    plan = _plan(_put(s3, "again", ("r50.tar.gz", "r50-v0.tar.gz")), tmp_path)
    store = DeploymentStore(tmp_path / "state")
    first = deploy.run_deploy(plan, sm, store, Reporter(quiet=True), poll_s=0.5, timeout_s=120)
    assert first.status == "InService" and {r.status for r in first.resources} == {"created"}

    def created() -> tuple:
        return (sm.describe_model(ModelName=plan.model)["CreationTime"],
                sm.describe_endpoint_config(EndpointConfigName=plan.endpoint_config)["CreationTime"],
                sm.describe_endpoint(EndpointName=plan.endpoint)["CreationTime"])

    before = created()
    again = deploy.run_deploy(plan, sm, store, Reporter(quiet=True), poll_s=0.5, timeout_s=120)
    assert again.status == "InService" and created() == before  # each found, none made again
    outcome = run_delete(plan_delete(plan.endpoint, sm, "us-east-1", store.load(plan.endpoint), True, None,
                                     store.path(plan.endpoint)), sm, s3, store, Reporter(quiet=True))
    assert outcome == {"endpoint mme-again": "deleted", "endpoint-config mme-again-config": "deleted",
                       "model mme-again-model": "deleted", f"s3://{BUCKET}/again/": "2 objects deleted"}
    assert not store.path(plan.endpoint).exists() and local_cloud.hosting.running() == []


def test_delete_without_state_tolerates_everything_missing_and_runs_twice(local_cloud, tmp_path):
    sm, _ = _clients()
    store = DeploymentStore(tmp_path / "state")
    for _ in range(2):
        plan = plan_delete("gone", sm, "us-east-1", None, False, None, store.path("gone"))
        assert plan.resources == (("endpoint", "gone"), ("endpoint-config", "gone-config"), ("model", "gone-model"))
        outcome = run_delete(plan, sm, None, store, Reporter(quiet=True))
        assert set(outcome.values()) == {"not found"}


def test_delete_follows_the_endpoint_when_there_is_no_state(local_cloud, tmp_path):
    sm, s3 = _clients()
    _put(s3, "follow", ("r50.tar.gz",))
    container = {"Image": triton_image_uri("us-east-1"), "Mode": "MultiModel", "ModelDataUrl": f"s3://{BUCKET}/follow/"}
    sm.create_model(ModelName="model-1", ExecutionRoleArn=ROLE, PrimaryContainer=container)
    sm.create_endpoint_config(EndpointConfigName="cfg-1", ProductionVariants=[
        {"VariantName": "AllTraffic", "ModelName": "model-1", "InstanceType": "ml.g5.xlarge",
         "InitialInstanceCount": 1, "InferenceAmiVersion": "al2023-ami-sagemaker-inference-gpu-4-1"}])
    sm.create_endpoint(EndpointName="ep", EndpointConfigName="cfg-1")
    sm.get_waiter("endpoint_in_service").wait(EndpointName="ep", WaiterConfig={"Delay": 1, "MaxAttempts": 120})
    plan = plan_delete("ep", sm, "us-east-1", None, False, None, tmp_path / "ep.json")
    assert plan.resources == (("endpoint", "ep"), ("endpoint-config", "cfg-1"), ("model", "model-1"))
    outcome = run_delete(plan, sm, None, DeploymentStore(tmp_path / "state"), Reporter(quiet=True))
    assert set(outcome.values()) == {"deleted"}
    assert sm.list_models()["Models"] == [] and local_cloud.hosting.running() == []


def test_delete_s3_removes_the_prefix_and_refuses_the_bucket_root(local_cloud, tmp_path):
    sm, s3 = _clients()
    uri = _put(s3, "mme/s", ("r50.tar.gz", "r50-v0.tar.gz", "r50-v1.tar.gz"))
    s3.put_object(Bucket=BUCKET, Key="other/keep.tar.gz", Body=b"x")
    plan = _plan(uri, tmp_path)
    store = DeploymentStore(tmp_path / "state")
    store.save(plan.new_state())  # a deploy interrupted before its first create: nothing exists yet
    delete_plan = plan_delete("mme-s", sm, "us-east-1", store.load("mme-s"), True, None, store.path("mme-s"))
    assert delete_plan.s3_uri == uri + "/"
    outcome = run_delete(delete_plan, sm, s3, store, Reporter(quiet=True))
    assert outcome[uri + "/"] == "3 objects deleted"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    assert keys == ["other/keep.tar.gz"]
    with pytest.raises(DeployError, match="refuses to empty the whole bucket"):
        plan_delete("mme-s", sm, "us-east-1", None, True, f"s3://{BUCKET}", store.path("mme-s"))
