"""manifest.json: what an artifact is, how it was made and how to call it (schema-versioned).

One typed contract for the file: :class:`Manifest` and its frozen sub-records (their home is
:mod:`packager.manifest_records`), each with ``from_dict`` / ``to_dict``. ``to_dict`` writes
the same keys, nesting and order the file has always had, so manifests already on disk keep loading and new ones read the same.
:meth:`Manifest.load` is the one reader (schema-version check, one-line errors).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from mme.errors import MmeError
from mme.fsutil import read_versioned_json, write_json_atomic
from packager.manifest_records import (
    BuildDetails,
    FileEntry,
    ManifestFieldError,
    SampleRequest,
    Source,
    TensorEntry,
    TritonSettings,
    Validation,
    object_field,
    required_field,
)

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class Manifest:
    model: str  # the Triton model directory name
    requested_name: str
    format: str
    source: Source
    triton: TritonSettings
    tarball: str
    files: tuple[FileEntry, ...]
    parameters: int
    inputs: tuple[TensorEntry, ...]
    outputs: tuple[TensorEntry, ...]
    sample_request: SampleRequest
    versions: dict[str, str]  # tool -> version ("mme-toolkit", "python", "torch", "onnx", "tensorrt", ...)
    validation: Validation
    timings_s: dict[str, float]  # stage -> seconds
    created_at: str
    details: BuildDetails = field(default_factory=BuildDetails)
    schema_version: int = SCHEMA_VERSION

    @property
    def weights(self) -> str:
        return self.source.weights

    def to_dict(self) -> dict:
        return {
            "schema_version": self.schema_version,
            "model": self.model,
            "requested_name": self.requested_name,
            "format": self.format,
            "source": self.source.to_dict(),
            "triton": self.triton.to_dict(),
            "tarball": self.tarball,
            "files": [f.to_dict() for f in self.files],
            "parameters": self.parameters,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "sample_request": self.sample_request.to_dict(),
            "versions": dict(self.versions),
            "validation": self.validation.to_dict(),
            "timings_s": dict(self.timings_s),
            "created_at": self.created_at,
            "details": self.details.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Manifest":
        """From the JSON object; raises :class:`ManifestFieldError` naming a missing or bad field."""
        if not isinstance(data, Mapping):
            raise ManifestFieldError("the document is not an object")
        try:
            return cls(
                model=str(required_field(data, "model", "")),
                requested_name=str(data.get("requested_name") or data["model"]),
                format=str(required_field(data, "format", "")),
                source=Source.from_dict(required_field(data, "source", "")),
                triton=TritonSettings.from_dict(required_field(data, "triton", "")),
                tarball=str(required_field(data, "tarball", "")),
                files=tuple(FileEntry.from_dict(f) for f in required_field(data, "files", "")),
                parameters=int(data.get("parameters") or 0),
                inputs=tuple(TensorEntry.from_dict(t, "inputs[]") for t in required_field(data, "inputs", "")),
                outputs=tuple(TensorEntry.from_dict(t, "outputs[]") for t in required_field(data, "outputs", "")),
                sample_request=SampleRequest.from_dict(required_field(data, "sample_request", "")),
                versions={str(k): str(v) for k, v in object_field(data.get("versions"), "versions").items()},
                validation=Validation.from_dict(data.get("validation") or {"passed": None}),
                timings_s={str(k): float(v) for k, v in object_field(data.get("timings_s"), "timings_s").items()},
                created_at=str(data.get("created_at") or ""),
                details=BuildDetails.from_dict(data.get("details")),
                schema_version=int(data.get("schema_version", SCHEMA_VERSION)),
            )
        except (TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, ManifestFieldError):
                raise
            raise ManifestFieldError(f"a field has the wrong kind ({exc})") from None

    def write(self, directory: Path) -> Path:
        path = directory / MANIFEST_NAME
        write_json_atomic(path, self.to_dict())
        return path

    @classmethod
    def load(cls, directory: Path) -> "Manifest":
        """The manifest of an artifact directory (or the manifest.json file itself); every
        problem is one MmeError line."""
        directory = Path(directory)
        path = directory if directory.is_file() else directory / MANIFEST_NAME
        directory = path.parent
        data = read_versioned_json(
            path, SCHEMA_VERSION,
            missing=f"no {MANIFEST_NAME} in {directory}; point at an artifact directory made by 'mme package'",
            remedy="re-run 'mme package'",
        )
        try:
            return cls.from_dict(data)
        except ManifestFieldError as exc:
            raise MmeError(f"{path} is not a manifest this mme reads: {exc}; re-run 'mme package'") from None




def is_artifact_directory(path: Path) -> bool:
    """Whether ``path`` is an artifact directory (``artifacts/<model>/<format>`` as 'mme package'
    lays it out): the one check, it holds a manifest.json."""
    return (Path(path) / MANIFEST_NAME).is_file()


def artifact_directories(directory: Path) -> list[Path]:
    """The artifact directories at most two levels below ``directory`` (``artifacts/`` holds
    ``<model>/<format>``), for a message naming what to pass instead of their parent."""
    directory = Path(directory)
    found = [p for p in directory.glob("*") if is_artifact_directory(p)]
    found += [p for p in directory.glob("*/*") if is_artifact_directory(p)]
    return sorted(found)
