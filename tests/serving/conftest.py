"""Fixtures for the serving tests: timm's tiny test_resnet packaged once (cpu-local), and
helpers to read its sample requests and run its ONNX file directly."""

from __future__ import annotations

import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from packager.manifest import Manifest

STARTUP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class PackagedModel:
    directory: Path  # artifacts/test_resnet/cpu-local
    manifest: Manifest

    @property
    def tarball(self) -> Path:
        return self.directory / self.manifest.tarball

    @property
    def onnx_file(self) -> Path:
        return self.directory / self.manifest.model / "1" / "model.onnx"

    @property
    def binary_content_type(self) -> str:
        return self.manifest.sample_request.binary_content_type

    def sample(self, kind: str) -> bytes:
        request = self.manifest.sample_request
        name = {"json": request.json_file, "binary": request.binary_file}[kind]
        return (self.directory / name).read_bytes()

    def extract(self, destination: Path) -> Path:
        """The tarball unpacked into ``destination`` (one model directory inside), as SageMaker does."""
        destination.mkdir(parents=True, exist_ok=True)
        with tarfile.open(self.tarball) as tar:
            tar.extractall(destination, filter="data")
        return destination


@pytest.fixture(scope="session")
def packaged_test_resnet(test_resnet_cpu_local) -> PackagedModel:
    directory, _ = test_resnet_cpu_local
    return PackagedModel(directory, Manifest.load(directory))


_NUMPY_DTYPES = {"FP32": np.float32, "FP16": np.float16, "INT64": np.int64, "INT32": np.int32}


def decode_kserve(body: bytes, header_size: int | None) -> dict[str, np.ndarray]:
    """Tensors of a KServe v2 request or response body (JSON, or binary+json when header_size is set)."""
    header = json.loads(body[:header_size] if header_size is not None else body)
    entries = header.get("inputs") or header.get("outputs")
    tensors: dict[str, np.ndarray] = {}
    offset = header_size or 0
    for entry in entries:
        dtype = _NUMPY_DTYPES[entry["datatype"]]
        size = entry.get("parameters", {}).get("binary_data_size")
        if size is not None:
            array = np.frombuffer(body[offset:offset + size], dtype=dtype)
            offset += size
        else:
            array = np.asarray(entry["data"], dtype=dtype)
        tensors[entry["name"]] = array.reshape(entry["shape"])
    return tensors


def header_size_of(content_type: str) -> int | None:
    marker = "json-header-size="
    return int(content_type.split(marker, 1)[1]) if marker in content_type else None
