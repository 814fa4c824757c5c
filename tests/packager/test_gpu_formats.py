"""TensorRT plan and Torch-TensorRT on a GPU (skipped on CPU hosts, see tests/conftest.py).

TensorRT tests need the gpu extra (make install-gpu: the default release's TensorRT);
Torch-TensorRT tests need the release's own stack, i.e. the builder image."""

from __future__ import annotations

import importlib.util

import pytest

from packager.triton_config import read_config
from tests.packager.conftest import load_manifest, run_cli

pytestmark = pytest.mark.gpu

needs_tensorrt = pytest.mark.skipif(importlib.util.find_spec("tensorrt") is None,
                                    reason="needs TensorRT (make install-gpu)")


def _release_stack_problems() -> list[str]:
    from mme.versions import installed_stack, release, stack_mismatches

    return stack_mismatches(release(), installed_stack())


needs_release_stack = pytest.mark.skipif(
    importlib.util.find_spec("torch_tensorrt") is None or bool(_release_stack_problems()),
    reason="needs the release's torch / Torch-TensorRT / TensorRT (the builder image: make docker-package)",
)


@needs_tensorrt
@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
def test_tensorrt_plan(tmp_path, capsys, precision):
    code, _, err = run_cli(capsys, "package", "test_resnet", "--no-pretrained", "--formats", "tensorrt",
                           "--precision", precision, "--max-batch-size", "8", "--out", str(tmp_path))
    assert code == 0, err
    root = tmp_path / "test_resnet" / "tensorrt"
    manifest = load_manifest(root)
    details = manifest.details
    assert manifest.versions["tensorrt"] and details.tensorrt == manifest.versions["tensorrt"]
    assert details.compute_capability and details.hardware_compatibility == "none"
    assert details.precision == precision
    assert details.builder_settings["tf32"] is (precision != "fp32")
    assert details.layer_precisions, "the engine inspector reported no layers"
    compute = details.compute_layer_precisions
    assert compute, f"the engine inspector gave no datatype for any compute layer: {details.layer_precisions}"
    if precision == "fp16":  # TensorRT may keep a layer in FP32 where that is faster: "mixed", mostly FP16
        assert details.engine_precision in ("fp16", "mixed") and compute.get("fp16", 0) > sum(compute.values()) / 2
    else:
        assert details.engine_precision == precision and set(compute) == {"fp32"}
    assert manifest.validation.atol == {"fp32": 1e-4, "tf32": 1e-2, "fp16": 5e-2}[precision]
    assert manifest.validation.rtol == {"fp32": 1e-3, "tf32": 1e-2, "fp16": 1e-2}[precision]
    assert manifest.validation.device == "cuda"
    assert read_config(root / "test_resnet" / "config.pbtxt").platform == "tensorrt_plan"
    assert (root / "test_resnet" / "1" / "model.plan").stat().st_size > 0


@needs_tensorrt
def test_fp32_plan_of_a_transformer_stays_within_fp32_tolerance(tmp_path, capsys):
    # With TF32 left on (TensorRT's default) this differed by ~1.7e-3 from PyTorch.
    code, _, err = run_cli(capsys, "package", "distilbert-base-uncased", "--no-pretrained", "--formats", "tensorrt",
                           "--precision", "fp32", "--seq-len", "64", "--max-batch-size", "4", "--out", str(tmp_path))
    assert code == 0, err
    manifest = load_manifest(tmp_path / "distilbert-base-uncased" / "tensorrt")
    assert manifest.validation.atol == 1e-4 and manifest.details.builder_settings["tf32"] is False


@needs_tensorrt
def test_hardware_compatible_plan_records_it(tmp_path, capsys):
    code, _, err = run_cli(capsys, "package", "test_resnet", "--no-pretrained", "--formats", "tensorrt",
                           "--hardware-compatible", "--max-batch-size", "4", "--out", str(tmp_path))
    assert code == 0, err
    assert load_manifest(tmp_path / "test_resnet" / "tensorrt").details.hardware_compatibility == "ampere_plus"


@needs_release_stack
@pytest.mark.parametrize("max_batch", ["2", "3", "8"])  # 2 and 3 failed: opt batch 1 was specialised
def test_torch_tensorrt(tmp_path, capsys, max_batch):
    code, _, err = run_cli(capsys, "package", "test_resnet", "--no-pretrained", "--formats", "torch-tensorrt",
                           "--max-batch-size", max_batch, "--out", str(tmp_path))
    assert code == 0, err
    manifest = load_manifest(tmp_path / "test_resnet" / "torch-tensorrt")
    assert manifest.inputs[0].name == "INPUT__0"
    assert manifest.versions["torch_tensorrt"] and manifest.details.torch_tensorrt_abi
    assert manifest.details.builder_settings["disable_tf32"] == "True"


@needs_release_stack
def test_torch_tensorrt_fp16_is_built_in_fp16(tmp_path, capsys):
    code, _, err = run_cli(capsys, "package", "test_resnet", "--no-pretrained", "--formats", "torch-tensorrt",
                           "--precision", "fp16", "--max-batch-size", "4", "--out", str(tmp_path))
    assert code == 0, err
    settings = load_manifest(tmp_path / "test_resnet" / "torch-tensorrt").details.builder_settings
    assert settings.get("enable_autocast") == "True" or "torch.float16" in settings.get("enabled_precisions", [])


@needs_tensorrt
def test_text_model_plan_has_a_sequence_profile(tmp_path, capsys):
    code, _, err = run_cli(capsys, "package", "distilbert-base-uncased", "--no-pretrained", "--formats", "tensorrt",
                           "--seq-len", "64", "--max-batch-size", "4", "--out", str(tmp_path))
    assert code == 0, err
    cases = load_manifest(tmp_path / "distilbert-base-uncased" / "tensorrt").validation.cases
    assert {c["axes"]["sequence"] for c in cases} == {64, 17}


def test_nvml_reads_this_gpu_and_its_compute_capability():
    import torch

    from serving.monitor.memory import GpuMemoryMeter, gpu_compute_capability

    if importlib.util.find_spec("pynvml") is None:
        pytest.skip("nvidia-ml-py is not installed (make install-gpu)")
    major, minor = torch.cuda.get_device_capability()
    assert gpu_compute_capability(0) == f"{major}.{minor}"
    meter = GpuMemoryMeter(0)
    before = meter.used()
    block = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    assert meter.used() - before >= 500 << 20
    del block
