"""Filesystem helpers: atomic writes, staged directories, hashing, deterministic tarballs."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path
from typing import Any, Iterator, Sequence

from mme.errors import MmeError, OutputDirError


def sha256_of(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; results are for sharing
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json_atomic(path: Path, obj: Any) -> None:
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def ensure_writable_dir(path: Path, option: str = "--out") -> Path:
    """Create ``path`` if needed and check that files can be created in it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-check-")
        os.close(fd)
        os.unlink(probe)
    except (PermissionError, FileExistsError, NotADirectoryError, OSError) as exc:
        reason = exc.strerror or type(exc).__name__
        raise OutputDirError(
            f"cannot write to {option} {path}: {reason.lower()}; choose a writable directory with {option}"
        ) from None
    return path


@contextlib.contextmanager
def staged_directory(final: Path) -> Iterator[Path]:
    """Yield an empty staging directory next to ``final``; on success swap it into place.

    On any error (or Ctrl-C) the staging directory is removed and ``final`` is untouched,
    so a failed run never leaves something that looks like a good artifact. The swap
    renames within one filesystem: readers see the old directory or the new one.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.staging-"))
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    replace_directory(staging, final)


def replace_directory(new: Path, final: Path) -> None:
    old = None
    if final.exists():
        old = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.old-"))
        os.rmdir(old)
        os.replace(final, old)
    try:
        os.replace(new, final)
    except BaseException:
        if old is not None:
            os.replace(old, final)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    info.mode = 0o755 if info.isdir() else 0o644
    return info


COMPRESSORS = ("isal", "zlib")
TAR_COPY_BUFFER = 4 << 20  # tarfile's default 16 KiB chunks cost ISA-L more in call overhead than compressing
# Each TAR_COPY_BUFFER of a file's data that deflates by less than STORE_BELOW_RATIO is stored,
# not deflated: model weights deflate 1.08x (most of resnet50's ONNX file; 1.3x over the whole
# file, its batch-norm tensors compress well), and inflating them is most of a cold start's
# extraction: ISA-L inflates resnet50's deflated tarball in 365 ms and a stored one in 84 ms (2
# cores). Configurations, code, vocabularies and constant tensors deflate 3x and more and stay
# deflated. Stored blocks are plain deflate: every gzip reader (tar, SageMaker) reads the tarball.
STORE_BELOW_RATIO = 1.5
_CHUNK_MIN = 1 << 20  # writes this large are deflated, or stored, as gzip members of their own
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, mtime 0, OS unknown


def deterministic_tar_gz(src_dir: Path, arcname: str, dest: Path, compresslevel: int = 1,
                         compressor: str = "isal") -> None:
    """Tar ``src_dir`` as ``arcname/`` into ``dest`` (gzip), byte-identical for identical input.

    Level 1: float weights barely compress (resnet50: 7% smaller at level 9, 4x slower).
    """
    deterministic_tar_gz_dirs(((src_dir, arcname),), dest, compresslevel, compressor)


def deterministic_tar_gz_dirs(dirs: Sequence[tuple[Path, str]], dest: Path, compresslevel: int = 1,
                              compressor: str = "isal", store_incompressible: bool = True) -> None:
    """Tar each ``(src_dir, arcname)`` in order as ``arcname/`` into one ``dest`` (an ensemble and
    its steps), byte-identical for identical input.

    ``compressor``: ``isal`` (ISA-L's igzip through python-isal: the same gzip format any reader
    takes, about 10x faster than zlib at level 1 on model weights, and no larger) or ``zlib``
    (the standard library's, kept for comparison: ``make bench-package`` times both).
    ``store_incompressible``: parts of files that barely deflate (model weights; see
    STORE_BELOW_RATIO) go in stored deflate blocks, so that unpacking them costs a copy, not an
    inflate. The tarball is a series of gzip members (RFC 1952 2.2: a gzip file is a series of
    members; gzip, tar, Python and ISA-L read them as one stream).
    """
    if compressor not in COMPRESSORS:
        raise ValueError(f"unknown compressor {compressor!r}; one of {', '.join(COMPRESSORS)}")
    with open(dest, "wb") as raw:
        gz = _GzipMembers(raw, compresslevel, compressor, store_incompressible)
        with tarfile.TarFile(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT,  # type: ignore[arg-type]  # write-only
                             copybufsize=TAR_COPY_BUFFER) as tar:
            for src_dir, arcname in dirs:
                for entry in [src_dir] + sorted(src_dir.rglob("*")):
                    if entry.is_symlink():
                        raise OutputDirError(f"refusing to package symlink {entry}; copy the file instead")
                    name = arcname if entry == src_dir else f"{arcname}/{entry.relative_to(src_dir).as_posix()}"
                    tar.add(entry, arcname=name, recursive=False, filter=_normalise)
        gz.close()


class _GzipMembers:
    """A write-only file that gzips what is written to it as a series of gzip members. Small
    writes (tar headers, small files) are deflated together; each large write (a file's data,
    TAR_COPY_BUFFER at a time) is a member of its own, deflated, or stored when deflating it
    saves less than STORE_BELOW_RATIO (and ``store`` allows it)."""

    def __init__(self, raw: Any, level: int, compressor: str, store: bool) -> None:
        if gzip_backend(compressor) == "isal":
            from isal import isal_zlib

            self._zlib: Any = isal_zlib
            self._level = min(level, 3)
        else:
            self._zlib, self._level = zlib, level
        self._raw, self._store = raw, store
        self._small = bytearray()
        self._offset = 0

    def write(self, data: Any) -> int:
        size = len(data)
        self._offset += size
        if size < _CHUNK_MIN:
            self._small += data
            if len(self._small) >= TAR_COPY_BUFFER:
                self._flush_small()
            return size
        self._flush_small()
        self._member(bytes(data), may_store=self._store)
        return size

    def tell(self) -> int:
        return self._offset

    def close(self) -> None:
        self._flush_small()

    def _flush_small(self) -> None:
        if self._small:
            self._member(bytes(self._small), may_store=False)
            self._small.clear()

    def _member(self, data: bytes, may_store: bool) -> None:
        deflate = self._zlib.compressobj(self._level, zlib.DEFLATED, -zlib.MAX_WBITS)
        body = deflate.compress(data) + deflate.flush()
        if may_store and len(data) < STORE_BELOW_RATIO * len(body):
            stored = zlib.compressobj(0, zlib.DEFLATED, -zlib.MAX_WBITS)  # stored blocks: a copy to inflate
            body = stored.compress(data) + stored.flush()
        trailer = (self._zlib.crc32(data) & 0xFFFFFFFF).to_bytes(4, "little") + (len(data) & 0xFFFFFFFF).to_bytes(4, "little")
        self._raw.write(_GZIP_HEADER + body + trailer)


def gzip_backend(compressor: str = "isal") -> str:
    """The compressor ``compressor`` really gets here: ``isal`` where python-isal imports, else
    ``zlib``. ISA-L is an accelerator, not a requirement: a host without it (a bare GPU host the
    GPU check runs on) writes the same gzip format through the standard library, only slower
    (and, compressed by another library, with other bytes than an ISA-L host's)."""
    if compressor == "isal":
        try:
            import isal.igzip  # noqa: F401
        except ImportError:
            return "zlib"
    return compressor


def read_versioned_json(path: Path, version: int, *, missing: str, remedy: str) -> dict:
    """A schema-versioned JSON document; every problem is one MmeError line.

    ``missing``: the whole message when the file does not exist; ``remedy``: how to get a
    good file, appended to the other messages.
    """
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise MmeError(missing) from None
    except json.JSONDecodeError as exc:
        raise MmeError(f"{path} is not valid JSON ({exc.msg}); {remedy}") from None
    if not isinstance(data, dict) or data.get("schema_version") != version:
        found = data.get("schema_version") if isinstance(data, dict) else None
        raise MmeError(f"{path} has schema version {found}, this mme reads {version}; {remedy}")
    return data
