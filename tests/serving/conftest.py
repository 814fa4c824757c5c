"""Fixtures for the serving tests: timm's tiny test_resnet packaged once (cpu-local), and
helpers to read its sample requests and run its ONNX file directly."""

from __future__ import annotations

import json

import numpy as np


STARTUP_TIMEOUT_S = 60.0


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
