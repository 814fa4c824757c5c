"""The artifact's sample request at a larger batch: what ``mme capacity`` sends each copy to
measure it as it will be used (activations and arena allocations at the max batch size), not
only idle after its load.

The sample is the binary+json request ``mme package`` wrote (``sample_request.bin``: a JSON
header of ``binary_header_size`` bytes, then each input's raw tensor in order, batch 1).
Each input is repeated ``batch`` times along the batch axis; the header's shape and
``binary_data_size`` say so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mme.errors import MmeError

BINARY_CONTENT_TYPE = "application/vnd.sagemaker-triton.binary+json;json-header-size={size}"


@dataclass(frozen=True)
class BatchedRequest:
    body: bytes
    content_type: str
    batch: int


def batched_request(artifact_dir: Path, binary_file: str, header_size: int, batch: int) -> BatchedRequest:
    """The sample request of ``artifact_dir`` with every input repeated ``batch`` times."""
    path = artifact_dir / binary_file
    try:
        raw = path.read_bytes()
        header = json.loads(raw[:header_size])
    except (OSError, ValueError) as exc:
        raise MmeError(f"cannot read the sample request {path} ({exc}); package the model again") from None
    offset, tensors = header_size, []
    for entry in header.get("inputs", ()):
        size = int(entry["parameters"]["binary_data_size"])
        tensor = raw[offset:offset + size]
        offset += size
        if entry["shape"][0] != 1 or len(tensor) != size:
            raise MmeError(f"{path}: input {entry['name']} is not one batch-1 tensor; package the model again")
        entry["shape"][0] = batch
        entry["parameters"]["binary_data_size"] = size * batch
        tensors.append(tensor * batch)
    head = json.dumps(header, separators=(",", ":")).encode()
    return BatchedRequest(head + b"".join(tensors), BINARY_CONTENT_TYPE.format(size=len(head)), batch)


def json_request(artifact_dir: Path, json_file: str) -> BatchedRequest:
    """The artifact's KServe v2 JSON sample request (batch 1): what ``mme bench`` sends by default."""
    path = artifact_dir / json_file
    try:
        return BatchedRequest(path.read_bytes(), "application/json", 1)
    except OSError as exc:
        raise MmeError(f"cannot read the sample request {path} ({exc.strerror}); package the model again") from None
