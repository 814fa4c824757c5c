"""Fixtures for the model store, extraction, cache and SageMaker error-shape tests."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from mme.fsutil import deterministic_tar_gz
from tests.serving.models.store_helpers import CONFIG, Member, write_tarball


@pytest.fixture
def make_tarball(tmp_path: Path) -> Callable[..., Path]:
    """make_tarball(members, name=..., compress=True) -> path of a hand-built tarball."""
    counter = iter(range(1_000_000))

    def make(members: list[Member], name: str | None = None, compress: bool = True) -> Path:
        out = tmp_path / "tarballs"
        out.mkdir(exist_ok=True)
        return write_tarball(out / (name or f"t{next(counter)}.tar.gz"), members, compress)

    return make


@pytest.fixture
def tiny_model_dir(tmp_path: Path) -> Path:
    """A valid one-model Triton directory (python backend), not tarred."""
    root = tmp_path / "tiny-src" / "tiny"
    (root / "1").mkdir(parents=True)
    (root / "config.pbtxt").write_text(CONFIG)
    (root / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    return root


@pytest.fixture
def tiny_tarball(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """The MME tarball of tiny_model_dir, made like 'mme package' makes it."""
    dest = tmp_path / "tiny.tar.gz"
    deterministic_tar_gz(tiny_model_dir, "tiny", dest)
    return dest
