"""The MME instance's model cache: download a target model once, verify and unpack it, reuse it.

On disk, one directory per target, ``<root>/<hash>/model`` (:mod:`serving.models.cache_entries` keeps
that bookkeeping: entry.json, sizes, last uses, recovery after a restart).

A fetch of a target that is cached and unchanged at the source (same size and ETag/mtime)
is a hit: no download. Concurrent fetches of one target share one download (single flight):
the first caller does the work, the others wait and get the same result or the same error.
A failed fetch leaves the cache as it was (a previous copy of a since-changed object stays
until a fetch of the new object succeeds). Revalidation asks the source each time a cached
target is fetched: if the object is gone or the source unreachable, the fetch fails.
One process per cache root.

Disk limit (``disk_limit_bytes``), as SageMaker's MME handles a full instance disk: "If the
instance's storage volume reaches its capacity, Amazon SageMaker deletes any unused models from
the storage volume" (https://docs.aws.amazon.com/sagemaker/latest/dg/how-multi-mode-endpoints-work.html),
"when the volume is reaching capacity and new models need to be downloaded"
(https://docs.aws.amazon.com/sagemaker/latest/dg/add-models-to-endpoint.html). Before a download
(room for the object's size) and after each extraction, cached copies are deleted least recently
used first, never one that ``in_use(target)`` reports (loaded or loading in the container, which
reads its files, lazily for a python-backend model), nor one being fetched. When nothing else can
go, the new copy is kept anyway and the overrun is counted (``stats.over_limit``): the request
does not fail. What a single model may unpack to is bounded, though: an extraction stops as soon
as its files would pass the whole disk limit (such a model could never fit) or the filesystem's
free space less a reserve, before writing the rest (``ExceedsDiskBudget``). A tarball that reads
as truncated while the source now reports another size or version was caught half-written: that
is :class:`ArtifactChanged` (retryable), not corrupt. A use is a fetch (hit or download) or
:meth:`ModelCache.touch`, recorded in the entry (LRU order survives a restart). ``usage_bytes()``
(entries only, not downloads in progress, each as ``du`` counts it) is kept as entries come and go.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from mme.archive import CorruptArtifact, DiskBudget, ExtractLimits, prepare_reader
from mme.errors import MmeError
from serving.models.cache_entries import (
    ENTRY_FILE,
    ENTRY_MODEL_DIR,
    CachedModel,
    cache_key,
    disk_usage,
    entry_overhead,
    recover_entries,
    remove_entry,
    set_last_use,
    write_entry,
)
from serving.models.extract import extract_model_tarball
from serving.models.store import ArtifactChanged, ModelSource, ObjectInfo, StoreError, validate_target_name

# Free space an extraction leaves on the cache's filesystem (logs, Triton's own files, other writers).
FREE_SPACE_RESERVE_BYTES = 256 * 2**20
_log = logging.getLogger(__name__)


class FetchInterrupted(MmeError):
    """The fetch this caller was waiting on was interrupted."""


@dataclass(frozen=True)
class CacheStats:
    hits: int
    downloads: int
    failures: int
    pruned: int = 0  # entries deleted to stay under the disk limit
    pruned_bytes: int = 0
    over_limit: int = 0  # extractions after which usage stayed over the limit (everything else in use)


class _Flight:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: CachedModel | None = None
        self.error: BaseException | None = None


class ModelCache:
    def __init__(
        self,
        root: Path,
        source: ModelSource,
        limits: ExtractLimits = ExtractLimits(),
        *,
        revalidate: bool = True,
        disk_limit_bytes: int | None = None,
        in_use: Callable[[str], bool] | None = None,
        on_fetch: Callable[[str, Path], None] | None = None,
    ) -> None:
        if disk_limit_bytes is not None and disk_limit_bytes <= 0:
            raise ValueError(f"disk_limit_bytes must be positive or None, got {disk_limit_bytes}")
        self.root = Path(root).resolve()  # the container resolves a relative url against its own cwd
        self.root.mkdir(parents=True, exist_ok=True)
        prepare_reader()  # once here, not on the first request's path
        self.source = source
        self.limits = limits
        self.revalidate = revalidate  # False: a cached copy is used without asking the source
        self.disk_limit_bytes = disk_limit_bytes  # None: never prune
        # True for a target whose files must stay (loaded or loading); called from fetching
        # threads, so it must be thread-safe and must not block on the caller of fetch.
        self._in_use = in_use or (lambda target: False)
        self._on_fetch = on_fetch  # (target, model_dir) after each fetch, before its callers go on (warnings)
        self._lock = threading.Lock()
        self._prune_lock = threading.Lock()  # one pruning pass at a time
        self._flights: dict[str, _Flight] = {}
        self._target_locks: dict[str, threading.Lock] = {}
        self._entries: dict[str, CachedModel] = {}
        self._sizes: dict[str, int] = {}  # target -> allocated bytes of its entry directory
        self._last_used: dict[str, int] = {}  # target -> ns stamp of its last use (entry.json mtime)
        self._usage = 0  # sum of _sizes
        self._stamp = 0  # the last use stamp handed out; stamps strictly increase
        self._hits = self._downloads = self._failures = 0
        self._pruned = self._pruned_bytes = self._over_limit = 0
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
                if self._on_fetch is not None:
                    self._on_fetch(target, flight.result.model_dir)
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
            return self._remove_locked(target) is not None

    def touch(self, target: str) -> bool:
        """Record a use of ``target``'s copy now; False if it is not cached. Does not wait for a fetch.

        Fetches record their own use; call this for uses the cache does not see (e.g. when the
        container unloads the model), so that a model served for hours and then unloaded is not
        the first one deleted."""
        validate_target_name(target)
        return self._mark_used(target)

    def prune(self, keep: str | None = None) -> list[str]:
        """Delete least recently used copies not in use (and not ``keep``) until usage is within the
        disk limit; return the targets deleted, oldest first. Without a limit: nothing."""
        if self.disk_limit_bytes is None:
            return []
        return self._prune(keep, self.disk_limit_bytes)

    def usage_bytes(self) -> int:
        """Bytes the cache's entries occupy on disk (allocated blocks, as ``du`` counts them)."""
        with self._lock:
            return self._usage

    def entries(self) -> tuple[CachedModel, ...]:
        with self._lock:
            return tuple(sorted(self._entries.values(), key=lambda e: e.target))

    def lru_order(self) -> tuple[str, ...]:
        """Cached targets, least recently used first (the order pruning deletes them in)."""
        with self._lock:
            return tuple(sorted(self._entries, key=lambda t: (self._last_used.get(t, 0), t)))

    @property
    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._downloads, self._failures,
                              self._pruned, self._pruned_bytes, self._over_limit)

    # -- internals ----------------------------------------------------------------------

    def _target_lock(self, target: str) -> threading.Lock:
        with self._lock:
            return self._target_locks.setdefault(target, threading.Lock())

    def _fetch_locked(self, target: str) -> CachedModel:
        cached = self.get(target)
        info: ObjectInfo | None = None
        if cached is not None and cached.model_dir.is_dir():
            if not self.revalidate:
                return self._count_hit(cached)
            info = self.source.stat(target)
            if (info.size, info.version) == (cached.tarball_bytes, cached.source_version):
                return self._count_hit(cached)
        try:
            if self.disk_limit_bytes is not None:
                # Make room first. The object's size is a lower bound of what it unpacks to (model
                # weights barely compress), so this deletes nothing the check after extraction would keep.
                info = info or self.source.stat(target)
                self._prune(target, self.disk_limit_bytes - info.size)
            fresh, model_bytes = self._download_and_extract(target)
        except Exception:
            with self._lock:
                self._failures += 1
            raise
        entry_dir = self.root / cache_key(target)
        size = model_bytes + entry_overhead(entry_dir)
        stamp = self._next_stamp()
        set_last_use(entry_dir, stamp)
        with self._lock:
            self._usage += size - self._sizes.get(target, 0)
            self._entries[target] = fresh
            self._sizes[target] = size
            self._last_used[target] = stamp
        if self.disk_limit_bytes is not None:
            self._prune(target, self.disk_limit_bytes)
            if self.usage_bytes() > self.disk_limit_bytes:
                with self._lock:
                    self._over_limit += 1
                    usage = self._usage
                _log.warning(
                    "model cache %s uses %d bytes, over its disk limit of %d: the other copies are in use or "
                    "being fetched; kept %s anyway (raise the disk limit or load fewer models at once)",
                    self.root, usage, self.disk_limit_bytes, target,
                )
        return fresh

    def _count_hit(self, cached: CachedModel) -> CachedModel:
        self._mark_used(cached.target)
        with self._lock:
            self._hits += 1
        return replace(cached, cache_hit=True)

    def _next_stamp(self) -> int:
        with self._lock:
            self._stamp = max(time.time_ns(), self._stamp + 1)
            return self._stamp

    def _mark_used(self, target: str) -> bool:
        """Stamp ``target``'s last use now, in memory and as its entry.json mtime; False if not cached."""
        if self.get(target) is None:
            return False
        stamp = self._next_stamp()
        with contextlib.suppress(FileNotFoundError):  # deleted meanwhile: nothing to stamp
            set_last_use(self.root / cache_key(target), stamp)
        with self._lock:
            if target not in self._entries:
                return False
            self._last_used[target] = max(stamp, self._last_used.get(target, 0))
        return True

    def _prune(self, keep: str | None, budget: int) -> list[str]:
        """Delete LRU entries that are not in use, not ``keep`` and not being fetched until usage <= budget."""
        deleted: list[str] = []
        with self._prune_lock:
            for target in self.lru_order():
                if self.usage_bytes() <= budget:
                    break
                if target == keep or self._busy(target):
                    continue
                lock = self._target_lock(target)
                if not lock.acquire(blocking=False):  # being fetched (or evicted): leave it
                    continue
                try:
                    if self._busy(target):  # asked again under its lock: a load may have started since
                        continue
                    size = self._remove_locked(target)
                finally:
                    lock.release()
                if size is not None:
                    deleted.append(target)
                    with self._lock:
                        self._pruned += 1
                        self._pruned_bytes += size
        for target in deleted:
            _log.info("model cache %s: deleted %s (least recently used, not loaded) to stay under %d bytes",
                      self.root, target, self.disk_limit_bytes)
        return deleted

    def _busy(self, target: str) -> bool:
        """In use by the container, or a fetch of it is under way."""
        with self._lock:
            if target in self._flights:
                return True
        try:
            return bool(self._in_use(target))
        except Exception:  # an in_use that fails must not get files deleted under a loaded model
            _log.exception("in_use(%r) failed; keeping its cached copy", target)
            return True

    def _remove_locked(self, target: str) -> int | None:
        """Forget and delete ``target``'s entry; its bytes, or None if there was none. Caller holds its lock."""
        with self._lock:
            self._entries.pop(target, None)
            self._last_used.pop(target, None)
            size = self._sizes.pop(target, None)
            self._usage -= size or 0
        entry_dir = self.root / cache_key(target)
        if not entry_dir.exists():
            return size
        remove_entry(entry_dir)
        return size if size is not None else 0

    def _download_and_extract(self, target: str) -> tuple[CachedModel, int]:
        """Download, verify and unpack ``target``; the entry and the allocated bytes of its model directory."""
        entry_dir = self.root / cache_key(target)
        entry_dir.mkdir(exist_ok=True)
        info: ObjectInfo | None = None
        try:
            start = time.perf_counter()
            try:
                # The object streams into the inflater and the tar reader as it arrives: nothing is
                # written to disk but the model's files, and the download overlaps the extraction.
                with self.source.open(target) as reader:
                    info = reader.info
                    with self._lock:
                        self._downloads += 1
                    extracted = extract_model_tarball(reader, entry_dir / ENTRY_MODEL_DIR, self.limits,
                                                      name=info.location, budget=self._extraction_budget(), size=info.size)
            except CorruptArtifact as exc:
                if info is not None:
                    self._raise_if_changed(target, info, exc)
                raise
            download_s = reader.read_seconds  # waiting on the source; the rest of the wall time is ours
            extract_s = max(0.0, time.perf_counter() - start - download_s)
            cached = CachedModel(
                target=target, model_dir=extracted.root, tarball_bytes=info.size, sha256=extracted.sha256,
                download_seconds=round(download_s, 6), extract_seconds=round(extract_s, 6),
                source_version=info.version, layout=extracted.layout,
            )
            # Measured once, here: the extraction just wrote these files. ExtractedModel.total_bytes
            # counts file contents only, not the blocks, directories and inodes du counts.
            model_bytes = disk_usage(extracted.root)
            write_entry(entry_dir, cached, model_bytes)
            return cached, model_bytes
        finally:
            if not (entry_dir / ENTRY_FILE).exists():  # nothing was cached before: leave nothing
                shutil.rmtree(entry_dir, ignore_errors=True)

    def _extraction_budget(self) -> DiskBudget:
        """What one extraction may write: never more than the whole disk limit (such a model could
        never be cached within it), nor more than the filesystem has free, less a reserve."""
        free = shutil.disk_usage(self.root).free - FREE_SPACE_RESERVE_BYTES
        if self.disk_limit_bytes is not None and self.disk_limit_bytes <= free:
            return DiskBudget(self.disk_limit_bytes, f"the model cache's disk limit ({self.disk_limit_bytes:,} bytes; "
                                                      "raise it with mme serve --disk-limit)")
        return DiskBudget(max(0, free), f"the free space of {self.root}'s filesystem (less a "
                                        f"{FREE_SPACE_RESERVE_BYTES // 2**20} MiB reserve; free some space)")

    def _raise_if_changed(self, target: str, downloaded: ObjectInfo, exc: Exception) -> None:
        """A tarball that reads as truncated may have been caught while it was written: if the source
        now reports another size or version, say so (retryable) instead of calling it corrupt."""
        try:
            now = self.source.stat(target)
        except StoreError:
            return
        if (now.size, now.version) != (downloaded.size, downloaded.version):
            raise ArtifactChanged(
                f"{downloaded.location} changed while it was read ({downloaded.size:,} bytes then, {now.size:,} now) "
                "and what was read is incomplete; it is probably still being written: retry once it is complete"
            ) from exc

    def _recover(self) -> None:
        """Load entries left by an earlier run (with their sizes and last uses); remove temp files and incomplete entries."""
        for found in recover_entries(self.root):
            target = found.cached.target
            self._entries[target] = found.cached
            self._sizes[target] = found.size
            self._last_used[target] = found.last_used_ns
            self._usage += found.size
            self._stamp = max(self._stamp, found.last_used_ns)
