"""End to end: a tiny timm model exported, validated and laid out in the CPU formats."""

from __future__ import annotations

import json
import tarfile

import numpy as np
import onnxruntime as ort
import pytest
import torch

from mme.fsutil import sha256_of
from mme.versions import default_release_name
from packager.manifest import MANIFEST_NAME
from packager.triton_config import read_config
from tests.packager.conftest import load_manifest, run_cli

FORMATS = {
    "torchscript": ("pytorch_libtorch", "", "model.pt", "KIND_GPU"),
    "onnx": ("onnxruntime_onnx", "", "model.onnx", "KIND_GPU"),
    "cpu-local": ("", "python", "model.onnx", "KIND_CPU"),
}


def _validation_device(fmt: str, kind: str) -> str:
    """Where this host validates a format served with ``kind``: the GPU for GPU-marked
    TorchScript (torch sees CUDA) and ONNX (ONNX Runtime has the CUDA provider), else the CPU."""
    if kind != "KIND_GPU":
        return "cpu"
    if fmt == "torchscript":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if fmt == "onnx" and "CUDAExecutionProvider" in ort.get_available_providers() else "cpu"


@pytest.mark.parametrize("fmt", FORMATS)
def test_layout_config_and_manifest(tiny_timm_artifacts, fmt):
    platform, backend, model_file, kind = FORMATS[fmt]
    root = tiny_timm_artifacts / fmt
    config = read_config(root / "test_resnet" / "config.pbtxt")
    assert config.platform == platform and config.backend == backend
    assert config.max_batch_size == 8
    assert config.instance_group[0].kind == getattr(type(config.instance_group[0]), kind)
    assert config.HasField("dynamic_batching")
    assert not config.name, "name must come from the directory (MME loads copies under other names)"
    assert (root / "test_resnet" / "1" / model_file).is_file()

    manifest = load_manifest(root)
    assert manifest.schema_version == 1
    assert manifest.format == fmt and manifest.model == "test_resnet"
    assert manifest.source.weights == "random" and manifest.source.family == "timm" and manifest.source.seed == 0
    assert (manifest.triton.platform or "") == platform and (manifest.triton.backend or "") == backend
    assert manifest.triton.max_batch_size == 8 and manifest.triton.dynamic_batching is True
    assert manifest.triton.release == default_release_name() == manifest.triton.target.release
    assert manifest.validation.passed is True
    assert manifest.validation.max_abs_diff <= manifest.validation.atol
    assert manifest.validation.rtol == 1e-3  # fp32's default beside atol 1e-4
    assert manifest.validation.device == _validation_device(fmt, kind)
    assert list(manifest.to_dict()["validation"])[:5] == ["passed", "atol", "rtol", "max_abs_diff", "device"]
    assert len(manifest.validation.cases) == 2  # batch 2 and batch 1
    assert set(manifest.timings_s) >= {"load", "export", "validate", "layout", "tarball"}
    assert manifest.parameters > 0
    assert manifest.details.axes_max == {}
    listed = {f.path: f for f in manifest.files}
    assert "manifest.json" not in listed
    for rel, entry in listed.items():
        assert sha256_of(root / rel) == entry.sha256
        assert (root / rel).stat().st_size == entry.bytes
    if fmt == "torchscript":
        assert [i.name for i in manifest.inputs] == ["INPUT__0"]
        assert manifest.inputs[0].source_name == "pixel_values"
        assert [o.name for o in manifest.outputs] == ["OUTPUT__0"]
    else:
        assert [i.name for i in manifest.inputs] == ["pixel_values"]
    # the typed records write the file back unchanged: same keys, nesting and order
    text = (root / MANIFEST_NAME).read_text()
    assert json.dumps(manifest.to_dict(), indent=2) + "\n" == text
    assert list(manifest.to_dict()) == [
        "schema_version", "model", "requested_name", "format", "source", "triton", "tarball", "files", "parameters",
        "inputs", "outputs", "sample_request", "versions", "validation", "timings_s", "created_at", "details"]
    assert list(manifest.to_dict()["triton"]) == ["platform", "backend", "max_batch_size", "instance_kind",
                                                  "dynamic_batching", "target"]
    assert list(manifest.to_dict()["inputs"][0]) == ["name", "datatype", "dims", "axes", "source_name"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_tarball_holds_one_model_directory(tiny_timm_artifacts, fmt):
    _, _, model_file, _ = FORMATS[fmt]
    with tarfile.open(tiny_timm_artifacts / fmt / "test_resnet.tar.gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
    expected = {"test_resnet", "test_resnet/1", "test_resnet/config.pbtxt", f"test_resnet/1/{model_file}"}
    if fmt == "cpu-local":
        expected.add("test_resnet/1/model.py")
    assert set(members) == expected
    assert all(m.isfile() or m.isdir() for m in members.values())
    assert all(m.uid == 0 and m.mtime == 0 for m in members.values())


def test_sample_requests_match_the_model_inputs(tiny_timm_artifacts):
    root = tiny_timm_artifacts / "onnx"
    manifest = load_manifest(root)
    body = json.loads((root / "sample_request.json").read_text())
    (entry,) = body["inputs"]
    dims = manifest.inputs[0].dims
    assert entry["name"] == "pixel_values" and entry["datatype"] == "FP32"
    assert entry["shape"] == [1, *dims] and len(entry["data"]) == int(np.prod(entry["shape"]))
    binary = (root / "sample_request.bin").read_bytes()
    header_size = manifest.sample_request.binary_header_size
    header = json.loads(binary[:header_size])
    assert header["inputs"][0]["parameters"]["binary_data_size"] == len(binary) - header_size
    assert manifest.sample_request.binary_content_type.endswith(f"json-header-size={header_size}")


def test_onnx_has_dynamic_batch_and_runs_at_other_batches(tiny_timm_artifacts):
    path = tiny_timm_artifacts / "onnx" / "test_resnet" / "1" / "model.onnx"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (inp,) = session.get_inputs()
    assert isinstance(inp.shape[0], str), "batch axis must be dynamic"
    shape = [5, *inp.shape[1:]]
    (out,) = session.run(None, {inp.name: np.random.default_rng(0).standard_normal(shape, dtype=np.float32)})
    assert out.shape[0] == 5


def test_torchscript_matches_onnx(tiny_timm_artifacts):
    onnx_path = tiny_timm_artifacts / "onnx" / "test_resnet" / "1" / "model.onnx"
    ts = torch.jit.load(str(tiny_timm_artifacts / "torchscript" / "test_resnet" / "1" / "model.pt"))
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    shape = [3, *session.get_inputs()[0].shape[1:]]
    x = np.random.default_rng(1).standard_normal(shape, dtype=np.float32)
    (want,) = session.run(None, {name: x})
    with torch.no_grad():
        got = ts(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_rerun_is_idempotent_and_leaves_no_staging(tiny_timm_artifacts, capsys):
    before = sha256_of(tiny_timm_artifacts / "onnx" / "test_resnet.tar.gz")
    code, _, _ = run_cli(capsys, "-q", "package", "test_resnet", "--no-pretrained", "--formats", "onnx",
                         "--out", str(tiny_timm_artifacts.parent), "--max-batch-size", "8")
    assert code == 0
    assert sha256_of(tiny_timm_artifacts / "onnx" / "test_resnet.tar.gz") == before
    assert sorted(p.name for p in tiny_timm_artifacts.iterdir()) == ["cpu-local", "onnx", "torchscript"]


def test_image_size_override(tmp_path, capsys):
    code, _, _ = run_cli(capsys, "-q", "package", "test_resnet", "--no-pretrained", "--formats", "onnx",
                         "--image-size", "96", "--out", str(tmp_path))
    assert code == 0
    manifest = load_manifest(tmp_path / "test_resnet" / "onnx")
    assert manifest.inputs[0].dims == (3, 96, 96)


def test_progress_says_where_and_how_close(tmp_path, capsys):
    code, _, err = run_cli(capsys, "package", "test_vit", "--no-pretrained", "--formats", "onnx", "--out", str(tmp_path))
    assert code == 0
    assert "[onnx] logits" in err and "max |diff|" in err
    assert str(tmp_path / "test_vit" / "onnx") in err
