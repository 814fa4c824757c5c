"""packager.compat: an engine that cannot load in the serving release or on the target GPU
is refused with a one-line fix (another TensorRT, another Torch-TensorRT engine ABI, another
compute capability, a release that does not run on the GPU); everything else passes."""

from __future__ import annotations

import json

import pytest

from mme.errors import MmeError
from mme.versions import release
from packager.compat import (
    EngineFacts,
    PlanIncompatibleError,
    check_artifact,
    check_gpu,
    check_plan_compatible,
    check_release_on_gpu,
    compat_warnings,
    main,
)
from serving.deploy.s3push import engine_metadata
from mme.instances import instance_gpu


def manifest(fmt: str = "tensorrt", tensorrt: str | None = "11.1.0.106", platform: str | None = None, *,
             torch_tensorrt: str | None = None, abi: str | None = None, cc: str | None = "9.0",
             hardware: str | None = "none", torch: str = "2.14.1") -> dict:
    versions = {"mme-toolkit": "0.1.0", "torch": torch}
    if tensorrt is not None:
        versions["tensorrt"] = tensorrt
    if torch_tensorrt is not None:
        versions["torch_tensorrt"] = torch_tensorrt
    details = {"compute_capability": cc, "hardware_compatibility": hardware}
    if abi is not None:
        details["torch_tensorrt_abi"] = abi
    platform = platform or {"tensorrt": "tensorrt_plan", "torch-tensorrt": "pytorch_libtorch",
                            "torchscript": "pytorch_libtorch", "onnx": "onnxruntime_onnx", "cpu-local": None}[fmt]
    return {"schema_version": 1, "model": "resnet50", "requested_name": "resnet50", "format": fmt,
            "triton": {"platform": platform, "target": release("26.07").to_dict()}, "versions": versions,
            "details": details}


def test_a_plan_built_with_the_releases_tensorrt_passes():
    check_plan_compatible(manifest(tensorrt="11.1.0.106"), release("26.07"))
    check_plan_compatible(manifest(tensorrt="10.4.0.26"), release("24.09"))  # build number ignored
    check_plan_compatible(manifest(tensorrt="10.13.3.9"), release("25.09"))


def test_a_plan_for_another_tensorrt_is_refused_with_both_fixes():
    with pytest.raises(PlanIncompatibleError) as info:
        check_plan_compatible(manifest(tensorrt="10.4.0.26"), release("26.07"))
    message = str(info.value)
    assert "\n" not in message
    assert isinstance(info.value, MmeError) and info.value.exit_code == 2
    assert "resnet50 (TensorRT plan) was built with TensorRT 10.4.0.26" in message
    assert "Triton release 26.07 (nvcr.io/nvidia/tritonserver:26.07-py3) runs TensorRT 11.1.0.106" in message
    assert "rebuild it with the builder image of release 26.07 (make docker-package TRITON_RELEASE=26.07)" in message
    assert "or pass --triton-release 24.09" in message


def test_when_no_release_runs_that_tensorrt_rebuilding_is_the_fix():
    with pytest.raises(PlanIncompatibleError, match="no release in mme/versions.toml runs TensorRT 9.9.9"):
        check_plan_compatible(manifest(tensorrt="9.9.9"), release("26.07"))


@pytest.mark.parametrize("recorded", [None, "unknown", ""])
def test_a_plan_without_a_recorded_tensorrt_is_refused(recorded):
    with pytest.raises(PlanIncompatibleError, match="records no TensorRT version"):
        check_plan_compatible(manifest(tensorrt=recorded), release("26.07"))


def test_torch_tensorrt_modules_hold_engines_too():
    with pytest.raises(PlanIncompatibleError, match=r"\(Torch-TensorRT module\) was built with TensorRT 10.4.0"):
        check_plan_compatible(manifest("torch-tensorrt", tensorrt="10.4.0", torch_tensorrt="2.5.0a0"), release("26.07"))
    check_plan_compatible(manifest("torch-tensorrt", tensorrt="11.1.0.106", torch_tensorrt="2.14.0a0", abi="9"),
                          release("26.07"))


def test_torch_tensorrt_of_another_engine_abi_is_refused():
    # PyPI's torch-tensorrt 2.14.0 (ABI 10) against NGC 26.07's 2.14.0a0 runtime (ABI 9):
    # same TensorRT, same version line, and still refused at load by Triton's libtorch backend.
    pypi = manifest("torch-tensorrt", tensorrt="11.1.0.106", torch_tensorrt="2.14.0", abi="10")
    with pytest.raises(PlanIncompatibleError) as info:
        check_plan_compatible(pypi, release("26.07"))
    message = str(info.value)
    assert "Torch-TensorRT 2.14.0 (engine ABI 10)" in message and "(engine ABI 9)" in message
    assert "make docker-package TRITON_RELEASE=26.07" in message
    # NGC 25.04 and 25.09 share ABI 7 (but not TensorRT: the TensorRT check still applies).
    check_plan_compatible(manifest("torch-tensorrt", tensorrt="10.13.3.9", torch_tensorrt="2.7.0a0", abi="7"),
                          release("25.09"))


def test_without_a_recorded_abi_the_release_line_decides():
    with pytest.raises(PlanIncompatibleError, match="Torch-TensorRT 2.14.0 but"):
        check_plan_compatible(manifest("torch-tensorrt", tensorrt="10.13.3.9", torch_tensorrt="2.14.0"), release("25.09"))
    check_plan_compatible(manifest("torch-tensorrt", tensorrt="10.13.3.9", torch_tensorrt="2.9.0a0"), release("25.09"))
    with pytest.raises(PlanIncompatibleError, match="records no Torch-TensorRT version"):
        check_plan_compatible(manifest("torch-tensorrt", tensorrt="10.13.3.9"), release("25.09"))


def test_a_plan_platform_is_checked_whatever_the_format_field_says():
    data = manifest("tensorrt", tensorrt="8.5.0.12")
    data["format"] = "custom"
    with pytest.raises(PlanIncompatibleError):
        check_plan_compatible(data, release("26.07"))


@pytest.mark.parametrize("fmt", ["torchscript", "onnx", "cpu-local"])
def test_formats_without_engines_always_pass(fmt):
    check_plan_compatible(manifest(fmt, tensorrt="1.0.0"), release("22.10"))
    check_gpu(manifest(fmt, cc="9.0"), "7.5", "ml.g4dn.xlarge")


def test_manifest_objects_are_accepted():
    class Fake:
        def to_dict(self):
            return manifest(tensorrt="10.4.0")

    with pytest.raises(PlanIncompatibleError):
        check_plan_compatible(Fake(), release("26.07"))


# -- the GPU a plan was built for --------------------------------------------------------------

def test_a_plan_built_on_a_hopper_is_refused_on_g5_and_g6_with_the_fixes():
    plan = manifest(tensorrt="10.13.3.9", cc="9.0")
    for instance, cc in (("ml.g5.2xlarge", "8.6"), ("ml.g6.xlarge", "8.9")):
        gpu = instance_gpu(instance)
        assert gpu.compute_capability == cc
        with pytest.raises(PlanIncompatibleError) as info:
            check_artifact(plan, release("25.09"), compute_capability=gpu.compute_capability,
                           where=gpu.describe(instance))
        message = str(info.value)
        assert f"built for compute capability 9.0 but {instance}" in message and cc in message
        assert "mme compile --on sagemaker" in message and "--hardware-compatible" in message and "\n" not in message
    check_gpu(manifest(cc="8.6"), "8.6", "ml.g5.12xlarge (A10G)")


def test_a_hardware_compatible_plan_loads_on_every_ampere_or_newer_gpu_but_not_on_a_t4():
    portable = manifest(tensorrt="10.13.3.9", cc="9.0", hardware="ampere_plus")
    for cc in ("8.0", "8.6", "8.9", "9.0"):
        check_gpu(portable, cc, "an Ampere-or-newer GPU")
    with pytest.raises(PlanIncompatibleError) as info:
        check_gpu(portable, "7.5", "ml.g4dn.xlarge (T4)")
    assert "--hardware-compatible" not in str(info.value)  # it cannot help on a T4


def test_a_plan_without_a_recorded_gpu_is_refused_against_a_known_gpu_only():
    with pytest.raises(PlanIncompatibleError, match="records no GPU compute capability"):
        check_gpu(manifest(cc=None), "8.6", "ml.g5.xlarge")
    check_gpu(manifest(cc=None), None, "an instance the table does not know")


def test_a_release_that_dropped_volta_is_refused_on_p3():
    gpu = instance_gpu("ml.p3.2xlarge")
    with pytest.raises(PlanIncompatibleError) as info:
        check_release_on_gpu(release("25.09"), gpu.compute_capability, gpu.describe("ml.p3.2xlarge"))
    message = str(info.value)
    assert "Triton 25.09 supports GPUs of compute capability 7.5 and newer" in message
    assert "deploy release 24.09" in message
    check_release_on_gpu(release("24.09"), "7.0", "ml.p3.2xlarge")
    check_release_on_gpu(release("25.09"), None, "a CPU instance")


def test_instance_families_map_to_their_gpus():
    assert instance_gpu("ml.g5.48xlarge").gpu == "A10G"
    assert instance_gpu("ml.g4dn.xlarge").compute_capability == "7.5"
    assert instance_gpu("ml.p5.48xlarge").compute_capability == "9.0"
    assert instance_gpu("ml.m5.xlarge").compute_capability is None


def test_torchscript_saved_by_a_newer_torch_is_a_warning():
    lines = compat_warnings(manifest("torchscript", torch="2.14.1"), release("25.09"))
    assert len(lines) == 1 and "torch 2.14.1" in lines[0] and "2.9.0a0" in lines[0] and "builder image" in lines[0]
    assert compat_warnings(manifest("torchscript", torch="2.9.0a0+x"), release("25.09")) == []
    assert compat_warnings(manifest("onnx", torch="2.14.1"), release("25.09")) == []


def test_engine_facts_round_trip_through_s3_metadata():
    data = manifest("torch-tensorrt", tensorrt="10.13.3.9", torch_tensorrt="2.9.0a0", abi="7", cc="8.6",
                    hardware="ampere_plus")
    facts = EngineFacts.of(data)
    metadata = engine_metadata(facts)
    assert metadata["mme-compute-capability"] == "8.6" and metadata["mme-torch-tensorrt-abi"] == "7"
    back = EngineFacts.from_s3_metadata({**metadata, "mme-model": "resnet50", "mme-format": "torch-tensorrt"})
    assert back == facts
    assert engine_metadata(EngineFacts.of(manifest("onnx"))) == {}


def test_command_line_checks_every_manifest_under_the_paths(tmp_path, capsys):
    good = tmp_path / "artifacts" / "resnet50" / "tensorrt"
    good.mkdir(parents=True)
    # a whole manifest, as 'mme package' writes it (the command reads them with Manifest.load)
    whole = manifest(tensorrt="11.1.0.106", cc="8.6") | {
        "source": {"family": "timm", "name": "resnet50", "weights": "pretrained"}, "tarball": "resnet50.tar.gz",
        "files": [], "inputs": [], "outputs": [],
        "sample_request": {"json_file": "sample_request.json", "binary_file": "sample_request.bin", "binary_header_size": 0}}
    (good / "manifest.json").write_text(json.dumps(whole))
    assert main(["--release", "26.07", str(tmp_path / "artifacts")]) == 0
    assert "ok: 1 artifact(s) load on Triton 26.07" in capsys.readouterr().out
    assert main(["--release", "26.07", "--instance-type", "ml.g5.2xlarge", str(good)]) == 0
    assert "ml.g5.2xlarge (A10G)" in capsys.readouterr().out

    assert main(["--release", "24.09", str(good)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mme: error: resnet50 (TensorRT plan) was built with TensorRT 11.1.0.106")
    assert "--triton-release 26.07" in err

    assert main(["--release", "26.07", "--instance-type", "ml.g6.xlarge", str(good)]) == 2
    assert "built for compute capability 8.6 but ml.g6.xlarge" in capsys.readouterr().err

    assert main([str(tmp_path / "empty")]) == 2
    assert "no manifest.json" in capsys.readouterr().err
