"""packager.compat: a TensorRT engine built for another TensorRT than the serving release
runs is refused with a one-line fix; everything else passes."""

from __future__ import annotations

import json

import pytest

from mme.errors import MmeError
from mme.versions import release
from packager.compat import PlanIncompatibleError, check_plan_compatible, main


def manifest(fmt: str = "tensorrt", tensorrt: str | None = "11.1.0.106", platform: str | None = None) -> dict:
    versions = {"mme-toolkit": "0.1.0", "torch": "2.14.1"}
    if tensorrt is not None:
        versions["tensorrt"] = tensorrt
    platform = platform or {"tensorrt": "tensorrt_plan", "torch-tensorrt": "pytorch_libtorch",
                            "torchscript": "pytorch_libtorch", "onnx": "onnxruntime_onnx", "cpu-local": None}[fmt]
    return {"schema_version": 1, "model": "resnet50", "requested_name": "resnet50", "format": fmt,
            "triton": {"platform": platform, "target": release("26.07").to_dict()}, "versions": versions}


def test_a_plan_built_with_the_releases_tensorrt_passes():
    check_plan_compatible(manifest(tensorrt="11.1.0.106"), release("26.07"))
    check_plan_compatible(manifest(tensorrt="10.4.0.26"), release("24.09"))  # build number ignored


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
        check_plan_compatible(manifest("torch-tensorrt", tensorrt="10.4.0"), release("26.07"))
    check_plan_compatible(manifest("torch-tensorrt", tensorrt="11.1.0.106"), release("26.07"))


def test_a_plan_platform_is_checked_whatever_the_format_field_says():
    data = manifest("tensorrt", tensorrt="8.5.0.12")
    data["format"] = "custom"
    with pytest.raises(PlanIncompatibleError):
        check_plan_compatible(data, release("26.07"))


@pytest.mark.parametrize("fmt", ["torchscript", "onnx", "cpu-local"])
def test_formats_without_engines_always_pass(fmt):
    check_plan_compatible(manifest(fmt, tensorrt="1.0.0"), release("22.10"))


def test_manifest_objects_are_accepted():
    class Fake:
        def to_dict(self):
            return manifest(tensorrt="10.4.0")

    with pytest.raises(PlanIncompatibleError):
        check_plan_compatible(Fake(), release("26.07"))


def test_command_line_checks_every_manifest_under_the_paths(tmp_path, capsys):
    good = tmp_path / "artifacts" / "resnet50" / "tensorrt"
    good.mkdir(parents=True)
    (good / "manifest.json").write_text(json.dumps(manifest(tensorrt="11.1.0.106")))
    assert main(["--release", "26.07", str(tmp_path / "artifacts")]) == 0
    assert "ok: 1 artifact(s) load on Triton 26.07" in capsys.readouterr().out

    assert main(["--release", "24.09", str(good)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mme: error: resnet50 (TensorRT plan) was built with TensorRT 11.1.0.106")
    assert "--triton-release 26.07" in err

    assert main([str(tmp_path / "empty")]) == 2
    assert "no manifest.json" in capsys.readouterr().err
