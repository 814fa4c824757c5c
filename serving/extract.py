"""Verify and unpack an MME model tarball safely, the way SageMaker's front end prepares a model.

One streaming pass over the gzip stream: each member's header is checked before anything
is written (absolute paths, ``..``, links, devices, duplicates, size and count limits),
the data is written with tarfile's ``data`` filter, the rest of the gzip stream is read so
its CRC and length are verified, and the tarball's sha256 is computed on the way. Everything
goes into a staging directory next to the destination, which replaces the destination only
after the model layout was checked too, so a refused tarball never leaves anything behind.

Layout, as Triton's SageMaker front end reads the ``url`` of ``POST /models``
(``src/sagemaker_server.cc``): ``config.pbtxt`` at the root, or top-level model directories
each holding a ``config.pbtxt``: one, or several when exactly one is an ensemble (loaded
under the target name; the others are its steps). Triton accepts ``config.pbtxt`` at the
root only when the url matches ``/opt/ml/models/<hash>/model``; so that it loads from any
local path, such a tarball is placed one level down, in ``<dest>/model/`` (the directory
name SageMaker gives it), and ``dest`` then holds one model directory like any other.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import posixpath
import shutil
import tarfile
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from mme.errors import MmeError
from mme.fsutil import replace_directory
from packager.triton_config import ModelConfigError, read_config

if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2

GIB = 1024**3
CONFIG_NAME = "config.pbtxt"
ROOT_CONFIG_DIR = "model"  # SageMaker extracts to /opt/ml/models/<hash>/model


class ArtifactError(MmeError):
    """A model tarball was refused; nothing was extracted."""

    sagemaker_error = "ValidationError"
    retryable = False  # the tarball must be fixed (or the limit raised) first


class CorruptArtifact(ArtifactError):
    """Not a complete, valid gzip-compressed tar archive."""


class UnsafeArtifact(ArtifactError):
    """A member would write outside the model directory or create something other than files and directories."""


class ArtifactTooLarge(ArtifactError):
    """More bytes or members than the configured limits."""


class ExceedsDiskBudget(ArtifactTooLarge):
    """The files would pass the disk budget given to the extraction (the cache's disk limit, or the
    free space of its filesystem); extraction stopped there."""


@dataclass(frozen=True)
class DiskBudget:
    """At most ``bytes`` of file contents may be written; ``why`` says where the bound comes from
    and how to raise it, for the message (``"the disk limit (mme serve --disk-limit)"``)."""

    bytes: int
    why: str


class TooManyMembers(ArtifactTooLarge):
    """More members than ExtractLimits.max_members."""


class InvalidModelLayout(ArtifactError):
    """The archive does not hold a Triton model directory (config.pbtxt) the way the MME needs."""


@dataclass(frozen=True)
class ExtractLimits:
    # roberta-large fp32 ONNX is ~1.4 GB, and TensorRT plans or ensembles add more; 16 GiB
    # still stops a gzip bomb long before a disk fills.
    max_total_bytes: int = 16 * GIB
    max_members: int = 10_000
    allow_links: bool = False  # True: symlinks/hard links whose targets stay inside the model
    # A gzip bomb under the size cap (2.3 MB of zeros unpacking to 2.2 GiB) is stopped by the
    # ratio of declared to compressed bytes, read from each member's header before it is written.
    # Weights barely compress (1.05-1.1x); tokenizer files about 4x. Below the floor any ratio goes.
    max_ratio: float = 100.0
    ratio_floor_bytes: int = 64 * 2**20

    def __post_init__(self) -> None:
        if self.max_total_bytes < 1 or self.max_members < 1 or self.max_ratio <= 1:
            raise ValueError(f"ExtractLimits must be positive, got {self}")


@dataclass(frozen=True)
class ExtractedModel:
    root: Path  # the directory to pass as "url" to POST /models
    layout: str  # "model-dir", "ensemble" or "root-config" (moved into root/model)
    models: tuple[str, ...]  # top-level model directories; the first is loaded under the target name
    members: int
    total_bytes: int  # uncompressed bytes of regular files
    tarball_bytes: int
    sha256: str  # of the tarball
    seconds: float


class _HashingReader:
    """File wrapper that hashes and counts every byte read through it."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.digest = hashlib.sha256()
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.digest.update(data)
        self.count += len(data)
        return data

    def drain(self) -> None:
        while self.read(1 << 20):
            pass


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


def _unpack(tarball: Path, into: Path, limits: ExtractLimits, name: str,
            budget: DiskBudget | None = None) -> tuple[int, int, int, str]:
    """Stream-extract into ``into``; return (members, uncompressed file bytes, tarball bytes, sha256).
    ``name`` is how messages call the tarball (the object it came from). Every bound is checked
    from the member's header, before its data is written."""
    members = total = 0
    seen: dict[str, bool] = {".": True}  # normalised name -> is a directory
    compressed = max(1, tarball.stat().st_size)
    with open(tarball, "rb") as fh:
        if fh.read(2) != b"\x1f\x8b":
            raise CorruptArtifact(f"{name} is not gzip-compressed; an MME model must be a .tar.gz (tar -czf)")
        fh.seek(0)
        hashing = _HashingReader(fh)
        try:
            with gzip.GzipFile(fileobj=hashing, mode="rb") as gz:  # type: ignore[call-overload]  # duck-typed reader
                with tarfile.open(fileobj=gz, mode="r|") as tar:
                    for member in tar:
                        members += 1
                        if members > limits.max_members:
                            raise TooManyMembers(
                                f"{name} has more than {limits.max_members} members; raise max_members or package fewer files"
                            )
                        _check_member(member, seen, limits, name)
                        if member.isreg():
                            total += member.size
                            if total > limits.max_total_bytes:
                                raise ArtifactTooLarge(
                                    f"{name} unpacks to more than {limits.max_total_bytes:,} bytes; raise max_total_bytes if the model really is that large"
                                )
                            if budget is not None and total > budget.bytes:
                                raise ExceedsDiskBudget(
                                    f"{name} unpacks to more than the {budget.bytes:,} bytes {budget.why} leaves for it; "
                                    "extraction stopped there"
                                )
                            if total > limits.ratio_floor_bytes and total > limits.max_ratio * compressed:
                                raise ArtifactTooLarge(
                                    f"{name} would unpack {compressed:,} compressed bytes to more than {total:,} "
                                    f"({total / compressed:,.0f}x, the limit is {limits.max_ratio:g}x): a gzip bomb, "
                                    "or a model that compresses unusually well; raise max_ratio if you trust it"
                                )
                        tar.extract(member, path=into, filter="data")
                while gz.read(1 << 20):  # the rest of the gzip stream: verifies CRC and length
                    pass
            hashing.drain()
        except (tarfile.ReadError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise CorruptArtifact(f"{name} is truncated or corrupt ({exc}); re-upload or re-package it") from None
        except tarfile.FilterError as exc:
            raise UnsafeArtifact(f"{name}: {exc}; rebuild the tarball with plain files") from None
        except tarfile.TarError as exc:
            raise CorruptArtifact(f"{name} is not a valid tar archive ({exc}); re-package it") from None
    if members == 0:
        raise CorruptArtifact(f"{name} is an empty archive; package the model directory into it")
    return members, total, hashing.count, hashing.digest.hexdigest()


def read_model_config(path: Path, label: str = "") -> "model_config_pb2.ModelConfig":
    """Parse a config.pbtxt through packager.triton_config (Triton's own schema); ``label``
    names it in errors."""
    try:
        return read_config(path, label)
    except ModelConfigError as exc:
        raise InvalidModelLayout(f"{exc.where} is not a valid Triton model config ({exc.reason}); fix it and re-package") from None


def check_layout(root: Path, tarball_name: str = "tarball") -> tuple[str, tuple[str, ...]]:
    """Return (layout, model directories) for an extracted model, or raise InvalidModelLayout."""
    if (root / CONFIG_NAME).is_file():
        read_model_config(root / CONFIG_NAME, f"{tarball_name}: {CONFIG_NAME}")
        return "root-config", ()
    dirs = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.is_symlink())
    if not dirs:
        raise InvalidModelLayout(f"{tarball_name} holds no {CONFIG_NAME} and no model directory; package <model>/{CONFIG_NAME} and <model>/1/")
    configs = {}
    for d in dirs:
        path = root / d / CONFIG_NAME
        if not path.is_file():
            raise InvalidModelLayout(f"{tarball_name}: model directory {d}/ has no {CONFIG_NAME}; add one (see 'mme package')")
        configs[d] = read_model_config(path, f"{tarball_name}: {d}/{CONFIG_NAME}")
    if len(dirs) == 1:
        return "model-dir", (dirs[0],)
    ensembles = [d for d, c in configs.items() if c.platform == "ensemble"]
    if len(ensembles) != 1:
        raise InvalidModelLayout(
            f"{tarball_name} holds {len(dirs)} model directories ({', '.join(dirs)}) and {len(ensembles)} ensembles; "
            "an MME tarball holds one model, or one ensemble plus its steps"
        )
    ensemble = ensembles[0]
    missing = sorted({s.model_name for s in configs[ensemble].ensemble_scheduling.step} - set(dirs))
    if missing:
        raise InvalidModelLayout(f"{tarball_name}: ensemble {ensemble} uses {', '.join(missing)}, not in the tarball; package its steps with it")
    return "ensemble", (ensemble, *[d for d in dirs if d != ensemble])


def extract_model_tarball(tarball: Path, dest: Path, limits: ExtractLimits = ExtractLimits(), *,
                          name: str | None = None, budget: DiskBudget | None = None) -> ExtractedModel:
    """Verify ``tarball`` and unpack it to ``dest`` (replacing it), or raise an ArtifactError leaving
    ``dest`` as it was. ``name`` (default: the file's name) is how errors call it: the object it
    was downloaded from, e.g. ``s3://bucket/key``, not a temporary file. ``budget`` stops the
    extraction as soon as the files would pass it (ExceedsDiskBudget), before writing the rest."""
    start = time.perf_counter()
    tarball, dest = Path(tarball), Path(dest)
    name = name or tarball.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.extract-"))
    try:
        unpacked = staging / "unpacked"
        unpacked.mkdir()
        members, total, size, sha = _unpack(tarball, unpacked, limits, name, budget)
        layout, models = check_layout(unpacked, name)
        if layout == "root-config":
            wrapped = staging / "wrapped"
            wrapped.mkdir()
            os.replace(unpacked, wrapped / ROOT_CONFIG_DIR)
            unpacked, models = wrapped, (ROOT_CONFIG_DIR,)
        replace_directory(unpacked, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(staging)
    return ExtractedModel(dest, layout, models, members, total, size, sha, time.perf_counter() - start)
