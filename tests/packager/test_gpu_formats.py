"""TensorRT plan and Torch-TensorRT: GPU only (skipped on CPU hosts, see tests/conftest.py)."""

from __future__ import annotations

import pytest

from packager.triton_config import read_config
from tests.packager.conftest import load_manifest, run_cli

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_tensorrt_plan(tmp_path, capsys, precision):
    code, _, err = run_cli(capsys, "package", "test_resnet", "--no-pretrained", "--formats", "tensorrt",
                           "--precision", precision, "--max-batch-size", "8", "--out", str(tmp_path))
    assert code == 0, err
    root = tmp_path / "test_resnet" / "tensorrt"
    manifest = load_manifest(root)
    assert manifest["versions"]["tensorrt"]
    assert manifest["details"]["compute_capability"]
    assert manifest["details"]["precision"] == precision
    assert read_config(root / "test_resnet" / "config.pbtxt").platform == "tensorrt_plan"
    assert (root / "test_resnet" / "1" / "model.plan").stat().st_size > 0


def test_torch_tensorrt(tmp_path, capsys):
    code, _, err = run_cli(capsys, "package", "test_resnet", "--no-pretrained", "--formats", "torch-tensorrt",
                           "--max-batch-size", "8", "--out", str(tmp_path))
    assert code == 0, err
    manifest = load_manifest(tmp_path / "test_resnet" / "torch-tensorrt")
    assert manifest["inputs"][0]["name"] == "INPUT__0"
    assert manifest["versions"]["torch_tensorrt"]


def test_text_model_plan_has_a_sequence_profile(tmp_path, capsys):
    code, _, err = run_cli(capsys, "package", "distilbert-base-uncased", "--no-pretrained", "--formats", "tensorrt",
                           "--seq-len", "64", "--max-batch-size", "4", "--out", str(tmp_path))
    assert code == 0, err
    cases = load_manifest(tmp_path / "distilbert-base-uncased" / "tensorrt")["validation"]["cases"]
    assert {c["axes"]["sequence"] for c in cases} == {64, 17}
