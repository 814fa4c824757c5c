"""What ``mme serve`` and ``mme capacity`` check before anything starts, so a mistake gets
one line and exit code 2 instead of an endpoint that fails on its first request:

* a local source holds something to serve (``<name>.tar.gz`` files of its own; an S3 prefix
  may start empty, as a SageMaker MME's often does), and a
  directory above artifact directories (``artifacts/`` or ``artifacts/<model>/``) is
  answered with the artifact directories to pass instead;
* the chosen Triton can run the artifact's format, as its row of
  :data:`serving.triton.factory.SERVER_KINDS` says: the local kind (the nvidia-pytriton
  wheel's CPU tritonserver) has only the python backend, so it serves the ``cpu-local``
  format and nothing else.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mme.errors import UsageError
from packager.manifest import artifact_directories
from serving.triton.factory import ServerKind, backend_of, by_preference

if TYPE_CHECKING:
    from packager.manifest import Manifest
    from serving.models.store import ModelSource

MAX_SUGGESTIONS = 4


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


def check_server_runs(manifest: "Manifest | None", kind: ServerKind, artifact: str) -> None:
    """Refuse, naming the server kinds that can, an artifact the ``kind`` of Triton cannot load."""
    if manifest is None:
        return
    backend = backend_of(manifest.triton)
    if kind.runs(backend):
        return
    can = [k for k in by_preference() if k.runs(backend)]
    raise UsageError(
        f"{artifact} is the {manifest.format} format (Triton backend {backend}), which {kind.text} cannot load; "
        f"pass --server {' or --server '.join(k.name for k in can)} where {' or '.join(k.triton for k in can)} Triton "
        f"is available, or serve the cpu-local format on this host ('mme package {manifest.requested_name} --formats "
        "cpu-local')")
