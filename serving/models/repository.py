"""A real-time endpoint's model, prepared as SageMaker prepares it: the one ``model.tar.gz``
unpacked into ``/opt/ml/model``'s stand-in, and the model serve's single-model mode loads
(``SAGEMAKER_TRITON_DEFAULT_MODEL_NAME``, or the only model directory). :func:`prepare_repository`
refuses, in one line, what serve would refuse; :mod:`serving.runtime.realtime` serves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from mme.archive import ArtifactError
from mme.errors import UsageError
from serving.models.extract import extract_model_tarball
from serving.triton.sagemaker_serve import DEFAULT_MODEL_ENV


@dataclass(frozen=True)
class RealTimeModel:
    """A model unpacked as SageMaker unpacks a real-time endpoint's ``model.tar.gz``."""

    tarball: Path
    repository: Path  # /opt/ml/model's stand-in: <repository>/<model>/config.pbtxt
    default_model: str  # what /invocations runs (SAGEMAKER_TRITON_DEFAULT_MODEL_NAME)
    models: tuple[str, ...]  # every model directory (an ensemble's steps too)


def find_tarball(models: str) -> Path:
    """The one ``model.tar.gz`` of a real-time endpoint: ``models`` itself, or the only
    ``*.tar.gz`` of an artifact directory."""
    if models.startswith("s3://"):
        raise UsageError(f"--mode single serves a local model: download {models} and pass the .tar.gz, or the "
                         "artifact directory made by 'mme package'")
    path = Path(models)
    if path.is_file():
        if not path.name.endswith(".tar.gz"):
            raise UsageError(f"{path} is not a .tar.gz; pass the model's tarball or its artifact directory")
        return path
    if not path.is_dir():
        raise UsageError(f"{path} does not exist; pass the model's .tar.gz or the artifact directory made by "
                         "'mme package'")
    tarballs = sorted(path.glob("*.tar.gz"))
    if len(tarballs) != 1:
        found = ", ".join(t.name for t in tarballs) or "none"
        raise UsageError(f"a real-time endpoint serves one model.tar.gz and {path} holds {len(tarballs)} ({found}); "
                         "pass one of them")
    return tarballs[0]


def prepare_repository(models: str, into: Path, env: Mapping[str, str]) -> RealTimeModel:
    """Unpack the model as SageMaker does and choose its default model as serve does (``env``:
    the container's SAGEMAKER_TRITON_* settings), or raise UsageError with what serve says."""
    tarball = find_tarball(models)
    repository = into / "model"
    try:
        extracted = extract_model_tarball(tarball, repository)
    except ArtifactError as exc:
        raise UsageError(f"cannot serve {tarball}: {exc}") from None
    if extracted.layout == "root-config":  # serve: "Incorrect directory structure"
        raise UsageError(f"{tarball} holds config.pbtxt at its top: SageMaker's Triton serve refuses it; package "
                         "<model>/config.pbtxt and <model>/1/ ('mme package' does)")
    named = env.get(DEFAULT_MODEL_ENV) or None
    if named is not None and named not in extracted.models:
        raise UsageError(f"{DEFAULT_MODEL_ENV}={named} names no model directory of {tarball.name} "
                         f"({', '.join(extracted.models)}); serve exits on it")
    # check_layout puts an ensemble first: the model serve needs named when there are several
    default = named or extracted.models[0]
    return RealTimeModel(tarball, repository, default, extracted.models)
