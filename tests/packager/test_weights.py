"""Weights: the loud random fallback, local checkpoints."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import timm
import torch

from tests.packager.conftest import load_manifest, run_cli


def test_default_falls_back_to_random_loudly(tmp_path, capsys):
    code, _, err = run_cli(capsys, "package", "test_resnet", "--formats", "onnx", "--out", str(tmp_path))
    assert code == 0
    assert "WARNING: pretrained weights for test_resnet are not reachable" in err
    assert "RANDOM" in err
    assert load_manifest(tmp_path / "test_resnet" / "onnx").source.weights == "random"


def test_no_pretrained_is_quiet(tmp_path, capsys):
    code, _, err = run_cli(capsys, "package", "test_resnet", "--no-pretrained", "--formats", "onnx", "--out", str(tmp_path))
    assert code == 0 and "WARNING" not in err


def test_local_timm_checkpoint(tmp_path, capsys):
    torch.manual_seed(42)
    model = timm.create_model("test_resnet").eval()
    torch.save(model.state_dict(), tmp_path / "ckpt.pth")
    code, _, err = run_cli(capsys, "package", "test_resnet", "--weights", str(tmp_path / "ckpt.pth"),
                           "--formats", "onnx", "--out", str(tmp_path / "out"))
    assert code == 0, err
    root = tmp_path / "out" / "test_resnet" / "onnx"
    manifest = load_manifest(root)
    assert manifest.source.weights == "local"
    assert manifest.source.weights_path.endswith("ckpt.pth")
    session = ort.InferenceSession(str(root / "test_resnet" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((1, *manifest.inputs[0].dims), dtype=np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(session.run(None, {"pixel_values": x})[0], want, atol=1e-4)


def test_checkpoint_of_another_architecture_is_refused(tmp_path, capsys):
    torch.save(timm.create_model("test_vit").state_dict(), tmp_path / "vit.pth")
    code, _, err = run_cli(capsys, "package", "test_resnet", "--weights", str(tmp_path / "vit.pth"),
                           "--out", str(tmp_path / "out"))
    assert code == 2
    last = err.splitlines()[-1]
    assert last.startswith("mme: error: could not load --weights") and "this architecture" in last
    assert not (tmp_path / "out" / "test_resnet").exists()
