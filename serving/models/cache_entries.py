"""The model cache's entries on disk: one directory per target, named by a hash of the
target (as SageMaker names ``/opt/ml/models/<hash>/model``)::

    <root>/<hash>/model/        the unpacked model: the "url" for the container's POST /models
    <root>/<hash>/entry.json    written last; without it the directory is not an entry

``entry.json`` records the :class:`CachedModel` and the allocated size of ``model/`` (as
``du`` counts it, measured once when it was extracted); its mtime is the entry's last use,
so LRU order survives a restart. :func:`recover_entries` reads back what an earlier run left
and clears its half-written leftovers. The fetch and eviction policy is
:class:`serving.models.cache.ModelCache`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mme.fsutil import write_json_atomic

ENTRY_FILE = "entry.json"
ENTRY_MODEL_DIR = "model"
_KEY = re.compile(r"\A[0-9a-f]{32}\Z")  # cache_key(); other names under root are left alone
TEMP_PREFIXES = (".download-", f".{ENTRY_MODEL_DIR}.extract-", f".{ENTRY_MODEL_DIR}.staging-", f".{ENTRY_MODEL_DIR}.old-")
_DISK_BYTES = "disk_bytes"  # entry.json: allocated bytes of model/, measured when it was extracted


def cache_key(target: str) -> str:
    return hashlib.sha256(target.encode()).hexdigest()[:32]


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
class RecoveredEntry:
    """An entry found on disk at start: the model, its entry's allocated bytes, its last use (ns)."""

    cached: CachedModel
    size: int
    last_used_ns: int


def write_entry(entry_dir: Path, cached: CachedModel, model_bytes: int) -> None:
    """Write ``entry.json`` atomically: from here on ``entry_dir`` is an entry."""
    write_json_atomic(entry_dir / ENTRY_FILE, asdict(cached) | {"model_dir": ENTRY_MODEL_DIR, _DISK_BYTES: model_bytes})


def remove_entry(entry_dir: Path) -> None:
    """Delete an entry directory, its entry.json first (a half-removed directory is not an entry)."""
    if not entry_dir.exists():
        return
    with contextlib.suppress(FileNotFoundError):
        (entry_dir / ENTRY_FILE).unlink()
    shutil.rmtree(entry_dir)


def read_entry(entry_dir: Path) -> tuple[CachedModel, int | None] | None:
    """The entry in ``entry_dir`` and its recorded model bytes (None when not recorded), or
    None when it is not a complete, consistent entry."""
    try:
        data = json.loads((entry_dir / ENTRY_FILE).read_text())
        model_bytes = data.pop(_DISK_BYTES, None)
        data["model_dir"] = entry_dir / data["model_dir"]
        cached = CachedModel(**data)
    except (FileNotFoundError, json.JSONDecodeError, TypeError, KeyError, AttributeError):
        return None
    if cache_key(cached.target) != entry_dir.name or not cached.model_dir.is_dir():
        return None
    return cached, model_bytes if isinstance(model_bytes, int) and model_bytes >= 0 else None


def recover_entries(root: Path) -> Iterator[RecoveredEntry]:
    """The entries an earlier run left under ``root`` (with their sizes and last uses); temp
    files and incomplete entries are removed on the way."""
    for entry_dir in sorted(p for p in root.iterdir() if p.is_dir() and _KEY.match(p.name)):
        for leftover in entry_dir.iterdir():
            if leftover.name.startswith(TEMP_PREFIXES):
                if leftover.is_dir():
                    shutil.rmtree(leftover, ignore_errors=True)
                else:
                    leftover.unlink(missing_ok=True)
        found = read_entry(entry_dir)
        if found is None:
            shutil.rmtree(entry_dir, ignore_errors=True)
            continue
        cached, model_bytes = found
        if model_bytes is None:  # written before sizes were recorded: measure it once
            model_bytes = disk_usage(cached.model_dir)
        size = model_bytes + entry_overhead(entry_dir)
        yield RecoveredEntry(cached, size, (entry_dir / ENTRY_FILE).stat().st_mtime_ns)


def disk_usage(path: Path) -> int:
    """Allocated bytes under ``path``, itself included, as ``du -s --block-size=1`` counts them:
    st_blocks of every file, directory and link, a hard-linked inode once. 0 if it is gone."""
    try:
        top = os.lstat(path)
    except FileNotFoundError:
        return 0
    total = top.st_blocks * 512
    seen: set[tuple[int, int]] = set()
    stack = [os.fspath(path)] if stat.S_ISDIR(top.st_mode) else []
    while stack:
        with os.scandir(stack.pop()) as it:
            for item in it:
                st = item.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    stack.append(item.path)
                elif st.st_nlink > 1:
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def entry_overhead(entry_dir: Path) -> int:
    """Allocated bytes of an entry directory itself and its entry.json (what is not model/)."""
    total = 0
    for path in (entry_dir, entry_dir / ENTRY_FILE):
        with contextlib.suppress(FileNotFoundError):
            total += path.lstat().st_blocks * 512
    return total


def set_last_use(entry_dir: Path, stamp_ns: int) -> None:
    """Record a use of the entry: ``stamp_ns`` as its entry.json's mtime (FileNotFoundError if gone)."""
    os.utime(entry_dir / ENTRY_FILE, ns=(stamp_ns, stamp_ns))
