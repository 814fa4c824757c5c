"""serving.models.cache disk limit: LRU deletion of unloaded copies, in-use copies kept, usage as du counts it.

Real tarballs of small python-backend models (each with an incompressible weights file, so a
tarball is about as big as what it unpacks to) served by a real LocalDirSource.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from serving.models.cache import ModelCache
from serving.models.cache_entries import ENTRY_FILE, cache_key, disk_usage
from mme.archive import ExceedsDiskBudget
from serving.models.store import LocalDirSource, ModelSource
from tests.serving.models.store_helpers import Member, WatchedSource, model_members, run_together, write_tarball

WEIGHTS = 48 * 1024


class RecordingSource(WatchedSource):
    """A real source; records the cache's usage when each download starts, can be slow."""

    def __init__(self, inner: ModelSource, delay_s: float = 0.0) -> None:
        super().__init__(inner, delay_s)
        self.cache: ModelCache | None = None
        self.usage_at_download: list[tuple[str, int]] = []

    def on_download(self, target: str) -> None:
        self.usage_at_download.append((target, self.cache.usage_bytes() if self.cache else 0))


def _model_tarball(path: Path, name: str, seed: int) -> Path:
    weights = random.Random(seed).randbytes(WEIGHTS)  # incompressible
    return write_tarball(path, model_members(name) + [Member(f"{name}/1/weights.bin", weights)])


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    for i in range(8):
        _model_tarball(root / f"m{i}.tar.gz", f"m{i}", i)
    return root


def _cache(tmp_path: Path, models_dir: Path, limit: int | None = None, in_use=None,
           delay_s: float = 0.0) -> tuple[ModelCache, RecordingSource]:
    source = RecordingSource(LocalDirSource(models_dir), delay_s)
    cache = ModelCache(tmp_path / "cache", source, disk_limit_bytes=limit, in_use=in_use)
    source.cache = cache
    return cache, source


def _entry_size(tmp_path: Path, models_dir: Path) -> int:
    """Allocated bytes of one cached model (all of them are built alike), measured in a scratch cache."""
    cache, _ = _cache(tmp_path / "scratch", models_dir)
    cache.fetch("m0.tar.gz")
    return cache.usage_bytes()


def _du(paths: list[Path]) -> int:
    if not paths:
        return 0
    out = subprocess.run(["du", "-s", "--block-size=1", *map(str, paths)], check=True, capture_output=True, text=True).stdout
    return sum(int(line.split()[0]) for line in out.splitlines())


def _entry_dirs(cache: ModelCache) -> list[Path]:
    return sorted(p for p in cache.root.iterdir() if p.is_dir() and not p.name.startswith("."))


def _consistent(cache: ModelCache) -> None:
    """Every entry has its directory and entry.json, every directory is an entry, usage is what du says."""
    targets = {e.target for e in cache.entries()}
    for entry in cache.entries():
        assert (entry.model_dir / entry.target.split(".")[0] / "config.pbtxt").is_file(), entry.target
        assert (entry.model_dir.parent / ENTRY_FILE).is_file(), entry.target
    assert {p.name for p in _entry_dirs(cache)} == {cache_key(t) for t in targets}
    assert set(cache.lru_order()) == targets
    assert abs(cache.usage_bytes() - _du(_entry_dirs(cache))) <= 4096, (cache.usage_bytes(), _du(_entry_dirs(cache)))


def test_usage_matches_du_and_is_kept_incrementally(tmp_path: Path, models_dir: Path) -> None:
    cache, _ = _cache(tmp_path, models_dir)
    assert cache.usage_bytes() == 0
    sizes = []
    for i in range(3):
        cache.fetch(f"m{i}.tar.gz")
        sizes.append(cache.usage_bytes() - sum(sizes))
        _consistent(cache)
    # exact, not within a block: the same st_blocks du reads
    assert cache.usage_bytes() == _du(_entry_dirs(cache))
    assert min(sizes) > WEIGHTS  # the weights plus config, code, directories and entry.json
    assert cache.evict("m1.tar.gz")
    assert cache.usage_bytes() == _du(_entry_dirs(cache)) == sizes[0] + sizes[2]
    entry = json.loads((cache.root / cache_key("m0.tar.gz") / ENTRY_FILE).read_text())
    assert entry["disk_bytes"] == disk_usage(cache.root / cache_key("m0.tar.gz") / "model")
    print(f"\none cached model: {sizes[0]} bytes allocated ({WEIGHTS} of weights)")


def test_least_recently_used_unloaded_copies_go_first(tmp_path: Path, models_dir: Path) -> None:
    size = _entry_size(tmp_path, models_dir)
    limit = 3 * size + size // 2
    cache, source = _cache(tmp_path, models_dir, limit)
    for target in ("m0.tar.gz", "m1.tar.gz", "m2.tar.gz"):
        cache.fetch(target)
    assert cache.fetch("m0.tar.gz").cache_hit  # m0 used again: m1 is now the least recently used
    assert cache.lru_order() == ("m1.tar.gz", "m2.tar.gz", "m0.tar.gz")
    assert cache.stats.pruned == 0

    cache.fetch("m3.tar.gz")
    assert cache.lru_order() == ("m2.tar.gz", "m0.tar.gz", "m3.tar.gz")
    assert not (cache.root / cache_key("m1.tar.gz")).exists() and cache.get("m1.tar.gz") is None
    assert cache.stats.pruned == 1 and cache.stats.pruned_bytes == size and cache.stats.over_limit == 0
    # room was made before the download: usage plus the object's size fitted under the limit
    target, usage = source.usage_at_download[-1]
    assert target == "m3.tar.gz" and usage + source.stat("m3.tar.gz").size <= limit
    assert cache.usage_bytes() <= limit
    _consistent(cache)

    assert cache.touch("m2.tar.gz") and not cache.touch("m1.tar.gz")  # a use the cache does not see itself
    assert cache.lru_order() == ("m0.tar.gz", "m3.tar.gz", "m2.tar.gz")
    cache.fetch("m4.tar.gz")
    assert cache.lru_order() == ("m3.tar.gz", "m2.tar.gz", "m4.tar.gz")
    assert cache.stats.pruned == 2


def test_in_use_copies_survive_and_the_overrun_is_counted(tmp_path: Path, models_dir: Path) -> None:
    size = _entry_size(tmp_path, models_dir)
    loaded: set[str] = set()  # what the endpoint's in_use answers: loaded or loading

    def load(target: str) -> None:  # as the endpoint does: loading from before the fetch
        loaded.add(target)
        cache.fetch(target)

    cache, _ = _cache(tmp_path, models_dir, 2 * size + size // 2, in_use=lambda t: t in loaded)
    for target in ("m0.tar.gz", "m1.tar.gz", "m2.tar.gz"):
        load(target)
    # all three loaded: nothing may go, and the request for m2 still succeeded
    assert cache.lru_order() == ("m0.tar.gz", "m1.tar.gz", "m2.tar.gz")
    assert cache.stats.over_limit == 1 and cache.stats.pruned == 0
    assert cache.prune() == []

    loaded -= {"m0.tar.gz", "m2.tar.gz"}  # unloaded from the container
    load("m3.tar.gz")
    # m0 (oldest, unloaded) and then m2 (unloaded) go; m1 is older than m2 but loaded
    assert cache.lru_order() == ("m1.tar.gz", "m3.tar.gz")
    assert cache.stats.pruned == 2 and cache.stats.over_limit == 1
    assert cache.usage_bytes() <= cache.disk_limit_bytes
    _consistent(cache)


def test_a_model_bigger_than_the_whole_limit_stops_extracting_and_leaves_nothing(tmp_path: Path, models_dir: Path) -> None:
    size = _entry_size(tmp_path, models_dir)
    cache, _ = _cache(tmp_path, models_dir, size // 2)  # not even one model fits
    with pytest.raises(ExceedsDiskBudget, match=r"m0\.tar\.gz unpacks to more than the .* disk limit .*--disk-limit") as caught:
        cache.fetch("m0.tar.gz")
    assert caught.value.retryable is False
    assert _entry_dirs(cache) == [] and not any(cache.root.iterdir())  # no staging, no download left
    assert cache.usage_bytes() == 0 and cache.stats.failures == 1 and cache.stats.over_limit == 0


def test_the_copy_just_fetched_stays_over_the_limit_when_the_rest_is_in_use(tmp_path: Path, models_dir: Path) -> None:
    size = _entry_size(tmp_path, models_dir)
    cache, _ = _cache(tmp_path, models_dir, size + size // 2, in_use=lambda t: t == "m0.tar.gz")
    cache.fetch("m0.tar.gz")
    second = cache.fetch("m1.tar.gz")  # fits alone, but m0 is loaded: kept over the limit
    assert second.model_dir.is_dir() and cache.stats.over_limit == 1
    assert cache.prune(keep="m1.tar.gz") == []
    assert cache.prune() == ["m1.tar.gz"]  # not kept, not in use: the limit wins
    assert cache.lru_order() == ("m0.tar.gz",)


def test_concurrent_fetches_with_pruning_leave_a_consistent_cache(tmp_path: Path, models_dir: Path) -> None:
    """Eight threads fetch random targets through a limit of 2.5 models; a target a thread holds
    (as the endpoint holds a loaded model) must keep its files until it lets go."""
    size = _entry_size(tmp_path, models_dir)
    held: Counter[str] = Counter()
    held_lock = threading.Lock()

    def in_use(target: str) -> bool:
        with held_lock:
            return held[target] > 0

    cache, source = _cache(tmp_path, models_dir, 2 * size + size // 2, in_use=in_use, delay_s=0.005)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(12):
            target = f"m{rng.randrange(8)}.tar.gz"
            with held_lock:
                held[target] += 1
            try:
                cached = cache.fetch(target)
                name = target.split(".")[0]
                time.sleep(rng.random() * 0.005)  # "loaded": the container reads the files now
                assert (cached.model_dir / name / "config.pbtxt").read_text()
                assert (cached.model_dir / name / "1" / "weights.bin").stat().st_size == WEIGHTS
            finally:
                with held_lock:
                    held[target] -= 1

    _, errors = run_together(worker, timeout_s=120)
    assert errors == []
    stats = cache.stats
    assert stats.pruned > 0 and stats.downloads > 8
    assert stats.pruned_bytes == stats.pruned * size
    _consistent(cache)
    cache.prune()  # nothing is held any more: whatever ran over while everything was held goes now
    assert cache.usage_bytes() <= cache.disk_limit_bytes
    _consistent(cache)
    print(f"\n{stats.downloads} downloads, {stats.hits} hits, {stats.pruned} pruned, "
          f"{stats.over_limit} over the limit, {len(source.usage_at_download)} downloads started")


def test_a_restart_recovers_usage_and_lru_order(tmp_path: Path, models_dir: Path) -> None:
    size = _entry_size(tmp_path, models_dir)
    cache, _ = _cache(tmp_path, models_dir)
    for target in ("m0.tar.gz", "m1.tar.gz", "m2.tar.gz", "m3.tar.gz"):
        cache.fetch(target)
    cache.fetch("m0.tar.gz")
    cache.touch("m2.tar.gz")
    order = ("m1.tar.gz", "m3.tar.gz", "m0.tar.gz", "m2.tar.gz")
    assert cache.lru_order() == order
    usage = cache.usage_bytes()

    # an entry written before sizes were recorded is measured once at start
    old_style = cache.root / cache_key("m3.tar.gz") / ENTRY_FILE
    mtime = old_style.stat().st_mtime_ns
    data = json.loads(old_style.read_text())
    del data["disk_bytes"]
    old_style.write_text(json.dumps(data))
    os.utime(old_style, ns=(mtime, mtime))

    again, _ = _cache(tmp_path, models_dir, 2 * size + size // 2)
    assert again.usage_bytes() == usage == _du(_entry_dirs(again))
    assert again.lru_order() == order
    assert again.prune() == ["m1.tar.gz", "m3.tar.gz"]
    assert again.lru_order() == ("m0.tar.gz", "m2.tar.gz")
    _consistent(again)
    # a use after the restart still comes after every recovered one
    again.fetch("m0.tar.gz")
    assert again.lru_order() == ("m2.tar.gz", "m0.tar.gz")


def test_no_limit_never_prunes_and_bad_limits_are_refused(tmp_path: Path, models_dir: Path) -> None:
    cache, _ = _cache(tmp_path, models_dir)
    for i in range(4):
        cache.fetch(f"m{i}.tar.gz")
    assert cache.prune() == [] and len(cache.entries()) == 4 and cache.stats.pruned == 0
    with pytest.raises(ValueError, match="disk_limit_bytes must be positive"):
        ModelCache(tmp_path / "other", LocalDirSource(models_dir), disk_limit_bytes=0)
