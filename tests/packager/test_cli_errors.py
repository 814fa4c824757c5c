"""Bad input: one line that says what was wrong and how to fix it, exit 2, nothing written."""

from __future__ import annotations

import pytest

from tests.packager.conftest import run_cli


def assert_one_line_error(code: int, err: str, *needles: str, exit_code: int = 2, fail_fast: bool = True) -> None:
    """``fail_fast``: the error comes before any work, so it is all that is printed;
    otherwise progress lines may precede it and the error is the last line."""
    assert code == exit_code
    lines = [line for line in err.splitlines() if line.strip()]
    if fail_fast:
        assert len(lines) == 1, err
    assert lines[-1].startswith("mme: error: ")
    assert sum(line.startswith("mme: error") for line in lines) == 1
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[-1], lines[-1]


def test_unknown_model_suggests_close_matches(tmp_path, capsys):
    code, _, err = run_cli(capsys, "package", "resnet5O", "--out", str(tmp_path))
    assert_one_line_error(code, err, "unknown model 'resnet5O'", "resnet50", "mme package --list")
    assert not any(tmp_path.iterdir())


def test_unknown_family_model(tmp_path, capsys):
    code, _, err = run_cli(capsys, "package", "bert-base-uncased", "--family", "timm", "--out", str(tmp_path))
    assert_one_line_error(code, err, "unknown model")


@pytest.mark.parametrize("formats", ["onnx,tflite", "", "ONNX"])
def test_bad_format(tmp_path, capsys, formats):
    code, _, err = run_cli(capsys, "package", "test_resnet", "--formats", formats, "--out", str(tmp_path))
    assert_one_line_error(code, err, "format")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("given, meant", [("ONNX", "onnx"), ("cpu_local", "cpu-local"), ("TensorRT", "tensorrt")])
def test_a_misspelt_format_gets_the_one_meant(tmp_path, capsys, given, meant):
    code, _, err = run_cli(capsys, "package", "test_resnet", "--formats", given, "--out", str(tmp_path))
    assert_one_line_error(code, err, f"unknown format {given!r}; did you mean {meant!r}?")


@pytest.mark.parametrize("value", ["0", "-4", "eight"])
def test_bad_batch_size(tmp_path, capsys, value):
    code, _, err = run_cli(capsys, "package", "test_resnet", "--max-batch-size", value, "--out", str(tmp_path))
    assert_one_line_error(code, err, "--max-batch-size", "positive integer")


def test_preferred_batch_sizes_above_max(tmp_path, capsys):
    code, _, err = run_cli(capsys, "package", "test_resnet", "--max-batch-size", "4",
                           "--preferred-batch-sizes", "2,8", "--out", str(tmp_path))
    assert_one_line_error(code, err, "--preferred-batch-sizes", "--max-batch-size 4")


def test_old_opset_refused(tmp_path, capsys):
    code, _, err = run_cli(capsys, "package", "test_resnet", "--opset", "13", "--out", str(tmp_path))
    assert_one_line_error(code, err, "--opset 13", "17")


def test_unwritable_output(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    code, _, err = run_cli(capsys, "package", "test_resnet", "--no-pretrained", "--out", str(blocker / "out"))
    assert_one_line_error(code, err, "cannot write to --out", "choose a writable directory")
    assert blocker.read_text() == "not a directory"


def test_missing_model_argument(capsys):
    code, _, err = run_cli(capsys, "package")
    assert_one_line_error(code, err, "give a MODEL")


def test_missing_local_weights(tmp_path, capsys):
    code, _, err = run_cli(capsys, "package", "test_resnet", "--weights", str(tmp_path / "nope.pth"),
                           "--out", str(tmp_path / "out"))
    assert_one_line_error(code, err, "--weights", "no such file")
    assert not (tmp_path / "out" / "test_resnet").exists()


def test_pretrained_required_but_unreachable(tmp_path, capsys):
    code, _, err = run_cli(capsys, "package", "test_resnet", "--pretrained", "--out", str(tmp_path))
    assert_one_line_error(code, err, "pretrained weights for test_resnet", "--no-pretrained", fail_fast=False)
    assert not (tmp_path / "test_resnet").exists()


def test_tensorrt_needs_a_gpu(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    for fmt in ("tensorrt", "torch-tensorrt"):
        code, _, err = run_cli(capsys, "package", "test_resnet", "--formats", f"onnx,{fmt}", "--out", str(tmp_path))
        assert_one_line_error(code, err, f"format '{fmt}' needs an NVIDIA GPU", "GPU host", "builder image")
    assert not any(tmp_path.iterdir()), "the GPU check runs before anything is exported"


def test_mismatch_is_caught_and_nothing_is_left(tmp_path, capsys):
    # An impossible tolerance makes validation fail on a real export: exit 3, typed message,
    # and no artifact directory that could pass for a good one.
    code, _, err = run_cli(capsys, "-q", "package", "test_resnet", "--no-pretrained", "--formats", "onnx",
                           "--atol", "1e-30", "--rtol", "0", "--out", str(tmp_path))
    assert code == 3
    assert "mme: error: [onnx] output logits differs from PyTorch beyond atol 1e-30 + rtol 0" in err
    assert "widen the tolerance: --rtol " in err and "Traceback" not in err  # how to widen it, in the one line
    assert not (tmp_path / "test_resnet").exists()


def test_a_negative_rtol_is_refused(tmp_path, capsys):
    from mme.errors import UsageError
    from packager.model import ModelRequest
    from packager.pipeline import check_package_request
    from packager.request import PackageRequest

    code, _, err = run_cli(capsys, "package", "test_resnet", "--formats", "onnx", "--rtol=-1e-3",
                           "--out", str(tmp_path))
    assert code == 2 and "--rtol" in err and "0 or more" in err and "Traceback" not in err
    with pytest.raises(UsageError, match="--rtol must be 0 or a positive number"):
        check_package_request(PackageRequest(ModelRequest("test_resnet"), ("onnx",), tmp_path, rtol=-1.0))
    assert not any(tmp_path.iterdir())


def test_help_and_list(capsys):
    code, out, _ = run_cli(capsys, "package", "--list", "convnext_b*")
    assert code == 0
    assert "convnext_base" in out and "cpu-local" in out
    code, out, _ = run_cli(capsys, "package", "--list")
    assert code == 0 and "bert-base-uncased" in out and "resnet50" in out


def test_hardware_compatible_needs_a_tensorrt_format(tmp_path, capsys):
    code, _, err = run_cli(capsys, "package", "test_resnet", "--formats", "onnx", "--hardware-compatible",
                           "--out", str(tmp_path))
    assert_one_line_error(code, err, "--hardware-compatible", "tensorrt")
    assert not any(tmp_path.iterdir())


def test_tf32_is_a_precision_and_int8_is_not(tmp_path, capsys):
    code, _, err = run_cli(capsys, "package", "test_resnet", "--precision", "int8", "--out", str(tmp_path))
    assert_one_line_error(code, err, "--precision", "tf32")


def test_a_tensorrt_that_is_not_the_releases_is_refused_before_any_work(monkeypatch):
    from mme.errors import GpuRequiredError
    from mme.versions import release
    from packager.formats import tensorrt_plan

    monkeypatch.setattr(tensorrt_plan, "installed_tensorrt", lambda: "11.1.0.106")
    with pytest.raises(GpuRequiredError) as info:
        tensorrt_plan.check_release_tensorrt(release("25.09"))
    message = str(info.value)
    assert "TensorRT 11.1.0.106 is installed but Triton 25.09 runs TensorRT 10.13.3.9" in message
    assert "make install-gpu" in message and "--triton-release" in message
    tensorrt_plan.check_release_tensorrt(release("26.07"))  # the release that runs it


def test_torch_tensorrt_is_built_with_the_releases_own_stack_only():
    from mme.errors import GpuRequiredError
    from mme.versions import release
    from packager.formats.torch_tensorrt import check_release_stack

    # This environment has PyPI's torch and no Torch-TensorRT: not NGC 25.09's stack.
    with pytest.raises(GpuRequiredError) as info:
        check_release_stack(release("25.09"))
    message = str(info.value)
    assert "release 25.09's own stack" in message and "torch-tensorrt is not installed" in message
    assert "make docker-package DOCKER_FORMATS=torch-tensorrt TRITON_RELEASE=25.09" in message
    assert "\n" not in message
