"""The MME instance's model cache: download a target model once, verify and unpack it, reuse it.

On disk, one directory per target (named by a hash of the target, as SageMaker names
``/opt/ml/models/<hash>/model``)::

    <root>/<hash>/model/        the unpacked model: the "url" for the container's POST /models
    <root>/<hash>/entry.json    written last; without it the directory is not an entry

A fetch of a target that is cached and unchanged at the source (same size and ETag/mtime)
is a hit: no download. Concurrent fetches of one target share one download (single flight):
the first caller does the work, the others wait and get the same result or the same error.
A failed fetch leaves the cache as it was (a previous copy of a since-changed object stays
until a fetch of the new object succeeds). Revalidation asks the source each time a cached
target is fetched: if the object is gone or the source unreachable, the fetch fails.
One process per cache root.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from mme.errors import MmeError
from mme.fsutil import write_json_atomic
from serving.extract import ExtractLimits, extract_model_tarball
from serving.store import ModelSource, validate_target_name

ENTRY_FILE = "entry.json"
MODEL_DIR = "model"
_KEY = re.compile(r"\A[0-9a-f]{32}\Z")  # cache_key(); other names under root are left alone
_TEMP_PREFIXES = (".download-", f".{MODEL_DIR}.extract-", f".{MODEL_DIR}.staging-", f".{MODEL_DIR}.old-")


class FetchInterrupted(MmeError):
    """The fetch this caller was waiting on was interrupted."""


@dataclass(frozen=True)
class CachedModel:
    target: str
    model_dir: Path  # give this to the container: POST /models {"model_name": ..., "url": model_dir}
    tarball_bytes: int
    sha256: str
    download_seconds: float
    extract_seconds: float
    source_version: str  # ETag or mtime the copy was made from
    layout: str  # model-dir, ensemble or root-config
    # This fetch found the copy already extracted (no download); not part of the model's identity.
    cache_hit: bool = field(default=False, compare=False)

    @property
    def container_name(self) -> str:
        """The name SageMaker gives the container for this target: the hash its directory is named by."""
        return cache_key(self.target)


@dataclass(frozen=True)
class CacheStats:
    hits: int
    downloads: int
    failures: int


class _Flight:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: CachedModel | None = None
        self.error: BaseException | None = None


def cache_key(target: str) -> str:
    return hashlib.sha256(target.encode()).hexdigest()[:32]


class ModelCache:
    def __init__(self, root: Path, source: ModelSource, limits: ExtractLimits = ExtractLimits(), *, revalidate: bool = True) -> None:
        self.root = Path(root).resolve()  # the container resolves a relative url against its own cwd
        self.root.mkdir(parents=True, exist_ok=True)
        self.source = source
        self.limits = limits
        self.revalidate = revalidate  # False: a cached copy is used without asking the source
        self._lock = threading.Lock()
        self._flights: dict[str, _Flight] = {}
        self._target_locks: dict[str, threading.Lock] = {}
        self._entries: dict[str, CachedModel] = {}
        self._hits = self._downloads = self._failures = 0
        self._recover()

    # -- public -------------------------------------------------------------------------

    def fetch(self, target: str) -> CachedModel:
        """Return the unpacked model for ``target``, downloading and verifying it if needed."""
        validate_target_name(target)
        with self._lock:
            existing = self._flights.get(target)
            flight = existing if existing is not None else self._flights.setdefault(target, _Flight())
        if existing is not None:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            return flight.result  # type: ignore[return-value]
        try:
            with self._target_lock(target):
                flight.result = self._fetch_locked(target)
            return flight.result
        except Exception as exc:
            flight.error = exc
            raise
        except BaseException:
            flight.error = FetchInterrupted(f"fetch of {target} was interrupted; retry the request")
            raise
        finally:
            with self._lock:
                del self._flights[target]
            flight.done.set()

    def get(self, target: str) -> CachedModel | None:
        """The cached copy of ``target`` if there is one, without asking the source."""
        with self._lock:
            return self._entries.get(validate_target_name(target))

    def evict(self, target: str) -> bool:
        """Remove the unpacked copy of ``target``; True if there was one."""
        validate_target_name(target)
        with self._target_lock(target):
            with self._lock:
                self._entries.pop(target, None)
            entry_dir = self.root / cache_key(target)
            if not entry_dir.exists():
                return False
            with contextlib.suppress(FileNotFoundError):
                (entry_dir / ENTRY_FILE).unlink()  # first: a half-removed directory is not an entry
            shutil.rmtree(entry_dir)
            return True

    def entries(self) -> tuple[CachedModel, ...]:
        with self._lock:
            return tuple(sorted(self._entries.values(), key=lambda e: e.target))

    @property
    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._downloads, self._failures)

    # -- internals ----------------------------------------------------------------------

    def _target_lock(self, target: str) -> threading.Lock:
        with self._lock:
            return self._target_locks.setdefault(target, threading.Lock())

    def _fetch_locked(self, target: str) -> CachedModel:
        cached = self.get(target)
        if cached is not None and cached.model_dir.is_dir():
            if not self.revalidate:
                return self._count_hit(cached)
            info = self.source.stat(target)
            if (info.size, info.version) == (cached.tarball_bytes, cached.source_version):
                return self._count_hit(cached)
        try:
            fresh = self._download_and_extract(target)
        except Exception:
            with self._lock:
                self._failures += 1
            raise
        with self._lock:
            self._entries[target] = fresh
        return fresh

    def _count_hit(self, cached: CachedModel) -> CachedModel:
        with self._lock:
            self._hits += 1
        return replace(cached, cache_hit=True)

    def _download_and_extract(self, target: str) -> CachedModel:
        entry_dir = self.root / cache_key(target)
        entry_dir.mkdir(exist_ok=True)
        fd, name = tempfile.mkstemp(dir=entry_dir, prefix=".download-", suffix=".tar.gz")
        os.close(fd)
        tarball = Path(name)
        try:
            start = time.perf_counter()
            info = self.source.download(target, tarball)
            download_s = time.perf_counter() - start
            with self._lock:
                self._downloads += 1
            extracted = extract_model_tarball(tarball, entry_dir / MODEL_DIR, self.limits)
            cached = CachedModel(
                target=target, model_dir=extracted.root, tarball_bytes=info.size, sha256=extracted.sha256,
                download_seconds=round(download_s, 6), extract_seconds=round(extracted.seconds, 6),
                source_version=info.version, layout=extracted.layout,
            )
            write_json_atomic(entry_dir / ENTRY_FILE, asdict(cached) | {"model_dir": MODEL_DIR})
            return cached
        finally:
            with contextlib.suppress(FileNotFoundError):
                tarball.unlink()
            if not (entry_dir / ENTRY_FILE).exists():  # nothing was cached before: leave nothing
                shutil.rmtree(entry_dir, ignore_errors=True)

    def _recover(self) -> None:
        """Load entries left by an earlier run; remove temp files and incomplete entries."""
        for entry_dir in sorted(p for p in self.root.iterdir() if p.is_dir() and _KEY.match(p.name)):
            for leftover in entry_dir.iterdir():
                if leftover.name.startswith(_TEMP_PREFIXES):
                    if leftover.is_dir():
                        shutil.rmtree(leftover, ignore_errors=True)
                    else:
                        leftover.unlink(missing_ok=True)
            cached = self._read_entry(entry_dir)
            if cached is None:
                shutil.rmtree(entry_dir, ignore_errors=True)
            else:
                self._entries[cached.target] = cached

    @staticmethod
    def _read_entry(entry_dir: Path) -> CachedModel | None:
        try:
            data = json.loads((entry_dir / ENTRY_FILE).read_text())
            data["model_dir"] = entry_dir / data["model_dir"]
            cached = CachedModel(**data)
        except (FileNotFoundError, json.JSONDecodeError, TypeError, KeyError):
            return None
        if cache_key(cached.target) != entry_dir.name or not cached.model_dir.is_dir():
            return None
        return cached
