"""mme deploy / mme delete: requests checked by botocore's Stubber against the SageMaker
service model, S3 on the moto server, state files, the wait loop, Ctrl-C and clean-up: what the
local SageMaker cannot show (timeouts, Ctrl-C inside a call, an endpoint caught Deleting, the
exact requests). What it can show (conflicts, Failed endpoints, running twice, deletion) is in
test_deploy_local_cloud.py."""

from __future__ import annotations

import io
import json
from datetime import datetime, timezone

import pytest

from mme.hosts import HostDriverError
from mme.progress import Reporter
from serving.deploy import endpoint as deploy
from serving.deploy.delete import plan_delete, run_delete
from mme.aws.errors import AwsError, CredentialsError, DeployError, EndpointFailed, Interrupted, S3Error, WaitTimeout
from mme.aws.session import boto3_session
from mme.aws.state import DeploymentStore

ROLE = "arn:aws:iam::123456789012:role/SageMakerExecution"
ARN = "arn:aws:sagemaker:us-east-1:123456789012"
NOW = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def pushed(s3env):
    """Three tarballs under s3://<bucket>/mme/r/ as 'mme push --copies 2' leaves them."""
    for name in ("r50.tar.gz", "r50-v1.tar.gz", "r50-v2.tar.gz"):
        s3env.client.put_object(Bucket=s3env.bucket, Key=f"mme/r/{name}", Body=b"tarball",
                                Metadata={"sha256": "x", "mme-model": "r50", "mme-format": "onnx", "mme-triton-release": "22.10"})
    return f"s3://{s3env.bucket}/mme/r"


def _plan(s3env, uri, tmp_path, **overrides):
    options = {"instance_type": "ml.g5.2xlarge", **overrides}
    request = deploy.DeployRequest(s3=uri, role_arn=ROLE, state_dir=tmp_path / "state", **options)
    return deploy.plan_deploy(request, boto3_session(), s3env.client, Reporter(quiet=True))


def _not_found(stub, method, kind, name, params):
    stub.add_client_error(method, service_error_code="ValidationException", http_status_code=400,
                          service_message=f'Could not find {kind} "{ARN}:{kind.replace(" ", "-")}/{name}".', expected_params=params)


def _endpoint(status, name="mme-r", config="mme-r-config", **extra):
    return {"EndpointName": name, "EndpointArn": f"{ARN}:endpoint/{name}", "EndpointConfigName": config,
            "EndpointStatus": status, "CreationTime": NOW, "LastModifiedTime": NOW, **extra}


def _expect_creates(stub, plan):
    _not_found(stub, "describe_model", "model", plan.model, {"ModelName": plan.model})
    stub.add_response("create_model", {"ModelArn": f"{ARN}:model/{plan.model}"}, plan.create_model)
    _not_found(stub, "describe_endpoint_config", "endpoint configuration", plan.endpoint_config,
               {"EndpointConfigName": plan.endpoint_config})
    stub.add_response("create_endpoint_config", {"EndpointConfigArn": f"{ARN}:endpoint-config/{plan.endpoint_config}"},
                      plan.create_endpoint_config)
    _not_found(stub, "describe_endpoint", "endpoint", plan.endpoint, {"EndpointName": plan.endpoint})
    stub.add_response("create_endpoint", {"EndpointArn": f"{ARN}:endpoint/{plan.endpoint}"}, plan.create_endpoint)


def test_plan_uses_the_mme_contract_and_the_image_table(s3env, pushed, tmp_path):
    plan = _plan(s3env, pushed, tmp_path)
    container = plan.create_model["PrimaryContainer"]
    assert container["Mode"] == "MultiModel" and container["ModelDataUrl"] == pushed + "/"
    assert "Environment" not in container, "an MME needs no default model name"
    # release 22.10 (from the objects' metadata): the account the articles' notebooks used
    assert container["Image"] == "785573368785.dkr.ecr.us-east-1.amazonaws.com/sagemaker-tritonserver:22.10-py3"
    assert (plan.endpoint, plan.endpoint_config, plan.model) == ("mme-r", "mme-r-config", "mme-r-model")

    single = _plan(s3env, pushed, tmp_path, mode="single", target="r50.tar.gz", image_uri="1.dkr.ecr.us-east-1.amazonaws.com/x:1")
    container = single.create_model["PrimaryContainer"]
    assert container["Mode"] == "SingleModel" and container["ModelDataUrl"] == pushed + "/r50.tar.gz"
    assert container["Environment"] == {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "r50"}
    assert container["Image"] == "1.dkr.ecr.us-east-1.amazonaws.com/x:1"

    # r50-v1/v2 are copies: the one base tarball is found without --target
    picked = _plan(s3env, pushed, tmp_path, mode="single", image_uri="1.dkr.ecr.us-east-1.amazonaws.com/x:1")
    assert picked.model_data_url == pushed + "/r50.tar.gz" and picked.endpoint == "mme-r50"


def test_deploy_waits_from_creating_to_in_service(s3env, pushed, tmp_path, stubbed, fake_clock):
    plan = _plan(s3env, pushed, tmp_path)
    sm, stub = stubbed("sagemaker")
    _expect_creates(stub, plan)
    for status in ("Creating", "Creating", "InService"):
        stub.add_response("describe_endpoint", _endpoint(status), {"EndpointName": "mme-r"})
    clock = fake_clock()
    stream = io.StringIO()
    store = DeploymentStore(tmp_path / "state")
    state = deploy.run_deploy(plan, sm, store, Reporter(stream=stream), timeout_s=600, poll_s=20,
                              sleep=clock.sleep, clock=clock.clock)
    stub.assert_no_pending_responses()
    assert state.status == "InService" and clock.sleeps == [20, 20]
    saved = json.loads(store.path("mme-r").read_text())
    assert saved["status"] == "InService"
    assert [(r["kind"], r["status"]) for r in saved["resources"]] == [
        ("model", "created"), ("endpoint-config", "created"), ("endpoint", "created")]
    assert "testing" not in store.path("mme-r").read_text(), "no credentials in the state file"
    progress = stream.getvalue()
    assert "mme-r: Creating (0 s)" in progress and "mme-r: InService (40 s)" in progress


def test_failed_endpoint_reports_its_failure_reason(s3env, pushed, tmp_path, stubbed, fake_clock):
    plan = _plan(s3env, pushed, tmp_path)
    sm, stub = stubbed("sagemaker")
    _expect_creates(stub, plan)
    reason = "The primary container for production variant AllTraffic did not pass the ping health check."
    stub.add_response("describe_endpoint", _endpoint("Creating"), {"EndpointName": "mme-r"})
    stub.add_response("describe_endpoint", _endpoint("Failed", FailureReason=reason), {"EndpointName": "mme-r"})
    clock = fake_clock()
    store = DeploymentStore(tmp_path / "state")
    with pytest.raises(EndpointFailed) as caught:
        deploy.run_deploy(plan, sm, store, Reporter(quiet=True), sleep=clock.sleep, clock=clock.clock)
    assert reason in str(caught.value) and "mme delete --endpoint mme-r" in str(caught.value)
    assert caught.value.exit_code == 3
    saved = store.load("mme-r")
    assert saved.status == "Failed" and reason in saved.failure_reason


def test_wait_gives_up_after_the_timeout(s3env, pushed, tmp_path, stubbed, fake_clock):
    sm, stub = stubbed("sagemaker")
    for _ in range(3):
        stub.add_response("describe_endpoint", _endpoint("Creating"), {"EndpointName": "mme-r"})
    clock = fake_clock()
    with pytest.raises(WaitTimeout, match="still Creating"):
        deploy.wait_for_endpoint(sm, "mme-r", 100, 40, Reporter(quiet=True), clock.sleep, clock.clock)
    assert clock.sleeps == [40, 40]


def test_ctrl_c_while_waiting_leaves_a_state_file_and_delete_cleans_up(s3env, pushed, tmp_path, stubbed, fake_clock):
    plan = _plan(s3env, pushed, tmp_path)
    sm, stub = stubbed("sagemaker")
    _expect_creates(stub, plan)
    stub.add_response("describe_endpoint", _endpoint("Creating"), {"EndpointName": "mme-r"})

    def ctrl_c(_count):
        raise KeyboardInterrupt

    clock = fake_clock(on_sleep=ctrl_c)
    store = DeploymentStore(tmp_path / "state")
    with pytest.raises(Interrupted) as caught:
        deploy.run_deploy(plan, sm, store, Reporter(quiet=True), sleep=clock.sleep, clock=clock.clock)
    assert caught.value.exit_code == 130 and "mme delete --endpoint mme-r" in str(caught.value)
    saved = store.load("mme-r")
    assert saved.status == "interrupted" and all(r.status == "created" for r in saved.resources)
    stub.assert_no_pending_responses()

    delete_plan = plan_delete("mme-r", sm, "us-east-1", saved, False, None, store.path("mme-r"))
    assert delete_plan.resources == (("endpoint", "mme-r"), ("endpoint-config", "mme-r-config"), ("model", "mme-r-model"))
    stub.add_response("delete_endpoint", {}, {"EndpointName": "mme-r"})
    stub.add_response("delete_endpoint_config", {}, {"EndpointConfigName": "mme-r-config"})
    stub.add_response("delete_model", {}, {"ModelName": "mme-r-model"})
    outcome = run_delete(delete_plan, sm, None, store, Reporter(quiet=True))
    stub.assert_no_pending_responses()
    assert set(outcome.values()) == {"deleted"}
    assert not store.path("mme-r").exists()


def test_ctrl_c_inside_a_create_call_leaves_it_listed_and_delete_tolerates_it_missing(s3env, pushed, tmp_path, stubbed):
    plan = _plan(s3env, pushed, tmp_path)
    sm, stub = stubbed("sagemaker")
    _not_found(stub, "describe_model", "model", plan.model, {"ModelName": plan.model})
    stub.add_response("create_model", {"ModelArn": f"{ARN}:model/{plan.model}"}, plan.create_model)
    _not_found(stub, "describe_endpoint_config", "endpoint configuration", plan.endpoint_config,
               {"EndpointConfigName": plan.endpoint_config})

    stub.add_response("create_endpoint_config", {"EndpointConfigArn": f"{ARN}:endpoint-config/x"}, plan.create_endpoint_config)

    def interrupt(**_kwargs):
        raise KeyboardInterrupt  # Ctrl-C while the (validated) request is on its way

    sm.meta.events.register("before-parameter-build.sagemaker.CreateEndpointConfig", interrupt)
    store = DeploymentStore(tmp_path / "state")
    with pytest.raises(Interrupted):
        deploy.run_deploy(plan, sm, store, Reporter(quiet=True))
    saved = store.load("mme-r")
    assert [(r.kind, r.status) for r in saved.resources] == [
        ("model", "created"), ("endpoint-config", "requested"), ("endpoint", "planned")]

    sm, stub = stubbed("sagemaker")  # a fresh client for the clean-up
    delete_plan = plan_delete("mme-r", sm, "us-east-1", saved, False, None, store.path("mme-r"))
    _not_found(stub, "delete_endpoint", "endpoint", "mme-r", {"EndpointName": "mme-r"})
    _not_found(stub, "delete_endpoint_config", "endpoint configuration", "mme-r-config", {"EndpointConfigName": "mme-r-config"})
    stub.add_response("delete_model", {}, {"ModelName": "mme-r-model"})
    outcome = run_delete(delete_plan, sm, None, store, Reporter(quiet=True))
    assert outcome == {"endpoint mme-r": "not found", "endpoint-config mme-r-config": "not found", "model mme-r-model": "deleted"}
    assert not store.path("mme-r").exists()


def _existing_model_and_config(stub, plan, instance_type=None):
    stub.add_response("describe_model", {"ModelName": plan.model, "ModelArn": f"{ARN}:model/{plan.model}",
                                         "CreationTime": NOW, "PrimaryContainer": plan.create_model["PrimaryContainer"]},
                      {"ModelName": plan.model})
    variant = dict(plan.create_endpoint_config["ProductionVariants"][0])
    if instance_type is not None:
        variant["InstanceType"] = instance_type
    stub.add_response("describe_endpoint_config", {
        "EndpointConfigName": plan.endpoint_config, "EndpointConfigArn": f"{ARN}:endpoint-config/x", "CreationTime": NOW,
        "ProductionVariants": [variant]}, {"EndpointConfigName": plan.endpoint_config})


def test_existing_endpoint_being_deleted_is_not_carried_on(s3env, pushed, tmp_path, stubbed):
    """(A Failed one is observed on the local SageMaker: test_deploy_local_cloud.py. Deleting is
    not: mme cloud deletes before it answers.)"""
    plan = _plan(s3env, pushed, tmp_path)
    store = DeploymentStore(tmp_path / "state")
    sm, stub = stubbed("sagemaker")
    _existing_model_and_config(stub, plan)
    stub.add_response("describe_endpoint", _endpoint("Deleting"), {"EndpointName": "mme-r"})
    with pytest.raises(DeployError, match="is being deleted; wait until it is gone"):
        deploy.run_deploy(plan, sm, store, Reporter(quiet=True))
    stub.assert_no_pending_responses()


@pytest.mark.parametrize("option,value,message", [
    ("--instance-type", "ml.g5.2xl", "is not an instance type SageMaker knows for endpoints; did you mean ml.g5.2xlarge"),
    ("--instance-type", "g5.2xlarge", "is not an instance type SageMaker knows"),
    ("--role", "SageMakerExecution", "is not an IAM role ARN"),
    ("--role", "arn:aws:iam::12345:role/x", "is not an IAM role ARN"),
    ("--inference-ami-version", "al2-ami-sagemaker-inference-gpu-9",
     "is not a host image SageMaker knows; choose one of: al2-ami-sagemaker-inference-gpu-2, "),
])
def test_bad_instance_type_or_role_rejected_before_any_call(run_cli, aws_env, monkeypatch, tmp_path, option, value, message):
    import boto3

    created = []
    monkeypatch.setattr(boto3.session.Session, "client", lambda self, service, *a, **k: created.append(service))
    args = {"--instance-type": "ml.g5.2xlarge", "--role": ROLE, option: value}
    code, out, err = run_cli("deploy", "--s3", "s3://bucket/prefix", "--state-dir", str(tmp_path / "s"),
                             *[x for pair in args.items() for x in pair])
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err
    assert created == [] and out == "" and not (tmp_path / "s").exists()


def test_missing_credentials_region_and_bucket_are_clear_errors(s3env, pushed, tmp_path, monkeypatch, stubbed):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(CredentialsError, match="no AWS credentials found"):
        _plan(s3env, pushed, tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(CredentialsError, match="no AWS region"):
        _plan(s3env, pushed, tmp_path)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with pytest.raises(S3Error, match="does not exist; create it"):
        _plan(s3env, "s3://no-such-bucket-here/p", tmp_path)
    with pytest.raises(S3Error, match="no .tar.gz under"):
        _plan(s3env, f"s3://{s3env.bucket}/empty", tmp_path)

    s3, s3stub = stubbed("s3")
    s3stub.add_client_error("head_bucket", service_error_code="403", service_message="Forbidden", http_status_code=403)
    request = deploy.DeployRequest(s3="s3://someone-elses/p", instance_type="ml.g5.2xlarge", role_arn=ROLE)
    with pytest.raises(S3Error, match="belongs to another account"):
        deploy.plan_deploy(request, boto3_session(), s3, Reporter(quiet=True))


def test_single_mode_rejects_a_multi_prefix_without_a_choice(s3env, tmp_path):
    for name in ("a.tar.gz", "b.tar.gz"):
        s3env.client.put_object(Bucket=s3env.bucket, Key=f"two/{name}", Body=b"x")
    with pytest.raises(DeployError, match="pass --target"):
        _plan(s3env, f"s3://{s3env.bucket}/two", tmp_path, mode="single", image_uri="1.dkr.ecr.us-east-1.amazonaws.com/x:1")
    with pytest.raises(DeployError, match="names one tarball"):
        deploy.check_deploy_request(deploy.DeployRequest(s3=f"s3://{s3env.bucket}/two/a.tar.gz", instance_type="ml.g5.2xlarge", role_arn=ROLE))


def test_unknown_region_for_the_image_asks_for_image_uri():
    from mme.aws.images import triton_image_uri

    with pytest.raises(AwsError, match="pass --image-uri"):
        triton_image_uri("mars-north-1", "24.09")
    assert triton_image_uri("cn-north-1", "24.09").endswith(".amazonaws.com.cn/sagemaker-tritonserver:24.09-py3")


# -- the host's NVIDIA driver -----------------------------------------------------------------

G21, G41 = "al2-ami-sagemaker-inference-gpu-2-1", "al2023-ami-sagemaker-inference-gpu-4-1"


def _push_release(s3env, release, prefix="mme/h"):
    s3env.client.put_object(Bucket=s3env.bucket, Key=f"{prefix}/r50.tar.gz", Body=b"tarball",
                            Metadata={"sha256": "x", "mme-model": "r50", "mme-format": "onnx", "mme-triton-release": release})
    return f"s3://{s3env.bucket}/{prefix}"


def test_deploy_sets_the_inference_ami_the_release_needs_and_the_request_validates(s3env, tmp_path, stubbed, fake_clock):
    uri = _push_release(s3env, "25.09")
    plan = _plan(s3env, uri, tmp_path)
    variant = plan.create_endpoint_config["ProductionVariants"][0]
    assert variant["InferenceAmiVersion"] == G41  # ml.g5's default host has driver 470; CUDA 13.0 needs 580
    assert plan.lines()[3] == (
        "  host: al2023-ami-sagemaker-inference-gpu-4-1 (driver 580, CUDA 13.0): release 25.09 needs CUDA 13.0.1, "
        "which driver 580 runs natively; InferenceAmiVersion set because ml.g5's default host (driver 470, CUDA 11.4) "
        "cannot start it")
    sm, stub = stubbed("sagemaker")
    _expect_creates(stub, plan)  # the Stubber validates each request against botocore's service model
    stub.add_response("describe_endpoint", _endpoint("InService", name=plan.endpoint, config=plan.endpoint_config),
                      {"EndpointName": plan.endpoint})
    clock = fake_clock()
    state = deploy.run_deploy(plan, sm, DeploymentStore(tmp_path / "state"), Reporter(quiet=True),
                              sleep=clock.sleep, clock=clock.clock)
    stub.assert_no_pending_responses()
    assert state.status == "InService"
    # a release the default host runs needs none: 22.10 (CUDA 11.8) on driver 470 by minor-version compatibility
    old = _plan(s3env, _push_release(s3env, "22.10", "mme/old"), tmp_path)
    assert "InferenceAmiVersion" not in old.create_endpoint_config["ProductionVariants"][0]
    assert old.lines()[3].startswith("  host: ml.g5's default host (driver 470, CUDA 11.4): release 22.10 needs CUDA 11.8.0")


def test_inference_ami_version_chosen_by_the_user_is_set_or_refused_in_one_line(s3env, tmp_path, run_cli, monkeypatch):
    uri = _push_release(s3env, "22.10")
    given = _plan(s3env, uri, tmp_path, inference_ami_version=G21)
    assert given.create_endpoint_config["ProductionVariants"][0]["InferenceAmiVersion"] == G21
    assert given.lines()[3].endswith("release 22.10 needs CUDA 11.8.0, which driver 535 runs natively")
    with pytest.raises(HostDriverError, match="driver 535 does not support ml.p6-b200's B200 .*; pass --inference-ami-version al2023"):
        _plan(s3env, uri, tmp_path, instance_type="ml.p6-b200.48xlarge", inference_ami_version=G21)

    import boto3

    created: list[str] = []
    real = boto3.session.Session.client
    monkeypatch.setattr(boto3.session.Session, "client",
                        lambda self, service, *a, **k: created.append(service) or real(self, service, *a, **k))
    code, out, err = run_cli("deploy", "--s3", uri, "--instance-type", "ml.g5.2xlarge", "--role", ROLE, "--dry-run",
                             "--inference-ami-version", "al2-ami-sagemaker-inference-neuron-2",
                             "--state-dir", str(tmp_path / "s"), "--endpoint-url", s3env.url)
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert "al2-ami-sagemaker-inference-neuron-2 is a host image for neuron accelerators" in err
    assert f"pass --inference-ami-version {G21} (driver 535, CUDA 12.2)" in err
    assert "sagemaker" not in created


def test_deploy_warns_instead_of_refusing_an_image_of_unknown_cuda_and_skips_cpu_instances(s3env, tmp_path):
    uri = _push_release(s3env, "25.09")
    stream = io.StringIO()
    request = deploy.DeployRequest(s3=uri, instance_type="ml.g5.2xlarge", role_arn=ROLE, state_dir=tmp_path / "state",
                                   image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/mine:1")
    plan = deploy.plan_deploy(request, boto3_session(), s3env.client, Reporter(stream=stream))
    assert "InferenceAmiVersion" not in plan.create_endpoint_config["ProductionVariants"][0]
    warning = stream.getvalue()
    assert warning.startswith("WARNING: ml.g5's default host (driver 470, CUDA 11.4): the CUDA of your image "
                              "123456789012.dkr.ecr.us-east-1.amazonaws.com/mine:1 is unknown")
    assert f"pass --inference-ami-version (e.g. {G41}: driver 580, CUDA 13.0)" in warning
    cpu = _plan(s3env, uri, tmp_path, instance_type="ml.m5.xlarge")
    assert "InferenceAmiVersion" not in cpu.create_endpoint_config["ProductionVariants"][0]
    assert cpu.lines()[3] == "  host: ml.m5.xlarge has no NVIDIA GPU: no driver to check"


def test_an_existing_endpoint_config_without_the_ami_is_a_conflict(s3env, tmp_path, stubbed):
    plan = _plan(s3env, _push_release(s3env, "25.09"), tmp_path)
    sm, stub = stubbed("sagemaker")
    stub.add_response("describe_model", {"ModelName": plan.model, "ModelArn": f"{ARN}:model/{plan.model}",
                                         "CreationTime": NOW, "PrimaryContainer": plan.create_model["PrimaryContainer"]},
                      {"ModelName": plan.model})
    variant = {k: v for k, v in plan.create_endpoint_config["ProductionVariants"][0].items() if k != "InferenceAmiVersion"}
    stub.add_response("describe_endpoint_config", {
        "EndpointConfigName": plan.endpoint_config, "EndpointConfigArn": f"{ARN}:endpoint-config/x", "CreationTime": NOW,
        "ProductionVariants": [variant]}, {"EndpointConfigName": plan.endpoint_config})
    with pytest.raises(DeployError) as caught:
        deploy.run_deploy(plan, sm, DeploymentStore(tmp_path / "state"), Reporter(quiet=True))
    assert str(caught.value) == (
        f"endpoint config {plan.endpoint_config} already exists with InferenceAmiVersion None (this deploy wants {G41}); "
        f"remove it with 'mme delete --endpoint {plan.endpoint}' or choose another --name")
