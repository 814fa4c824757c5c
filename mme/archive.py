"""Unpack a ``.tar.gz`` safely: the one extractor every stage uses (a model tarball the local
MME serves, :mod:`serving.models.extract`; a SageMaker job's output pulled back,
:mod:`packager.remote.catalogue_jobs`).

One streaming pass over the gzip stream, decompressed by ISA-L on a thread of its own where
python-isal imports (``isal.igzip_threaded``: inflate overlaps parsing and writing; resnet50's
78 MB tarball unpacks in about 0.30 s against 0.55 s through the standard library's gzip), else by
zlib: each member's header is checked before anything
is written (absolute paths, ``..``, links, devices, duplicates, size and count limits, and the
ratio of declared to compressed bytes that gives a gzip bomb away), the data is written with
tarfile's ``data`` filter, the rest of the gzip stream is read so its CRC and length are
verified, and the tarball's sha256 is computed on the way. A refused archive raises an
:class:`ArtifactError` as soon as its header is read; callers unpack into a staging directory
of their own so that nothing of it is left behind.
"""

from __future__ import annotations

import gzip
import hashlib
import posixpath
import tarfile
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from mme.errors import MmeError
from mme.fsutil import TAR_COPY_BUFFER, gzip_backend

GIB = 1024**3


class ArtifactError(MmeError):
    """A tarball was refused; nothing was extracted."""

    sagemaker_error = "ValidationError"  # how SageMaker answers a request for a model it refuses
    retryable = False  # the tarball must be fixed (or the limit raised) first


class CorruptArtifact(ArtifactError):
    """Not a complete, valid gzip-compressed tar archive."""


class UnsafeArtifact(ArtifactError):
    """A member would write outside the destination or create something other than files and directories."""


class ArtifactTooLarge(ArtifactError):
    """More bytes or members than the configured limits."""


class ExceedsDiskBudget(ArtifactTooLarge):
    """The files would pass the disk budget given to the extraction (the cache's disk limit, or the
    free space of its filesystem); extraction stopped there."""


class TooManyMembers(ArtifactTooLarge):
    """More members than ExtractLimits.max_members."""


@dataclass(frozen=True)
class DiskBudget:
    """At most ``bytes`` of file contents may be written; ``why`` says where the bound comes from
    and how to raise it, for the message (``"the disk limit (mme serve --disk-limit)"``)."""

    bytes: int
    why: str


@dataclass(frozen=True)
class ExtractLimits:
    # roberta-large fp32 ONNX is ~1.4 GB, and TensorRT plans or ensembles add more; 16 GiB
    # still stops a gzip bomb long before a disk fills.
    max_total_bytes: int = 16 * GIB
    max_members: int = 10_000
    allow_links: bool = False  # True: symlinks/hard links whose targets stay inside the archive
    # A gzip bomb under the size cap (2.3 MB of zeros unpacking to 2.2 GiB) is stopped by the
    # ratio of declared to compressed bytes, read from each member's header before it is written.
    # Weights barely compress (1.05-1.1x); tokenizer files about 4x. Below the floor any ratio goes.
    max_ratio: float = 100.0
    ratio_floor_bytes: int = 64 * 2**20

    def __post_init__(self) -> None:
        if self.max_total_bytes < 1 or self.max_members < 1 or self.max_ratio <= 1:
            raise ValueError(f"ExtractLimits must be positive, got {self}")

    def times(self, n: int) -> "ExtractLimits":
        """These limits for an archive holding ``n`` such archives' worth (a job's output of n models)."""
        n = max(1, n)
        return ExtractLimits(self.max_total_bytes * n, self.max_members * n, self.allow_links, self.max_ratio,
                             self.ratio_floor_bytes)


@dataclass(frozen=True)
class Unpacked:
    members: int
    total_bytes: int  # uncompressed bytes of regular files
    tarball_bytes: int
    sha256: str  # of the tarball


class Stream(Protocol):
    """What :func:`safe_extract` reads a tarball through: an open file, or a download as it arrives."""

    def read(self, size: int = -1, /) -> bytes: ...


class _HashingReader:
    """File wrapper that counts every byte read through it and hashes them on a thread of its own
    (sha256 of a 100 MB tarball is 50-65 ms, which would otherwise stall the inflater reading
    through this). ``head`` is given back first: bytes already read from ``raw`` (the magic)."""

    def __init__(self, raw: Stream, head: bytes = b"") -> None:
        self._raw = raw
        self._head = head
        self._digest = hashlib.sha256()
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="mme-sha256")  # one thread: updates in order
        self._last: Future | None = None
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        if self._head:
            data, self._head = (self._head, b"") if size < 0 or size >= len(self._head) else \
                (self._head[:size], self._head[size:])
        else:
            data = self._raw.read(size)
        if data:
            self._last = self._hasher.submit(self._digest.update, data)
            self.count += len(data)
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    def drain(self) -> None:
        while self.read(1 << 20):
            pass

    def hexdigest(self) -> str:
        if self._last is not None:
            self._last.result()
        return self._digest.hexdigest()

    def close(self) -> None:
        self._hasher.shutdown(wait=True, cancel_futures=True)


def _check_member(member: tarfile.TarInfo, seen: dict[str, bool], limits: ExtractLimits, name: str) -> str:
    """Return the member's normalised path or raise; called before the member is written."""
    raw = member.name
    if raw.startswith("/"):
        raise UnsafeArtifact(f"{name}: member {raw!r} has an absolute path; tar the model with relative paths (tar -C dir -czf ...)")
    norm = posixpath.normpath(raw)
    if norm == ".." or norm.startswith("../") or ".." in raw.split("/"):
        raise UnsafeArtifact(f"{name}: member {raw!r} has a '..' path segment; tar the model with plain relative paths")
    if "\x00" in raw:
        raise UnsafeArtifact(f"{name}: member {raw!r} has a NUL character in its name; rebuild the tarball")
    if member.issym() or member.islnk():
        kind = "symlink" if member.issym() else "hard link"
        if not limits.allow_links:
            raise UnsafeArtifact(f"{name}: member {raw!r} is a {kind} to {member.linkname!r}; replace links with the files themselves")
        base = posixpath.dirname(norm) if member.issym() else ""
        target = posixpath.normpath(posixpath.join(base, member.linkname))
        if member.linkname.startswith("/") or target == ".." or target.startswith("../"):
            raise UnsafeArtifact(f"{name}: {kind} {raw!r} points outside the model ({member.linkname!r}); replace it with the file")
    elif member.isreg():
        if member.issparse():
            raise UnsafeArtifact(f"{name}: member {raw!r} is a sparse file; rebuild the tarball without --sparse")
    elif not member.isdir():
        raise UnsafeArtifact(f"{name}: member {raw!r} is a device, FIFO or other special file; only files and directories are allowed")
    parts = norm.split("/")
    for i in range(1, len(parts)):
        if seen.get("/".join(parts[:i])) is False:
            raise UnsafeArtifact(f"{name}: member {raw!r} is inside {'/'.join(parts[:i])!r}, which is not a directory; rebuild the tarball")
    if norm in seen and not (seen[norm] and member.isdir()):
        raise UnsafeArtifact(f"{name}: member {raw!r} appears twice; rebuild the tarball")
    seen[norm] = member.isdir()
    return norm


def _check_size(total: int, compressed: int, limits: ExtractLimits, name: str, budget: DiskBudget | None) -> None:
    """Raise when ``total`` file bytes so far pass a limit, the budget, or the bomb ratio."""
    if total > limits.max_total_bytes:
        raise ArtifactTooLarge(
            f"{name} unpacks to more than {limits.max_total_bytes:,} bytes; raise max_total_bytes if the model really is that large"
        )
    if budget is not None and total > budget.bytes:
        raise ExceedsDiskBudget(
            f"{name} unpacks to more than the {budget.bytes:,} bytes {budget.why} leaves for it; extraction stopped there"
        )
    if total > limits.ratio_floor_bytes and total > limits.max_ratio * compressed:
        raise ArtifactTooLarge(
            f"{name} would unpack {compressed:,} compressed bytes to more than {total:,} "
            f"({total / compressed:,.0f}x, the limit is {limits.max_ratio:g}x): a gzip bomb, "
            "or a model that compresses unusually well; raise max_ratio if you trust it"
        )


def _gzip_reader(raw: BinaryIO) -> BinaryIO:
    """A decompressing reader over ``raw``: ISA-L's inflate on a thread of its own, else zlib's."""
    if gzip_backend("isal") == "isal":
        from isal import igzip_threaded

        return igzip_threaded.open(raw, "rb", threads=1)
    return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]


def prepare_reader() -> None:
    """Import the inflater now (ISA-L's threaded reader: 8 ms), so the first cold start does not."""
    if gzip_backend("isal") == "isal":
        from isal import igzip_threaded  # noqa: F401


def _decompression_errors() -> tuple[type[BaseException], ...]:
    errors: tuple[type[BaseException], ...] = (tarfile.ReadError, EOFError, gzip.BadGzipFile, zlib.error)
    if gzip_backend("isal") == "isal":
        from isal import isal_zlib

        errors += (isal_zlib.error,)  # type: ignore[operator]
    return errors


def safe_extract(tarball: Path | Stream, into: Path, limits: ExtractLimits = ExtractLimits(), *,
                 name: str | None = None, budget: DiskBudget | None = None, size: int | None = None) -> Unpacked:
    """Stream-extract ``tarball`` into the directory ``into``, or raise an :class:`ArtifactError`.

    ``tarball`` is a file, or a stream read once to its end (an object being downloaded: the
    download feeds the inflater, nothing is written to disk first; its ``size`` in bytes, for
    the bomb ratio). ``name`` (default: the file's name) is how messages call the tarball (the
    object it came from). Every bound is checked from the member's header, before its data is
    written; ``budget`` stops the extraction as soon as the files would pass it (ExceedsDiskBudget).
    An exception the stream raises (a source that failed or changed while it was read) goes
    through unchanged."""
    if isinstance(tarball, (str, Path)):
        path = Path(tarball)
        with open(path, "rb") as fh:
            return safe_extract(fh, into, limits, name=name or path.name, budget=budget, size=path.stat().st_size)
    name = name or "tarball"
    members = total = 0
    seen: dict[str, bool] = {".": True}  # normalised name -> is a directory
    magic = tarball.read(2)
    if magic != b"\x1f\x8b":
        raise CorruptArtifact(f"{name} is not gzip-compressed; an MME model must be a .tar.gz (tar -czf)")
    hashing = _HashingReader(tarball, magic)
    try:
        with _gzip_reader(hashing) as gz:  # type: ignore[arg-type]  # duck-typed reader
            with tarfile.open(fileobj=gz, mode="r|", copybufsize=TAR_COPY_BUFFER) as tar:  # type: ignore[call-overload]
                for member in tar:
                    members += 1
                    if members > limits.max_members:
                        raise TooManyMembers(
                            f"{name} has more than {limits.max_members} members; raise max_members or package fewer files"
                        )
                    _check_member(member, seen, limits, name)
                    if member.isreg():
                        total += member.size
                        _check_size(total, max(1, size or hashing.count), limits, name, budget)
                    tar.extract(member, path=into, filter="data")
            while gz.read(1 << 20):  # the rest of the gzip stream: verifies CRC and length
                pass
        hashing.drain()
        digest = hashing.hexdigest()
    except _decompression_errors() as exc:
        raise CorruptArtifact(f"{name} is truncated or corrupt ({exc}); re-upload or re-package it") from None
    except tarfile.FilterError as exc:
        raise UnsafeArtifact(f"{name}: {exc}; rebuild the tarball with plain files") from None
    except tarfile.TarError as exc:
        raise CorruptArtifact(f"{name} is not a valid tar archive ({exc}); re-package it") from None
    finally:
        hashing.close()
    if members == 0:
        raise CorruptArtifact(f"{name} is an empty archive; package the model directory into it")
    return Unpacked(members, total, hashing.count, digest)
