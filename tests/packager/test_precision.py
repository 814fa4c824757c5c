"""Precision is what it says (packager/formats/gpu.py), checked on CPU against the contracts
of the real libraries: the TensorRT builder flags each precision sets (with a stand-in of the
bindings, tests/fakes/tensorrt, in its TensorRT 10 and 11 shapes), the Torch-TensorRT keyword
arguments each release line honours, the engine inspector's layer precisions, the tolerances,
and the optimisation profile that made Torch-TensorRT fail for max batch 2 or 3."""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path

import pytest

from packager.formats import gpu

FAKES = Path(__file__).resolve().parents[1] / "fakes"


def fake_tensorrt(monkeypatch, version: str):
    monkeypatch.setenv("FAKE_TENSORRT_VERSION", version)
    monkeypatch.syspath_prepend(str(FAKES))
    monkeypatch.delitem(sys.modules, "tensorrt", raising=False)
    module = importlib.import_module("tensorrt")
    monkeypatch.delitem(sys.modules, "tensorrt")  # the next import reads the version again
    return module


@pytest.mark.parametrize("version", ["10.13.3.9", "11.1.0.106"])
def test_fp32_clears_tf32_which_tensorrt_enables_by_default(monkeypatch, version):
    trt = fake_tensorrt(monkeypatch, version)
    config = trt.Builder(trt.Logger()).create_builder_config()
    assert config.get_flag(trt.BuilderFlag.TF32)  # the default "fp32" engine would compute in TF32
    settings = gpu.configure_builder(trt, config, "fp32", hardware_compatible=False)
    assert not config.get_flag(trt.BuilderFlag.TF32) and config.cleared == ["TF32"] and config.set == []
    assert settings == {"tf32": False}
    assert config.profiling_verbosity == trt.ProfilingVerbosity.DETAILED  # the inspector can say what ran
    assert config.hardware_compatibility_level == trt.HardwareCompatibilityLevel.NONE


def test_tf32_is_an_explicit_choice(monkeypatch):
    trt = fake_tensorrt(monkeypatch, "10.13.3.9")
    config = trt.Builder(trt.Logger()).create_builder_config()
    assert gpu.configure_builder(trt, config, "tf32", hardware_compatible=False) == {"tf32": True}
    assert config.get_flag(trt.BuilderFlag.TF32) and config.cleared == []


def test_fp16_uses_the_builder_flag_on_tensorrt_10_and_an_fp16_graph_on_11(monkeypatch):
    trt10 = fake_tensorrt(monkeypatch, "10.13.3.9")
    config = trt10.Builder(trt10.Logger()).create_builder_config()
    assert not gpu.fp16_needs_fp16_graph(trt10)
    assert gpu.configure_builder(trt10, config, "fp16", False)["fp16"] == "BuilderFlag.FP16"
    assert config.set == ["FP16"]

    trt11 = fake_tensorrt(monkeypatch, "11.1.0.106")
    assert not hasattr(trt11.BuilderFlag, "FP16")  # as in TensorRT 11
    config = trt11.Builder(trt11.Logger()).create_builder_config()
    assert gpu.fp16_needs_fp16_graph(trt11)
    assert gpu.configure_builder(trt11, config, "fp16", False)["fp16"].startswith("fp16 ONNX graph")
    assert config.set == []


def test_hardware_compatible_sets_ampere_plus(monkeypatch):
    trt = fake_tensorrt(monkeypatch, "10.13.3.9")
    config = trt.Builder(trt.Logger()).create_builder_config()
    settings = gpu.configure_builder(trt, config, "fp32", hardware_compatible=True)
    assert config.hardware_compatibility_level == trt.HardwareCompatibilityLevel.AMPERE_PLUS
    assert settings["hardware_compatibility"] == "ampere_plus"


def test_an_unknown_precision_is_a_usage_error(monkeypatch):
    from mme.errors import UsageError

    trt = fake_tensorrt(monkeypatch, "10.13.3.9")
    with pytest.raises(UsageError, match="fp32, tf32, fp16"):
        gpu.configure_builder(trt, trt.Builder(trt.Logger()).create_builder_config(), "int8", False)


# -- Torch-TensorRT: the keyword arguments each release line honours -------------------------

TORCH = types.SimpleNamespace(float32="float32", float16="float16")
COMMON = {"inputs", "enabled_precisions", "disable_tf32", "hardware_compatible", "workspace_size"}
LINES = {
    "2.9 (NGC 25.09)": COMMON | {"use_explicit_typing"},  # use_explicit_typing False by default
    "2.12": COMMON | {"use_explicit_typing", "enable_autocast", "autocast_low_precision_type"},
    "2.14 (NGC 26.07)": COMMON | {"enable_autocast", "autocast_low_precision_type"},  # enabled_precisions ignored
}


@pytest.mark.parametrize("line", LINES)
def test_torch_tensorrt_fp32_disables_tf32(line):
    args = gpu.torch_tensorrt_precision_args(LINES[line], "fp32", TORCH)
    assert args == {"disable_tf32": True, "enabled_precisions": {"float32"}}
    assert gpu.torch_tensorrt_precision_args(LINES[line], "tf32", TORCH)["disable_tf32"] is False


def test_torch_tensorrt_fp16_goes_through_the_api_each_line_honours():
    assert gpu.torch_tensorrt_precision_args(LINES["2.9 (NGC 25.09)"], "fp16", TORCH) == {
        "disable_tf32": False, "enabled_precisions": {"float16", "float32"}, "use_explicit_typing": False}
    assert gpu.torch_tensorrt_precision_args(LINES["2.12"], "fp16", TORCH)["use_explicit_typing"] is False
    newest = gpu.torch_tensorrt_precision_args(LINES["2.14 (NGC 26.07)"], "fp16", TORCH)
    assert newest == {"disable_tf32": False, "enable_autocast": True, "autocast_low_precision_type": "float16"}
    assert "enabled_precisions" not in newest  # 2.13+ would ignore it and build FP32 silently


# -- the engine inspector ------------------------------------------------------------------------

def inspector_json(*datatypes: str) -> str:
    """The shape of IEngineInspector.get_engine_information(JSON) with DETAILED verbosity (TensorRT 10)."""
    layers = [{"Name": f"layer{i}", "LayerType": "CaskConvolution",
               "Outputs": [{"Name": f"t{i}", "Location": "Device", "Dimensions": [1, 64, 56, 56],
                            "Format/Datatype": text}]} for i, text in enumerate(datatypes)]
    return json.dumps({"Layers": layers, "Bindings": ["pixel_values", "logits"]})


def test_layer_precisions_are_read_from_the_inspector():
    text = inspector_json("Channel major FP16 format where channel % 8 == 0", "Row major linear FP32",
                          "Half", "Row major linear FP16 format")
    counts = gpu.layer_precisions(text)
    assert counts == {"fp16": 3, "fp32": 1}
    assert gpu.engine_precision(counts, "fp16") == "fp16"
    assert gpu.engine_precision(gpu.layer_precisions(inspector_json("Row major linear FP32")), "fp16") == "fp32"
    assert gpu.engine_precision({"fp32": 5}, "tf32") == "tf32"  # TF32 stores FP32: the request says it
    tensorrt_11 = json.dumps({"Layers": [{"Name": "a", "Outputs": [{"Name": "t", "DataType": "Half", "Format": "kLINEAR"}]}]})
    assert gpu.layer_precisions(tensorrt_11) == {"fp16": 1}
    assert gpu.layer_precisions("not json") == {} and gpu.engine_precision({}, "fp32") == "fp32"
    assert gpu.layer_precisions(json.dumps({"Layers": [{"Name": "only names"}]})) == {"unknown": 1}


# -- tolerances and the optimisation profile ------------------------------------------------------

@pytest.mark.parametrize("engine", ["tensorrt", "torch-tensorrt"])
def test_default_tolerances_follow_the_precision(engine):
    from packager.formats import FORMATS

    fmt = FORMATS[engine]
    assert fmt.default_atol(1e-4, "fp32") == 1e-4
    assert fmt.default_atol(1e-4, "tf32") == gpu.TF32_ATOL == 1e-2
    assert fmt.default_atol(1e-4, "fp16") == gpu.FP16_ATOL
    for cpu in ("torchscript", "onnx", "cpu-local"):  # CPU formats are FP32 whatever is asked
        assert FORMATS[cpu].default_atol(1e-4, "fp16") == 1e-4
    # the relative part: the family's for FP32, 1e-2 for the 10-bit mantissas of TF32 and FP16
    assert fmt.default_rtol(1e-3, "fp32") == 1e-3
    assert fmt.default_rtol(1e-3, "tf32") == gpu.TF32_RTOL == 1e-2
    assert fmt.default_rtol(1e-3, "fp16") == gpu.FP16_RTOL == 1e-2
    assert fmt.default_rtol(5e-2, "fp16") == 5e-2  # never tighter than the family's
    for cpu in ("torchscript", "onnx", "cpu-local"):
        assert FORMATS[cpu].default_rtol(1e-3, "fp16") == 1e-3


def test_the_families_default_to_a_relative_tolerance_for_fp32():
    from packager.spec import IOSpec

    assert (IOSpec("t", (), ()).default_atol, IOSpec("t", (), ()).default_rtol) == (1e-4, 1e-3)


def test_engine_formats_record_the_tensorrt_their_build_reported():
    from packager.formats import FORMATS
    from packager.formats.base import ExportedModel

    built = ExportedModel("torch-tensorrt", {}, (), (), {"tensorrt": "10.13.3.9", "torch_tensorrt": "2.9.0"})
    versions = FORMATS["torch-tensorrt"].recorded_versions(built)
    assert versions["tensorrt"] == "10.13.3.9" and versions["torch_tensorrt"] == "2.9.0" and "torch" in versions
    assert "tensorrt" not in FORMATS["torchscript"].recorded_versions(ExportedModel("torchscript", {}, (), (), {"tensorrt": "x"}))


@pytest.mark.parametrize(("max_batch", "opt"), [(1, 1), (2, 2), (3, 2), (4, 2), (8, 4), (16, 8)])
def test_the_opt_batch_is_never_1_when_batches_can_be_larger(max_batch, opt):
    from packager.spec import IOSpec, TensorSpec

    assert gpu.opt_batch(max_batch) == opt
    spec = IOSpec("text", (TensorSpec("input_ids", "int64", ("sequence",)),), (), (("sequence", 64),))
    ((_, lo, mid, hi),) = gpu.profile_shapes(spec, max_batch)
    assert lo == (1, 1) and mid == (opt, 64) and hi == (max_batch, 64)
