from __future__ import annotations

import pytest

from mme.fsutil import deterministic_tar_gz, sha256_of, staged_directory


def test_staged_directory_swaps_in_only_on_success(tmp_path):
    final = tmp_path / "artifact"
    with staged_directory(final) as staging:
        (staging / "a").write_text("1")
    assert (final / "a").read_text() == "1"
    with pytest.raises(RuntimeError):
        with staged_directory(final) as staging:
            (staging / "a").write_text("2")
            raise RuntimeError("export failed")
    assert (final / "a").read_text() == "1", "the good artifact survives a failed rebuild"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"], "no staging directory left"
    with staged_directory(final) as staging:
        (staging / "b").write_text("3")
    assert sorted(p.name for p in final.iterdir()) == ["b"]


def test_tarball_is_deterministic(tmp_path):
    src = tmp_path / "m"
    (src / "1").mkdir(parents=True)
    (src / "config.pbtxt").write_text("max_batch_size: 1\n")
    (src / "1" / "model.onnx").write_bytes(b"\x00" * 1000)
    deterministic_tar_gz(src, "m", tmp_path / "a.tar.gz")
    (src / "config.pbtxt").touch()  # new mtime, same content
    deterministic_tar_gz(src, "m", tmp_path / "b.tar.gz")
    assert sha256_of(tmp_path / "a.tar.gz") == sha256_of(tmp_path / "b.tar.gz")
