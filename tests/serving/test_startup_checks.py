"""`mme serve` and `mme capacity` check what they were given before anything starts (issue 15):
a source with nothing to serve, the parent of artifact directories, and a format the chosen
Triton cannot run each get one line and exit code 2, with what to pass instead. Nothing is
started, so no Triton process is left behind."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mme.cli import main


@pytest.fixture(scope="module")
def onnx_artifact(tmp_path_factory) -> Path:
    """timm's tiny test_resnet in the onnx format (Triton's onnxruntime backend)."""
    out = tmp_path_factory.mktemp("onnx-artifacts")
    assert main(["-q", "package", "test_resnet", "--no-pretrained", "--formats", "onnx", "--out", str(out)]) == 0
    return out / "test_resnet" / "onnx"


def _error(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_serve_refuses_a_directory_with_nothing_to_serve(tmp_path, capsys):
    err = _error(capsys, ["serve", "--models", str(tmp_path), "--server", "local"])
    assert f"{tmp_path} holds no <name>.tar.gz to serve" in err and "mme package" in err


def test_serve_and_capacity_name_the_artifact_directory_below_the_one_given(packaged_test_resnet, tmp_path, capsys):
    artifact = tmp_path / "artifacts" / "test_resnet" / "cpu-local"
    shutil.copytree(packaged_test_resnet.directory, artifact)
    for parent in (tmp_path / "artifacts", tmp_path / "artifacts" / "test_resnet"):
        err = _error(capsys, ["serve", "--models", str(parent), "--server", "local"])
        assert "above the artifact directories" in err and f"--models {artifact}" in err
        err = _error(capsys, ["capacity", str(parent), "--server", "local"])
        assert "above the artifact directories" in err and str(artifact) in err


def test_a_format_the_local_server_cannot_run_is_refused_naming_the_kinds_that_can(onnx_artifact, capsys):
    for argv in (["serve", "--models", str(onnx_artifact)], ["capacity", str(onnx_artifact)]):
        err = _error(capsys, [*argv, "--server", "local"])
        assert "onnx format (Triton backend onnxruntime)" in err and "python backend only" in err
        assert "--server system or --server docker" in err and "--formats cpu-local" in err
