"""manifest.json: what an artifact is, how it was made and how to call it (schema-versioned)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mme.fsutil import read_versioned_json, write_json_atomic

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the artifact directory
    sha256: str
    bytes: int


@dataclass(frozen=True)
class SampleRequest:
    json_file: str  # KServe v2 JSON body (Content-Type application/json)
    binary_file: str  # binary+json body
    binary_header_size: int

    @property
    def binary_content_type(self) -> str:
        return f"application/vnd.sagemaker-triton.binary+json;json-header-size={self.binary_header_size}"


@dataclass(frozen=True)
class Manifest:
    model: str  # the Triton model directory name
    requested_name: str
    format: str
    source: dict[str, Any]  # family, weights (pretrained|random|local), weights_path, details
    triton: dict[str, Any]  # platform/backend, max_batch_size, instance kind, target container
    tarball: str
    files: tuple[FileEntry, ...]
    parameters: int
    inputs: tuple[dict, ...]
    outputs: tuple[dict, ...]
    sample_request: SampleRequest
    versions: dict[str, str]
    validation: dict[str, Any]
    timings_s: dict[str, float]
    created_at: str
    details: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    @property
    def weights(self) -> str:
        return self.source["weights"]

    def to_dict(self) -> dict:
        data = asdict(self)
        data["sample_request"]["binary_content_type"] = self.sample_request.binary_content_type
        return {"schema_version": data.pop("schema_version"), **data}

    def write(self, directory: Path) -> Path:
        path = directory / MANIFEST_NAME
        write_json_atomic(path, self.to_dict())
        return path

    @classmethod
    def load(cls, directory: Path) -> "Manifest":
        data = read_versioned_json(
            directory / MANIFEST_NAME, SCHEMA_VERSION,
            missing=f"no {MANIFEST_NAME} in {directory}; point at an artifact directory made by 'mme package'",
            remedy="re-run 'mme package'",
        )
        data.pop("schema_version")
        sample = data.pop("sample_request")
        sample.pop("binary_content_type", None)
        return cls(
            files=tuple(FileEntry(**f) for f in data.pop("files")),
            inputs=tuple(data.pop("inputs")),
            outputs=tuple(data.pop("outputs")),
            sample_request=SampleRequest(**sample),
            **data,
        )
