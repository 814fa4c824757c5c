"""What a deploy would only reveal after many minutes is refused before anything is written:
a release AWS publishes no SageMaker Triton image for, a TensorRT plan built for another GPU
than the instance's, a release that does not run on the instance's GPU. And the remote
compile asks TensorRT for what its major version accepts (an FP16 graph for TensorRT 11)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from mme.errors import MmeError
from mme.progress import Reporter
from mme.versions import NoSageMakerImageError, release
from packager.compat import PlanIncompatibleError
from packager.manifest import Manifest
from packager.manifest_records import TritonTarget
from packager.remote.plan import CompileRequest, check_compile_request, load_onnx_artifact, plan_compile
from mme.aws.s3 import TransferSettings
from packager.remote.job import upload_inputs
from serving.deploy import endpoint as deploy
from serving.deploy.s3push import PushRequest, push
from mme.aws.session import S3Uri, boto3_session
from mme.aws.state import StateDir

ROLE = "arn:aws:iam::123456789012:role/SageMakerExecution"


def as_engine(artifact, *, release_name="25.09", cc="9.0", hardware="none", tensorrt=None):
    """Turn the copied artifact's manifest into a TensorRT plan's (format and engine facts only)."""
    manifest = Manifest.load(artifact)
    replace(
        manifest, format="tensorrt",
        triton=replace(manifest.triton, platform="tensorrt_plan", backend=None, instance_kind="KIND_GPU",
                       target=TritonTarget.from_release(release(release_name))),
        versions=manifest.versions | {"tensorrt": tensorrt or release(release_name).tensorrt},
        details=manifest.details.updated(compute_capability=cc, hardware_compatibility=hardware, gpu="NVIDIA H200"),
    ).write(artifact)
    return artifact


def retarget(artifact, release_name):
    manifest = Manifest.load(artifact)
    replace(manifest, triton=replace(manifest.triton, target=TritonTarget.from_release(release(release_name)))).write(artifact)
    return artifact


def do_push(s3env, artifact, **options):
    request = PushRequest(artifact=artifact, destination=S3Uri.parse(f"s3://{s3env.bucket}/gpu"),
                          allow_random_weights=True, **options)
    return push(s3env.client, request, Reporter(quiet=True), out=lambda line: None)


# -- push ----------------------------------------------------------------------------------

def test_push_refuses_a_plan_for_another_gpu_and_records_the_engine_facts(s3env, artifact):
    as_engine(artifact, cc="9.0")
    with pytest.raises(PlanIncompatibleError, match="built for compute capability 9.0 but ml.g5.2xlarge"):
        do_push(s3env, artifact, instance_type="ml.g5.2xlarge")
    assert s3env.keys() == [] and s3env.calls.writes == 0

    do_push(s3env, artifact, instance_type="ml.p5.48xlarge")  # an H100: same architecture as the build
    head = s3env.client.head_object(Bucket=s3env.bucket, Key="gpu/test_resnet.tar.gz")["Metadata"]
    assert head["mme-compute-capability"] == "9.0" and head["mme-tensorrt"] == release("25.09").tensorrt
    assert head["mme-hardware-compatibility"] == "none" and head["mme-triton-release"] == "25.09"


def test_push_refuses_a_release_without_a_sagemaker_image_unless_given_one(s3env, artifact):
    retarget(artifact, "26.07")
    with pytest.raises(NoSageMakerImageError) as info:
        do_push(s3env, artifact)
    assert "--image-uri" in str(info.value) and s3env.calls.writes == 0
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/my-triton:26.07"
    do_push(s3env, artifact, image_uri=image)
    head = s3env.client.head_object(Bucket=s3env.bucket, Key="gpu/test_resnet.tar.gz")["Metadata"]
    assert head["mme-image-uri"] == image


# -- deploy --------------------------------------------------------------------------------

def plan_deploy(s3env, tmp_path, instance_type, **overrides):
    request = deploy.DeployRequest(s3=f"s3://{s3env.bucket}/gpu", instance_type=instance_type, role_arn=ROLE,
                                   state_dir=tmp_path / "state", **overrides)
    return deploy.plan_deploy(request, boto3_session(), s3env.client, Reporter(quiet=True))


def test_deploy_refuses_a_plan_built_for_another_gpu_and_accepts_a_hardware_compatible_one(s3env, artifact, tmp_path,
                                                                                            change_tarball):
    as_engine(artifact, cc="9.0")
    do_push(s3env, artifact)
    with pytest.raises(PlanIncompatibleError) as info:
        plan_deploy(s3env, tmp_path, "ml.g6.2xlarge")
    assert "built for compute capability 9.0 but ml.g6.2xlarge (L4) has 8.9" in str(info.value)
    assert plan_deploy(s3env, tmp_path, "ml.p5.48xlarge").instance_type == "ml.p5.48xlarge"

    as_engine(artifact, cc="9.0", hardware="ampere_plus")
    change_tarball(artifact, b"a hardware-compatible build is another plan")
    do_push(s3env, artifact)
    assert plan_deploy(s3env, tmp_path, "ml.g6.2xlarge").image_uri.endswith("/sagemaker-tritonserver:25.09-py3")
    with pytest.raises(PlanIncompatibleError, match="T4"):
        plan_deploy(s3env, tmp_path, "ml.g4dn.xlarge")


def test_deploy_refuses_a_release_that_does_not_run_on_the_instance(s3env, artifact, tmp_path):
    do_push(s3env, artifact)  # cpu-local of release 25.09: no engine, but 25.09 needs compute capability 7.5+
    with pytest.raises(PlanIncompatibleError, match="ml.p3.2xlarge .*7.0.*deploy release 24.09"):
        plan_deploy(s3env, tmp_path, "ml.p3.2xlarge")
    assert plan_deploy(s3env, tmp_path, "ml.p3.2xlarge", triton_release="24.09").image_uri.endswith(":24.09-py3")


def test_deploy_uses_the_image_recorded_at_push_for_a_self_hosted_release(s3env, artifact, tmp_path):
    retarget(artifact, "26.07")
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/my-triton:26.07"
    do_push(s3env, artifact, image_uri=image)
    assert plan_deploy(s3env, tmp_path, "ml.g5.2xlarge").image_uri == image
    # without the recorded image, 26.07 has nothing to deploy with
    s3env.client.copy_object(Bucket=s3env.bucket, Key="gpu/test_resnet.tar.gz", CopySource=f"{s3env.bucket}/gpu/test_resnet.tar.gz",
                             MetadataDirective="REPLACE", Metadata={"mme-model": "test_resnet", "mme-format": "onnx",
                                                                     "mme-triton-release": "26.07"})
    with pytest.raises(NoSageMakerImageError):
        plan_deploy(s3env, tmp_path, "ml.g5.2xlarge")


# -- compile ---------------------------------------------------------------------------------

def compile_plan(s3env, onnx_artifact, tmp_path, **overrides):
    options = {"instance_type": "ml.g5.2xlarge", **overrides}
    request = CompileRequest(artifact=onnx_artifact, s3=f"s3://{s3env.bucket}/work", role_arn=ROLE,
                                    state_dir=tmp_path / "compile-state", **options)
    check_compile_request(request)
    artifact = load_onnx_artifact(onnx_artifact)
    store = StateDir(request.state_dir, "compile job")
    return plan_compile(request, "us-east-1", s3env.client, store, artifact, Reporter(quiet=True)), artifact


def test_compile_refuses_a_release_without_a_sagemaker_image_and_a_gpu_it_does_not_run_on(s3env, onnx_artifact, tmp_path):
    with pytest.raises(NoSageMakerImageError):
        compile_plan(s3env, onnx_artifact, tmp_path, triton_release="26.07")
    with pytest.raises(PlanIncompatibleError, match="compute capability 7.5 and newer"):
        compile_plan(s3env, onnx_artifact, tmp_path, instance_type="ml.p3.2xlarge")
    with pytest.raises(MmeError, match="fp32, tf32 or fp16"):
        check_compile_request(CompileRequest(artifact=onnx_artifact, s3="s3://b/p", instance_type="ml.g5.2xlarge",
                                                   role_arn=ROLE, precision="int8"))


def test_compile_for_tensorrt_10_sends_the_fp16_flag_path(s3env, onnx_artifact, tmp_path):
    plan, _ = compile_plan(s3env, onnx_artifact, tmp_path)
    assert plan.release == "25.09" and plan.build_config["precision"] == "fp16"
    assert plan.build_config["fp16_graph"] is False  # TensorRT 10.13: trtexec --fp16 works
    assert plan.build_config["shapes"]["opt"]["pixel_values"][0] == 8


def test_compile_for_tensorrt_11_uploads_an_fp16_graph_that_onnxruntime_runs(s3env, onnx_artifact, tmp_path):
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/my-triton:26.07"
    plan, artifact = compile_plan(s3env, onnx_artifact, tmp_path, triton_release="26.07", image_uri=image)
    assert plan.build_config["fp16_graph"] is True and plan.image_uri == image
    upload_inputs(s3env.client, plan, artifact, TransferSettings(), Reporter(quiet=True))
    uri = S3Uri.parse(plan.input_uri)
    local = tmp_path / "uploaded.onnx"
    s3env.client.download_file(uri.bucket, uri.key("model.onnx"), str(local))
    model = onnx.load(str(local))
    kinds = {init.data_type for init in model.graph.initializer}
    assert onnx.TensorProto.FLOAT16 in kinds and onnx.TensorProto.FLOAT not in kinds
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # I/O kept FP32
    x = np.random.default_rng(0).standard_normal((2, 3, 160, 160), dtype=np.float32)
    fp16 = ort.InferenceSession(str(local), providers=["CPUExecutionProvider"]).run(None, {"pixel_values": x})[0]
    fp32 = ort.InferenceSession(str(artifact.onnx), providers=["CPUExecutionProvider"]).run(None, {"pixel_values": x})[0]
    assert fp16.dtype == np.float32 and np.max(np.abs(fp16 - fp32)) < 5e-2
    code = S3Uri.parse(plan.code_uri)
    uploaded = json.loads(s3env.client.get_object(Bucket=code.bucket, Key=code.key("build_config.json"))["Body"].read())
    assert uploaded["fp16_graph"] is True and uploaded["precision"] == "fp16"
