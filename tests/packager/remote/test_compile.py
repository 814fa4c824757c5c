"""mme compile --on sagemaker: the training-job request (checked against SageMaker's model),
state, polling, the download into artifacts/<model>/tensorrt/ with its manifest, and the
job's entry script run locally with a stand-in trtexec (the real build needs the GPU instance)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from datetime import datetime, timezone
from pathlib import Path

import pytest

from mme.progress import Reporter
from mme.versions import release as triton_release
from packager.remote import compile as remote
from packager.remote.artifact import tensorrt_config
from packager.remote.job import BuildInfo, read_job_output
from packager.remote.plan import CompileRequest, check_compile_request, load_onnx_artifact, plan_compile, manifest_profile_shapes
from packager.remote.job import wait_for_job
from packager.remote import trt_build_entry
from mme.aws.errors import AwsError, CompileFailed
from mme.aws.state import StateDir

ROLE = "arn:aws:iam::123456789012:role/SageMakerExecution"
NOW = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def _plan(s3env, onnx_artifact, tmp_path, **overrides):
    request = CompileRequest(artifact=onnx_artifact, s3=f"s3://{s3env.bucket}/work", instance_type="ml.g5.2xlarge",
                                    role_arn=ROLE, state_dir=tmp_path / "compile-state", **overrides)
    check_compile_request(request)
    artifact = load_onnx_artifact(onnx_artifact)
    store = StateDir(request.state_dir, "compile job")
    return plan_compile(request, "us-east-1", s3env.client, store, artifact, Reporter(quiet=True)), artifact, store


def _job(plan, status, secondary, **extra):
    return {"TrainingJobName": plan.job_name, "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{plan.job_name}",
            "ModelArtifacts": {"S3ModelArtifacts": f"{plan.output_uri}{plan.job_name}/output/model.tar.gz"},
            "TrainingJobStatus": status, "SecondaryStatus": secondary, "CreationTime": NOW,
            "StoppingCondition": {"MaxRuntimeInSeconds": 3600}, **extra}


def _job_output(s3env, plan, info: dict) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in (("model.plan", b"\x00TRT-PLAN" * 1000), ("build_info.json", json.dumps(info).encode())):
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    bucket_key = f"{plan.output_uri}{plan.job_name}/output/model.tar.gz"[len(f"s3://{s3env.bucket}/"):]
    s3env.client.put_object(Bucket=s3env.bucket, Key=bucket_key, Body=buffer.getvalue())


def test_plan_builds_a_valid_training_job_request(s3env, onnx_artifact, tmp_path):
    import botocore.session
    from botocore.validate import validate_parameters

    plan, artifact, _ = _plan(s3env, onnx_artifact, tmp_path)
    request = plan.create_training_job
    model = botocore.session.get_session().get_service_model("sagemaker")
    validate_parameters(request, model.operation_model("CreateTrainingJob").input_shape)
    assert request["ResourceConfig"]["InstanceType"] == "ml.g5.2xlarge"
    release = artifact.manifest.triton.release
    assert request["AlgorithmSpecification"]["TrainingImage"].endswith(f"/sagemaker-tritonserver:{release}-py3")
    # NVIDIA's entrypoint first: it sets up the image's CUDA forward compatibility, then execs the rest
    assert request["AlgorithmSpecification"]["ContainerEntrypoint"] == [
        "/opt/nvidia/nvidia_entrypoint.sh", "python3", "/opt/ml/input/data/code/trt_build_entry.py"]
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in request["InputDataConfig"]}
    assert channels == {"model": plan.input_uri, "code": plan.code_uri}
    assert plan.input_uri.startswith(f"s3://{s3env.bucket}/work/compile/{plan.job_base}/")
    assert plan.build_config["shapes"] == {
        "min": {"pixel_values": [1, 3, 160, 160]}, "opt": {"pixel_values": [8, 3, 160, 160]}, "max": {"pixel_values": [16, 3, 160, 160]}}
    assert plan.job_name == plan.job_base + "-1" and len(plan.job_name) <= 63
    assert s3env.calls.writes == 0, "planning writes nothing"


def test_plan_says_what_is_known_of_the_training_host_and_warns_without_refusing(s3env, onnx_artifact, tmp_path):
    request = CompileRequest(artifact=onnx_artifact, s3=f"s3://{s3env.bucket}/work", instance_type="ml.g5.2xlarge",
                             role_arn=ROLE, state_dir=tmp_path / "compile-state")
    stream = io.StringIO()
    plan = plan_compile(request, "us-east-1", s3env.client, StateDir(request.state_dir, "compile job"),
                        load_onnx_artifact(onnx_artifact), Reporter(stream=stream))
    rel = triton_release(plan.release)
    host = next(line for line in plan.lines() if line.startswith("  host: "))
    assert host.startswith("  host: training host of ml.g5: AWS documents no NVIDIA driver for training hosts")
    assert f"release {rel.name} needs CUDA {rel.cuda}" in host and "NVIDIA's entrypoint, which the job keeps" in host
    warnings = [line for line in stream.getvalue().splitlines() if line.startswith("WARNING:")]
    assert len(warnings) == 1 and "ml.g5's default host (driver 470, CUDA 11.4) for inference could not run it" in warnings[0]
    assert "--triton-release" in warnings[0]
    # a release the family's inference hosts run: nothing to warn about
    quiet = io.StringIO()
    plan_compile(CompileRequest(artifact=onnx_artifact, s3=request.s3, instance_type="ml.g5.2xlarge", role_arn=ROLE,
                                state_dir=request.state_dir, triton_release="22.10"),
                 "us-east-1", s3env.client, StateDir(request.state_dir, "compile job"), load_onnx_artifact(onnx_artifact),
                 Reporter(stream=quiet))
    assert "WARNING" not in quiet.getvalue()


def test_dynamic_axes_take_their_maximum_from_the_manifest():
    from packager.manifest_records import BuildDetails, TensorEntry

    class Manifest:
        inputs = (TensorEntry("input_ids", "INT64", (-1,), ("sequence",)),
                  TensorEntry("attention_mask", "INT64", (-1,), ("sequence",)))
        details = BuildDetails({"axes_max": {"sequence": 128}})

    shapes = manifest_profile_shapes(Manifest, 16)
    assert shapes["min"]["input_ids"] == [1, 1] and shapes["opt"]["input_ids"] == [8, 128] and shapes["max"]["attention_mask"] == [16, 128]
    assert trt_build_entry.shape_arg(shapes["max"]) == "input_ids:16x128,attention_mask:16x128"
    Manifest.details = BuildDetails()
    with pytest.raises(AwsError, match="without a known maximum"):
        manifest_profile_shapes(Manifest, 16)


def test_compile_runs_the_job_and_writes_the_tensorrt_artifact(s3env, onnx_artifact, tmp_path, stubbed, fake_clock):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from packager.compat import check_plan_compatible
    from packager.manifest import Manifest

    plan, artifact, store = _plan(s3env, onnx_artifact, tmp_path)
    expected_trt = triton_release(plan.release).tensorrt or "10.4.0"
    _job_output(s3env, plan, {"builder": "trtexec", "tensorrt": expected_trt, "gpu": "NVIDIA A10G", "compute_capability": "8.6"})
    sm, stub = stubbed("sagemaker")
    stub.add_client_error("describe_training_job", service_error_code="ValidationException", http_status_code=400,
                          service_message="Requested resource not found.", expected_params={"TrainingJobName": plan.job_name})
    stub.add_response("create_training_job", {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:123456789012:training-job/x"},
                      plan.create_training_job)
    for status, secondary in (("InProgress", "Starting"), ("InProgress", "Training"), ("Completed", "Completed")):
        extra = {"TrainingTimeInSeconds": 312} if status == "Completed" else {}
        stub.add_response("describe_training_job", _job(plan, status, secondary, **extra), {"TrainingJobName": plan.job_name})
    clock = fake_clock()
    out = remote.run_compile(plan, artifact, sm, s3env.client, store, Reporter(quiet=True), poll_s=30,
                             sleep=clock.sleep, clock=clock.clock)
    stub.assert_no_pending_responses()
    assert out == onnx_artifact.parent / "tensorrt" and clock.sleeps == [30, 30]

    # inputs went up with their sha256 (a re-run skips them)
    head = s3env.client.head_object(Bucket=s3env.bucket, Key=f"work/compile/{plan.job_base}/input/model.onnx")
    assert head["Metadata"]["sha256"] == artifact.sha256
    config_key = f"work/compile/{plan.job_base}/code/build_config.json"
    assert json.loads(s3env.client.get_object(Bucket=s3env.bucket, Key=config_key)["Body"].read()) == plan.build_config

    manifest = Manifest.load(out)
    assert manifest.format == "tensorrt" and manifest.versions["tensorrt"] == expected_trt
    assert manifest.details.gpu == "NVIDIA A10G" and manifest.details.compute_capability == "8.6"
    assert manifest.details.built_on == "ml.g5.2xlarge" and manifest.details.training_job == plan.job_name
    assert manifest.triton.platform == "tensorrt_plan" and manifest.timings_s == {"compile_job": 312.0}
    assert manifest.triton.release == plan.release and manifest.triton.instance_kind == "KIND_GPU"
    assert manifest.source == artifact.manifest.source and manifest.inputs == artifact.manifest.inputs
    assert manifest.details.axes_max == artifact.manifest.details.axes_max
    assert manifest.validation.passed is None and plan.job_name in manifest.validation.skipped
    check_plan_compatible(manifest, triton_release(plan.release))
    config = text_format.Parse((out / "test_resnet" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert config.platform == "tensorrt_plan" and not config.backend and config.max_batch_size == 16
    assert [i.name for i in config.input] == ["pixel_values"] and config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    with tarfile.open(out / "test_resnet.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["test_resnet", "test_resnet/1", "test_resnet/1/model.plan", "test_resnet/config.pbtxt"]
    recorded = {f.path for f in manifest.files}
    assert {"test_resnet/1/model.plan", "test_resnet.tar.gz", "sample_request.json"} <= recorded
    state = json.loads(plan.state_path.read_text())
    assert state["jobs"] == [{"name": plan.job_name, "attempt": 1, "status": "downloaded"}]


def test_failed_job_reports_its_reason_and_retry_starts_a_new_one(s3env, onnx_artifact, tmp_path, stubbed, fake_clock):
    plan, artifact, store = _plan(s3env, onnx_artifact, tmp_path)
    sm, stub = stubbed("sagemaker")
    stub.add_client_error("describe_training_job", service_error_code="ValidationException", http_status_code=400,
                          service_message="Requested resource not found.")
    stub.add_response("create_training_job", {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:123456789012:training-job/x"})
    reason = "AlgorithmError: neither trtexec nor the TensorRT Python module is available in this image"
    stub.add_response("describe_training_job", _job(plan, "Failed", "Failed", FailureReason=reason))
    clock = fake_clock()
    with pytest.raises(CompileFailed) as caught:
        remote.run_compile(plan, artifact, sm, s3env.client, store, Reporter(quiet=True), sleep=clock.sleep, clock=clock.clock)
    assert reason in str(caught.value) and "--retry" in str(caught.value)
    assert not (onnx_artifact.parent / "tensorrt").exists()

    again, _, _ = _plan(s3env, onnx_artifact, tmp_path)
    assert again.job_name == plan.job_name, "without --retry the same (failed) job is looked at"
    retry, _, _ = _plan(s3env, onnx_artifact, tmp_path, retry=True)
    assert retry.job_name == plan.job_base + "-2"


def test_waiting_gives_up_before_the_timeout_and_says_the_job_keeps_running(s3env, onnx_artifact, tmp_path, stubbed,
                                                                            fake_clock):
    from mme.aws.errors import WaitTimeout

    plan, _, _ = _plan(s3env, onnx_artifact, tmp_path)
    sm, stub = stubbed("sagemaker")
    for secondary in ("Starting", "Training", "Training", "Training"):
        stub.add_response("describe_training_job", _job(plan, "InProgress", secondary), {"TrainingJobName": plan.job_name})
    clock, lines = fake_clock(), io.StringIO()
    with pytest.raises(WaitTimeout) as caught:
        wait_for_job(sm, plan.job_name, 100, 30, Reporter(stream=lines), sleep=clock.sleep, clock=clock.clock)
    stub.assert_no_pending_responses()
    assert clock.sleeps == [30, 30, 30], "no sleep that would pass the timeout"
    assert f"training job {plan.job_name} still InProgress after 90 s; it keeps running" in str(caught.value)
    assert lines.getvalue().splitlines() == [f"  training job {plan.job_name}: InProgress / Starting (0 s)",
                                             f"  training job {plan.job_name}: InProgress / Training (30 s)"]


def test_the_plans_config_comes_from_the_onnx_config_with_the_engines_dtypes(onnx_artifact):
    from tritonclient.grpc import model_config_pb2

    from packager.triton_config import read_config

    onnx_config = read_config(onnx_artifact / "test_resnet" / "config.pbtxt")
    config = tensorrt_config(onnx_config, 4, {"pixel_values": "HALF"})
    assert onnx_config.platform != "tensorrt_plan", "the ONNX artifact's config is left as it was"
    assert config.platform == "tensorrt_plan" and config.max_batch_size == 4 and not config.parameters
    assert config.input[0].data_type == model_config_pb2.TYPE_FP16
    assert config.output[0].data_type == onnx_config.output[0].data_type, "dtypes the job did not record are kept"


def test_job_output_without_a_readable_build_info_still_gives_the_plan(tmp_path):
    def tarball(name: str, members: dict[str, bytes]) -> Path:
        path = tmp_path / name
        with tarfile.open(path, "w:gz") as tar:
            for member_name, data in members.items():
                member = tarfile.TarInfo(member_name)
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
        return path

    (tmp_path / "a").mkdir()
    output = read_job_output(tarball("a.tar.gz", {"./model.plan": b"PLAN", "build_info.json": b"{not json"}),
                                     tmp_path / "a")
    assert output.plan_file.read_bytes() == b"PLAN" and output.info == BuildInfo()
    assert output.info.tensorrt == "unknown" and output.info.command is None
    with pytest.raises(CompileFailed, match="has no model.plan"):
        read_job_output(tarball("b.tar.gz", {"build_info.json": b"{}"}), tmp_path)


def test_compile_refuses_other_formats_and_bad_instance_types(artifact, onnx_artifact, s3env, tmp_path, run_cli):
    code, out, err = run_cli("compile", "--on", "sagemaker", "--instance-type", "ml.g5.2xlarge", "--artifact",
                             str(artifact.parent / "torchscript-missing"), "--s3", f"s3://{s3env.bucket}/w", "--role", ROLE)
    assert code == 2 and "does not exist" in err
    code, out, err = run_cli("compile", "--on", "sagemaker", "--instance-type", "ml.g5.2xlargeX", "--artifact",
                             str(onnx_artifact), "--s3", f"s3://{s3env.bucket}/w", "--role", ROLE)
    assert code == 2 and "training jobs" in err
    code, out, err = run_cli("compile", "--on", "sagemaker", "--instance-type", "ml.g5.2xlarge", "--artifact",
                             str(onnx_artifact), "--s3", f"s3://{s3env.bucket}/w", "--role", ROLE, "--dry-run",
                             "--endpoint-url", s3env.url, "--state-dir", str(tmp_path / "st"))
    assert code == 0, err
    assert "CreateTrainingJob:" in out and out.splitlines()[-1] == "dry run: nothing was uploaded or started"
    assert s3env.keys() == [] and not (tmp_path / "st").exists()


def fake_trtexec(version_tag: str, rejects: str = "") -> str:
    """A stand-in trtexec: prints its version banner like the real one on every run (--help
    included) and, like TensorRT 11's, fails on an option it does not know (``rejects``)."""
    return f"""#!/bin/sh
echo "&&&& RUNNING TensorRT.trtexec [TensorRT {version_tag}] # trtexec $*"
for arg in "$@"; do
  case "$arg" in
    --help) echo "=== Build Options ==="; exit 0;;
    {rejects or '--never-rejected'}) echo "[E] Unknown option: $arg"; echo "&&&& FAILED TensorRT.trtexec [TensorRT {version_tag}]"; exit 1;;
    --saveEngine=*) out="${{arg#--saveEngine=}}";;
  esac
done
printf 'PLAN' > "$out"
echo "&&&& PASSED TensorRT.trtexec [TensorRT {version_tag}]"
"""


FAKE_TRTEXEC = fake_trtexec("v100400")
FAKE_TRTEXEC_11 = fake_trtexec("v110100", rejects="--fp16|--int8|--bf16|--best")


def _entry_config(tmp_path: Path, **extra) -> Path:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "model.onnx").write_bytes(b"onnx")
    config = {"onnx": "model.onnx", "model_channel": str(tmp_path / "in"), "model_dir": str(tmp_path / "model"),
              "output_dir": str(tmp_path / "out"), "precision": "fp16", "workspace_mib": 2048,
              "shapes": {"min": {"x": [1, 3]}, "opt": {"x": [4, 3]}, "max": {"x": [8, 3]}}, **extra}
    path = tmp_path / "build_config.json"
    path.write_text(json.dumps(config))
    return path


def _run_entry(tmp_path: Path, trtexec: str | None, **config_extra) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if trtexec is not None:
        (bin_dir / "trtexec").write_text(trtexec)
        (bin_dir / "trtexec").chmod(0o755)
    config = _entry_config(tmp_path, **config_extra)
    env = dict(os.environ, PATH=f"{bin_dir}:/usr/bin:/bin")
    return subprocess.run([sys.executable, trt_build_entry.__file__, str(config)], env=env, capture_output=True,
                          text=True, timeout=60)


def test_entry_script_builds_with_trtexec_and_records_the_build(tmp_path):
    proc = _run_entry(tmp_path, FAKE_TRTEXEC)
    assert proc.returncode == 0, proc.stderr
    info = json.loads((tmp_path / "model" / "build_info.json").read_text())
    assert (tmp_path / "model" / "model.plan").read_bytes() == b"PLAN"
    assert info["builder"] == "trtexec" and info["tensorrt"] == "10.4.0" and info["precision"] == "fp16"
    assert not (tmp_path / "out" / "failure").exists()
    assert info["command"][1:] == [f"--onnx={tmp_path}/in/model.onnx", f"--saveEngine={tmp_path}/model/model.plan",
                                   "--minShapes=x:1x3", "--optShapes=x:4x3", "--maxShapes=x:8x3",
                                   "--memPoolSize=workspace:2048M", "--fp16"]
    assert "gpu" in info and not (tmp_path / "out" / "failure").exists()


def test_the_stand_in_rejects_fp16_as_tensorrt_11s_trtexec_does(tmp_path):
    path = tmp_path / "trtexec"
    path.write_text(FAKE_TRTEXEC_11)
    path.chmod(0o755)
    done = subprocess.run([str(path), "--onnx=m.onnx", "--fp16"], capture_output=True, text=True)
    assert done.returncode == 1 and "Unknown option: --fp16" in done.stdout


def test_entry_script_on_tensorrt_11_never_passes_fp16_and_says_what_to_do(tmp_path):
    proc = _run_entry(tmp_path, FAKE_TRTEXEC_11)  # fp16 asked for, FP32 graph uploaded
    assert proc.returncode == 1
    failure = (tmp_path / "out" / "failure").read_text()
    assert "TensorRT 11 has no FP16 flag" in failure and "--triton-release" in failure
    assert "Unknown option" not in proc.stdout  # refused before trtexec ran with a flag it rejects
    assert not (tmp_path / "model" / "model.plan").exists()


@pytest.mark.parametrize(("precision", "fp16_graph", "flags"), [
    ("fp16", True, []), ("fp32", False, ["--noTF32"]), ("tf32", False, []),
])
def test_entry_script_on_tensorrt_11_uses_the_flags_it_has(tmp_path, precision, fp16_graph, flags):
    proc = _run_entry(tmp_path, FAKE_TRTEXEC_11, precision=precision, fp16_graph=fp16_graph, hardware_compatible=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads((tmp_path / "model" / "build_info.json").read_text())
    assert info["tensorrt"] == "11.1.0"
    assert info["command"][-1 - len(flags):] == flags + ["--hardwareCompatibilityLevel=ampere+"]


@pytest.mark.parametrize(("precision", "fp16_graph", "flags"), [
    ("fp16", False, ["--fp16"]), ("fp16", True, ["--stronglyTyped"]), ("fp32", False, ["--noTF32"]),
])
def test_entry_script_on_tensorrt_10_uses_its_flags(tmp_path, precision, fp16_graph, flags):
    proc = _run_entry(tmp_path, FAKE_TRTEXEC, precision=precision, fp16_graph=fp16_graph)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    command = json.loads((tmp_path / "model" / "build_info.json").read_text())["command"]
    assert command[len(command) - len(flags):] == flags and "--memPoolSize=workspace:2048M" in command


def _run_entry_with_python_tensorrt(tmp_path: Path, version: str, **config_extra) -> subprocess.CompletedProcess:
    fakes = Path(__file__).resolve().parents[2] / "fakes"
    tmp_path.mkdir(parents=True)
    config = _entry_config(tmp_path, **config_extra)
    env = dict(os.environ, PATH=f"{tmp_path}/empty-bin", PYTHONPATH=str(fakes), FAKE_TENSORRT_VERSION=version,
               FAKE_TENSORRT_LOG=str(tmp_path / "builds.jsonl"))
    return subprocess.run([sys.executable, trt_build_entry.__file__, str(config)], env=env, capture_output=True,
                          text=True, timeout=60)


def test_python_fallback_builds_fp16_with_the_flag_on_tensorrt_10_and_clears_tf32_for_fp32(tmp_path):
    proc = _run_entry_with_python_tensorrt(tmp_path / "a", "10.13.3.9", precision="fp16")
    assert proc.returncode == 0, proc.stderr
    build = json.loads((tmp_path / "a" / "builds.jsonl").read_text())
    assert build["set"] == ["FP16"] and "TF32" in build["flags"]
    proc = _run_entry_with_python_tensorrt(tmp_path / "b", "10.13.3.9", precision="fp32")
    build = json.loads((tmp_path / "b" / "builds.jsonl").read_text())
    assert proc.returncode == 0 and build["cleared"] == ["TF32"] and "TF32" not in build["flags"]


def test_python_fallback_on_tensorrt_11_refuses_fp16_from_an_fp32_graph_instead_of_dropping_it(tmp_path):
    proc = _run_entry_with_python_tensorrt(tmp_path / "a", "11.1.0.106", precision="fp16")
    assert proc.returncode == 1 and "TensorRT 11 has no FP16 flag" in (tmp_path / "a" / "out" / "failure").read_text()
    assert not (tmp_path / "a" / "builds.jsonl").exists()
    proc = _run_entry_with_python_tensorrt(tmp_path / "b", "11.1.0.106", precision="fp16", fp16_graph=True,
                                           hardware_compatible=True)
    assert proc.returncode == 0, proc.stderr
    build = json.loads((tmp_path / "b" / "builds.jsonl").read_text())
    assert build["set"] == [] and build["hardware_compatibility_level"] == "AMPERE_PLUS"


def test_pip_fallback_asks_for_a_version_pypi_has():
    # libnvinfer.so.10.13.3 -> PyPI's 10.13.3.9: "==10.13.3" would never match, the wildcard does.
    assert trt_build_entry.pip_requirement("10.13.3", 13) == "tensorrt-cu13==10.13.3.*"
    assert trt_build_entry.pip_requirement("10.4.0", None) == "tensorrt-cu12==10.4.0.*"


def test_entry_script_without_a_builder_writes_the_failure_reason(tmp_path):
    config = _entry_config(tmp_path, allow_pip=False)
    env = dict(os.environ, PATH=f"{tmp_path}/empty-bin")
    proc = subprocess.run([sys.executable, trt_build_entry.__file__, str(config)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "neither trtexec nor the TensorRT Python module" in (tmp_path / "out" / "failure").read_text()


def test_trtexec_version_parsing():
    assert trt_build_entry.version_from_trtexec_output("[TensorRT v8501] # trtexec") == "8.5.1"
    assert trt_build_entry.version_from_trtexec_output("[TensorRT v100400]") == "10.4.0"
    assert trt_build_entry.version_from_trtexec_output("[I] TensorRT version: 8.5.0\n") == "8.5.0"
    assert trt_build_entry.version_from_trtexec_output("nothing") is None
