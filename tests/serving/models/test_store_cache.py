"""serving.models.cache: download once, verify, unpack, hit, evict, single flight, nothing left on failure."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from mme.fsutil import sha256_of
from serving.models.cache import ModelCache
from serving.models.cache_entries import CachedModel, cache_key
from mme.archive import CorruptArtifact, UnsafeArtifact
from serving.models.store import ArtifactChanged, InvalidTargetName, LocalDirSource, ModelSource, ObjectReader, TargetNotFound, source_from_uri
from tests.serving.models.store_helpers import Member, WatchedSource, model_members, run_together, tree, write_tarball


class CountingSource(WatchedSource):
    """Wraps a source; counts downloads and can make each one slow."""

    def __init__(self, inner: ModelSource, delay_s: float = 0.0) -> None:
        super().__init__(inner, delay_s)
        self.downloads: list[str] = []

    def on_download(self, target: str) -> None:
        self.downloads.append(target)


@pytest.fixture
def models_dir(tmp_path: Path, tiny_tarball: Path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    for i in (1, 2):
        (root / f"tiny-v{i}.tar.gz").write_bytes(tiny_tarball.read_bytes())
    return root


def _cache(tmp_path: Path, models_dir: Path, delay_s: float = 0.0) -> tuple[ModelCache, CountingSource]:
    source = CountingSource(LocalDirSource(models_dir), delay_s)
    return ModelCache(tmp_path / "cache", source), source


def _bump_mtime(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_fetch_then_hit_without_download(tmp_path: Path, models_dir: Path, tiny_tarball: Path) -> None:
    cache, source = _cache(tmp_path, models_dir)
    first = cache.fetch("tiny-v1.tar.gz")
    assert isinstance(first, CachedModel)
    assert first.model_dir == tmp_path / "cache" / cache_key("tiny-v1.tar.gz") / "model"
    assert (first.model_dir / "tiny" / "config.pbtxt").is_file()
    assert first.sha256 == sha256_of(tiny_tarball) and first.tarball_bytes == tiny_tarball.stat().st_size
    assert first.layout == "model-dir" and first.download_seconds >= 0 and first.extract_seconds > 0

    again = cache.fetch("tiny-v1.tar.gz")
    assert again == first and again.cache_hit and not first.cache_hit
    assert source.downloads == ["tiny-v1.tar.gz"]
    assert cache.stats.hits == 1 and cache.stats.downloads == 1
    assert cache.get("tiny-v1.tar.gz") == first and cache.get("tiny-v2.tar.gz") is None
    # the download itself is gone; only the model and entry.json stay
    assert sorted(p.name for p in first.model_dir.parent.iterdir()) == ["entry.json", "model"]


def test_changed_source_object_is_downloaded_again(tmp_path: Path, models_dir: Path, make_tarball) -> None:
    cache, source = _cache(tmp_path, models_dir)
    first = cache.fetch("tiny-v1.tar.gz")
    replacement = make_tarball(model_members("other"))
    (models_dir / "tiny-v1.tar.gz").write_bytes(replacement.read_bytes())
    _bump_mtime(models_dir / "tiny-v1.tar.gz")
    second = cache.fetch("tiny-v1.tar.gz")
    assert len(source.downloads) == 2
    assert second.sha256 != first.sha256 and second.model_dir == first.model_dir
    assert tree(second.model_dir) == ["other", "other/1", "other/1/model.py", "other/config.pbtxt"]


def test_evict_removes_the_copy(tmp_path: Path, models_dir: Path) -> None:
    cache, source = _cache(tmp_path, models_dir)
    cached = cache.fetch("tiny-v1.tar.gz")
    cache.fetch("tiny-v2.tar.gz")
    assert cache.evict("tiny-v1.tar.gz") is True
    assert not cached.model_dir.parent.exists() and cache.get("tiny-v1.tar.gz") is None
    assert cache.evict("tiny-v1.tar.gz") is False
    assert [e.target for e in cache.entries()] == ["tiny-v2.tar.gz"]
    cache.fetch("tiny-v1.tar.gz")
    assert source.downloads == ["tiny-v1.tar.gz", "tiny-v2.tar.gz", "tiny-v1.tar.gz"]


def test_single_flight_one_download_for_eight_threads(tmp_path: Path, models_dir: Path) -> None:
    cache, source = _cache(tmp_path, models_dir, delay_s=0.3)
    results, errors = run_together(lambda _: cache.fetch("tiny-v1.tar.gz"))
    assert errors == []
    assert source.downloads == ["tiny-v1.tar.gz"]
    assert len(results) == 8 and all(r is results[0] for r in results)  # literally the same record


def test_single_flight_failure_reaches_every_waiter_and_leaves_nothing(tmp_path: Path, models_dir: Path) -> None:
    (models_dir / "bad.tar.gz").write_bytes(b"\x1f\x8b\x08\x00 not really gzip" * 100)
    cache, source = _cache(tmp_path, models_dir, delay_s=0.3)
    _, errors = run_together(lambda _: cache.fetch("bad.tar.gz"))
    assert len(errors) == 8 and all(isinstance(e, CorruptArtifact) for e in errors)
    assert source.downloads == ["bad.tar.gz"]
    assert tree(tmp_path / "cache") == []
    assert cache.stats.failures == 1 and cache.entries() == ()


@pytest.mark.parametrize("members, error", [
    (model_members() + [Member("../escape.txt", b"x")], UnsafeArtifact),
    ([Member("tiny/1/model.py", b"x")], Exception),
])
def test_failed_fetch_leaves_no_partial_files(tmp_path: Path, models_dir: Path, members, error) -> None:
    write_tarball(models_dir / "evil.tar.gz", members)
    cache, _ = _cache(tmp_path, models_dir)
    with pytest.raises(error):
        cache.fetch("evil.tar.gz")
    assert tree(tmp_path / "cache") == []
    assert not (tmp_path / "escape.txt").exists()


def test_artifact_errors_name_the_object_not_the_download_file(tmp_path: Path, models_dir: Path) -> None:
    """The message says which object is wrong (its path or s3:// URI), not the temporary
    ``.download-*.tar.gz`` it was fetched into."""
    write_tarball(models_dir / "noconfig.tar.gz", [Member("tiny/1/model.py", b"x")])
    write_tarball(models_dir / "unsafe.tar.gz", model_members() + [Member("../escape.txt", b"x")])
    cache, _ = _cache(tmp_path, models_dir)
    for target in ("noconfig.tar.gz", "unsafe.tar.gz"):
        with pytest.raises(Exception) as info:
            cache.fetch(target)
        assert str(models_dir / target) in str(info.value) and ".download-" not in str(info.value)


def test_failed_refetch_keeps_the_previous_copy(tmp_path: Path, models_dir: Path) -> None:
    cache, source = _cache(tmp_path, models_dir)
    good = cache.fetch("tiny-v1.tar.gz")
    before = tree(tmp_path / "cache")
    (models_dir / "tiny-v1.tar.gz").write_bytes(b"truncated")
    _bump_mtime(models_dir / "tiny-v1.tar.gz")
    with pytest.raises(CorruptArtifact):
        cache.fetch("tiny-v1.tar.gz")
    assert tree(tmp_path / "cache") == before
    assert cache.get("tiny-v1.tar.gz") == good


def test_missing_and_invalid_targets(tmp_path: Path, models_dir: Path) -> None:
    cache, source = _cache(tmp_path, models_dir)
    with pytest.raises(TargetNotFound):
        cache.fetch("nope.tar.gz")
    with pytest.raises(InvalidTargetName):
        cache.fetch("../models/tiny-v1.tar.gz")
    assert tree(tmp_path / "cache") == []
    assert source.downloads == ["nope.tar.gz"] and cache.stats.downloads == 0  # tried once, 404, nothing kept


def test_entries_survive_a_restart_and_leftovers_are_swept(tmp_path: Path, models_dir: Path) -> None:
    cache, _ = _cache(tmp_path, models_dir)
    cached = cache.fetch("tiny-v1.tar.gz")
    entry_dir = cached.model_dir.parent
    (entry_dir / ".download-crashed.tar.gz").write_bytes(b"partial")
    (entry_dir / ".model.extract-crashed").mkdir()
    incomplete = tmp_path / "cache" / cache_key("tiny-v2.tar.gz")
    (incomplete / "model").mkdir(parents=True)  # no entry.json: a crash before the entry was written
    unrelated = tmp_path / "cache" / "not-mine"
    unrelated.mkdir()

    again, source = _cache(tmp_path, models_dir)
    assert again.entries() == (cached,)
    assert again.fetch("tiny-v1.tar.gz") == cached and source.downloads == []
    assert sorted(p.name for p in entry_dir.iterdir()) == ["entry.json", "model"]
    assert not incomplete.exists() and unrelated.exists()


def test_cache_over_s3_with_the_real_artifact(moto_server, aws_env, packaged_test_resnet, tmp_path: Path) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=moto_server.endpoint_url)
    bucket = "mme-cache-test"
    s3.create_bucket(Bucket=bucket)
    for i in (1, 2):
        s3.upload_file(str(packaged_test_resnet.tarball), bucket, f"endpoints/resnet/test_resnet-v{i}.tar.gz")
    source = CountingSource(source_from_uri(f"s3://{bucket}/endpoints/resnet/", endpoint_url=moto_server.endpoint_url))
    cache = ModelCache(tmp_path / "cache", source)

    first = cache.fetch("test_resnet-v2.tar.gz")
    assert first.sha256 == sha256_of(packaged_test_resnet.tarball)
    assert (first.model_dir / "test_resnet" / "1" / "model.onnx").is_file()
    assert cache.fetch("test_resnet-v2.tar.gz") == first and source.downloads == ["test_resnet-v2.tar.gz"]
    print(f"\nS3 fetch of test_resnet ({first.tarball_bytes} B): download {first.download_seconds * 1000:.1f} ms, "
          f"extract {first.extract_seconds * 1000:.1f} ms")

    s3.put_object(Bucket=bucket, Key="endpoints/resnet/test_resnet-v2.tar.gz", Body=b"not a tarball")
    with pytest.raises(CorruptArtifact):
        cache.fetch("test_resnet-v2.tar.gz")
    assert cache.get("test_resnet-v2.tar.gz") == first  # the good copy stays
    assert len(source.downloads) == 2


class FinishingWriter(CountingSource):
    """The object is caught half-written: the first download reads a truncated file, and the
    writer completes it right after (as `cp` or a slow upload into the models directory would)."""

    def __init__(self, inner: ModelSource, path: Path, complete: bytes) -> None:
        super().__init__(inner)
        self.path, self.complete = path, complete

    @contextlib.contextmanager
    def open(self, target: str) -> Iterator[ObjectReader]:
        try:
            with super().open(target) as reader:
                yield reader
        finally:
            if self.path.read_bytes() != self.complete:
                self.path.write_bytes(self.complete)
                _bump_mtime(self.path)


def test_a_tarball_caught_half_written_is_retryable_not_corrupt(tmp_path: Path, tiny_tarball: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    complete = tiny_tarball.read_bytes()
    path = models / "tiny.tar.gz"
    path.write_bytes(complete[: len(complete) // 2])
    source = FinishingWriter(LocalDirSource(models), path, complete)
    cache = ModelCache(tmp_path / "cache", source)
    with pytest.raises(ArtifactChanged, match=r"tiny\.tar\.gz changed while it was read .* retry once it is complete") as caught:
        cache.fetch("tiny.tar.gz")
    assert caught.value.retryable is True and caught.value.sagemaker_error == "InternalDependencyException"
    assert isinstance(caught.value.__cause__, CorruptArtifact)
    assert cache.fetch("tiny.tar.gz").model_dir.is_dir()  # the retry succeeds
    path.write_bytes(complete[: len(complete) // 2])  # truncated and left so: corrupt, and retrying will not help
    _bump_mtime(path)
    with pytest.raises(CorruptArtifact) as corrupt:
        ModelCache(tmp_path / "cache2", LocalDirSource(models)).fetch("tiny.tar.gz")
    assert corrupt.value.retryable is False
