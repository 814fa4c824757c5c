from __future__ import annotations

from pathlib import Path

import pytest

from mme.cli import main
from packager.manifest import Manifest


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="session")
def tiny_timm_artifacts(tmp_path_factory) -> Path:
    """timm's tiny test_resnet packaged once in the three CPU formats."""
    out = tmp_path_factory.mktemp("artifacts")
    code = main(["-q", "package", "test_resnet", "--no-pretrained", "--out", str(out), "--max-batch-size", "8"])
    assert code == 0
    return out / "test_resnet"


def load_manifest(directory: Path) -> Manifest:
    return Manifest.load(directory)
