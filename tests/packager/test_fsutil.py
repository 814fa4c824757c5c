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


def test_isal_and_zlib_tarballs_hold_the_same_members_and_read_as_plain_tar_gz(tmp_path):
    """ISA-L's gzip is the default compressor: any gzip reader (Python's tarfile, gzip, SageMaker)
    reads it, its bytes are stable across runs, and the members are those zlib would write."""
    import gzip
    import io
    import os
    import tarfile

    src = tmp_path / "m"
    (src / "1").mkdir(parents=True)
    (src / "config.pbtxt").write_text("max_batch_size: 1\n")
    weights = os.urandom(300_000) + b"\x00" * 700_000  # random floats barely compress; padding does
    (src / "1" / "model.onnx").write_bytes(weights)
    deterministic_tar_gz(src, "m", tmp_path / "isal.tar.gz")
    deterministic_tar_gz(src, "m", tmp_path / "isal-again.tar.gz")
    deterministic_tar_gz(src, "m", tmp_path / "zlib.tar.gz", compressor="zlib")
    assert sha256_of(tmp_path / "isal.tar.gz") == sha256_of(tmp_path / "isal-again.tar.gz")
    raw = {name: gzip.decompress((tmp_path / f"{name}.tar.gz").read_bytes()) for name in ("isal", "zlib")}
    assert raw["isal"] == raw["zlib"]  # the same tar stream inside
    assert (tmp_path / "isal.tar.gz").stat().st_size < 0.75 * len(raw["isal"])  # it does compress
    with tarfile.open(fileobj=io.BytesIO((tmp_path / "isal.tar.gz").read_bytes()), mode="r:gz") as tar:
        assert tar.getnames() == ["m", "m/1", "m/1/model.onnx", "m/config.pbtxt"]
        member = tar.extractfile("m/1/model.onnx")
        assert member is not None and member.read() == weights
    with pytest.raises(ValueError, match="unknown compressor"):
        deterministic_tar_gz(src, "m", tmp_path / "x.tar.gz", compressor="lz4")


def test_without_isal_tarballs_go_through_zlib_in_the_same_format(tmp_path, monkeypatch):
    """ISA-L is an accelerator: a host without python-isal (a bare GPU host) writes the same
    tar.gz through the standard library, byte-identical to an explicit zlib tarball."""
    import gzip
    import sys

    from mme.fsutil import gzip_backend

    src = tmp_path / "m"
    (src / "1").mkdir(parents=True)
    (src / "1" / "model.onnx").write_bytes(bytes(range(256)) * 64)
    assert gzip_backend() == "isal"
    monkeypatch.setitem(sys.modules, "isal", None)  # import isal -> ImportError, as where it is not installed
    monkeypatch.delitem(sys.modules, "isal.igzip", raising=False)
    assert gzip_backend() == "zlib" and gzip_backend("zlib") == "zlib"
    deterministic_tar_gz(src, "m", tmp_path / "default.tar.gz")
    deterministic_tar_gz(src, "m", tmp_path / "zlib.tar.gz", compressor="zlib")
    assert sha256_of(tmp_path / "default.tar.gz") == sha256_of(tmp_path / "zlib.tar.gz")
    assert gzip.decompress((tmp_path / "default.tar.gz").read_bytes())[:1] == b"m"


def test_weights_that_barely_deflate_are_stored_and_every_gzip_reader_reads_the_members(tmp_path):
    """Parts of files that deflate by less than STORE_BELOW_RATIO (model weights) are stored
    blocks, so unpacking them is a copy; text still deflates. The tarball is a series of gzip
    members, which the standard library's gzip and tarfile read as one stream."""
    import gzip
    import io
    import random
    import tarfile

    from mme.archive import safe_extract

    src = tmp_path / "m"
    (src / "1").mkdir(parents=True)
    weights = random.Random(7).randbytes(9 << 20)  # three 4 MiB copy chunks of incompressible floats
    text = b"max_batch_size: 8\n" * 300_000  # 5.4 MB that deflates hundreds of times
    (src / "1" / "model.onnx").write_bytes(weights)
    (src / "1" / "vocab.txt").write_bytes(text)
    (src / "config.pbtxt").write_text("max_batch_size: 8\n")
    deterministic_tar_gz(src, "m", tmp_path / "stored.tar.gz")
    deterministic_tar_gz(src, "m", tmp_path / "deflated.tar.gz", compressor="zlib")
    stored = (tmp_path / "stored.tar.gz").stat().st_size
    assert len(weights) < stored < len(weights) * 1.002 + len(text) / 50  # weights stored as they are, text deflated
    data = (tmp_path / "stored.tar.gz").read_bytes()
    assert data.count(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff") >= 4  # several gzip members
    assert gzip.decompress(data) == gzip.decompress((tmp_path / "deflated.tar.gz").read_bytes())
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        assert tar.extractfile("m/1/model.onnx").read() == weights  # type: ignore[union-attr]
    done = safe_extract(tmp_path / "stored.tar.gz", tmp_path / "out")
    assert (tmp_path / "out" / "m" / "1" / "vocab.txt").read_bytes() == text and done.tarball_bytes == stored
    assert done.sha256 == sha256_of(tmp_path / "stored.tar.gz")
