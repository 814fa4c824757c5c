"""What ``mme serve`` and ``mme capacity`` check before anything starts, so a mistake gets
one line and exit code 2 instead of an endpoint that fails on its first request:

* a local source holds something to serve (``<name>.tar.gz`` files of its own; an S3 prefix
  may start empty, as a SageMaker MME's often does), and a
  directory above artifact directories (``artifacts/`` or ``artifacts/<model>/``) is
  answered with the artifact directories to pass instead;
* the chosen Triton can run the artifact's format: the local kind (the nvidia-pytriton
  wheel's CPU tritonserver) has only the python backend, so it serves the ``cpu-local``
  format and nothing else.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mme.errors import UsageError

if TYPE_CHECKING:
    from packager.manifest import Manifest
    from serving.store import ModelSource

MAX_SUGGESTIONS = 4
# Triton platform -> the backend that runs it
PLATFORM_BACKENDS = {"onnxruntime_onnx": "onnxruntime", "tensorrt_plan": "tensorrt", "pytorch_libtorch": "pytorch",
                     "tensorflow_savedmodel": "tensorflow", "tensorflow_graphdef": "tensorflow"}
# server kind -> the backends its tritonserver has (None: all of Triton's, as SageMaker's image)
KIND_BACKENDS: dict[str, frozenset[str] | None] = {"local": frozenset({"python"}), "system": None, "docker": None}
KIND_TEXT = {"local": "the local server (the nvidia-pytriton wheel's CPU tritonserver, python backend only)",
             "system": "the system server (SageMaker's Triton image)", "docker": "the docker server (NVIDIA's image)"}


def artifact_directories(directory: Path) -> list[Path]:
    """Artifact directories (holding manifest.json) at most two levels below ``directory``."""
    from packager.manifest import MANIFEST_NAME

    found = [p.parent for p in directory.glob(f"*/{MANIFEST_NAME}")]
    found += [p.parent for p in directory.glob(f"*/*/{MANIFEST_NAME}")]
    return sorted(found)


def _suggest(found: list[Path]) -> str:
    shown = " or ".join(f"--models {p}" for p in found[:MAX_SUGGESTIONS])
    more = f" ({len(found) - MAX_SUGGESTIONS} more)" if len(found) > MAX_SUGGESTIONS else ""
    return shown + more


def tarball_targets(source: "ModelSource") -> tuple[str, ...]:
    """The TargetModel names ``source`` answers for with a model: its .tar.gz objects, copies included."""
    return tuple(info.target for info in source.list_targets() if info.target.endswith(".tar.gz"))


def served_targets(source: "ModelSource", models: str) -> tuple[str, ...]:
    """:func:`tarball_targets`, after checking there is something to serve. Raises
    UsageError saying what to pass instead."""
    targets = tarball_targets(source)
    local = not models.startswith("s3://")
    if local and not any("/" not in t for t in targets):
        found = artifact_directories(Path(models.removeprefix("file://")))
        if found:
            raise UsageError(f"{models} holds no .tar.gz of its own: it is above the artifact directories; pass "
                             f"{_suggest(found)}")
    if not targets and local:
        raise UsageError(f"{models} holds no <name>.tar.gz to serve; package one ('mme package MODEL') and pass "
                         "--models artifacts/<model>/<format>")
    # An empty S3 prefix is how many multi-model endpoints start: objects put there later are
    # served on their first request (the caller says so).
    return targets


def backend_of(manifest: "Manifest") -> str | None:
    """The Triton backend that runs the artifact (its config's backend, or its platform's)."""
    triton = manifest.triton
    if triton.backend:
        return triton.backend
    return PLATFORM_BACKENDS.get(triton.platform or "", triton.platform)


def check_server_runs(manifest: "Manifest | None", kind: str, artifact: str) -> None:
    """Refuse, naming a server kind that can, an artifact the ``kind`` of Triton cannot load."""
    if manifest is None:
        return
    have = KIND_BACKENDS.get(kind)
    backend = backend_of(manifest)
    if have is None or backend is None or backend in have:
        return
    can = [k for k, backends in KIND_BACKENDS.items() if backends is None or backend in backends]
    raise UsageError(
        f"{artifact} is the {manifest.format} format (Triton backend {backend}), which {KIND_TEXT[kind]} cannot load; "
        f"pass --server {' or --server '.join(can)} where SageMaker's or NVIDIA's Triton is available, or serve the "
        f"cpu-local format on this host ('mme package {manifest.requested_name} --formats cpu-local')")
