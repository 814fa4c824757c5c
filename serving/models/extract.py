"""Verify and unpack an MME model tarball safely, the way SageMaker's front end prepares a model.

The archive is unpacked by :func:`mme.archive.safe_extract` (every member's header checked
before it is written; size, count and gzip-bomb limits; CRC and sha256). Everything goes into
a staging directory next to the destination, which replaces the destination only after the
model layout was checked too, so a refused tarball never leaves anything behind.

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
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mme.archive import ArtifactError, DiskBudget, ExtractLimits, Stream, safe_extract
from mme.fsutil import replace_directory
from packager.triton_config import ModelConfigError, read_config

if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2

CONFIG_NAME = "config.pbtxt"
ROOT_CONFIG_DIR = "model"  # SageMaker extracts to /opt/ml/models/<hash>/model


class InvalidModelLayout(ArtifactError):
    """The archive does not hold a Triton model directory (config.pbtxt) the way the MME needs."""


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


def extract_model_tarball(tarball: Path | Stream, dest: Path, limits: ExtractLimits = ExtractLimits(), *,
                          name: str | None = None, budget: DiskBudget | None = None,
                          size: int | None = None) -> ExtractedModel:
    """Verify ``tarball`` and unpack it to ``dest`` (replacing it), or raise an ArtifactError leaving
    ``dest`` as it was. ``tarball`` is a file or a stream read once as it arrives (a download, of
    ``size`` bytes). ``name`` (default: the file's name) is how errors call it: the object it
    was downloaded from, e.g. ``s3://bucket/key``, not a temporary file. ``budget`` stops the
    extraction as soon as the files would pass it (ExceedsDiskBudget), before writing the rest."""
    start = time.perf_counter()
    dest = Path(dest)
    if isinstance(tarball, (str, Path)):
        tarball = Path(tarball)
        name = name or tarball.name
    name = name or "tarball"
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.extract-"))
    try:
        unpacked = staging / "unpacked"
        unpacked.mkdir()
        done = safe_extract(tarball, unpacked, limits, name=name, budget=budget, size=size)
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
    return ExtractedModel(dest, layout, models, done.members, done.total_bytes, done.tarball_bytes, done.sha256,
                          time.perf_counter() - start)
