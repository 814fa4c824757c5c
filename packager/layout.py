"""Triton model directory, MME tarball and sample requests for one exported format.

Per format, under ``artifacts/<model>/<format>/``::

    <name>/config.pbtxt          Triton model configuration
    <name>/1/model.<ext>         the exported model (plus model.py for cpu-local)
    <name>.tar.gz                the MME tarball: one model directory, as SageMaker's
                                 Triton container loads it (POST /models with its URL)
    sample_request.json          KServe v2 JSON request for benchmarking
    sample_request.bin           the same request as binary+json
    manifest.json
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mme.fsutil import deterministic_tar_gz_dirs, sha256_of, write_bytes_atomic
from packager.formats.base import ExportedModel
from packager.manifest_records import FileEntry, SampleRequest
from packager.model import LoadedModel
from packager.spec import IOSpec, TensorSpec
from packager.triton_config import write_config

VERSION = "1"


@dataclass(frozen=True)
class Served:
    """What an artifact's Triton model takes and returns, as the manifest records it: ``spec``'s
    tensors by the names ``exported`` gives them, and the sample request written for it."""

    spec: IOSpec
    exported: ExportedModel
    sample: SampleRequest


def place_file(src: Path, dest: Path) -> None:
    """Hard-link when possible (same filesystem, no copy of a large model), else copy."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def write_model_directory(root: Path, name: str, exported: ExportedModel, config) -> Path:
    model_dir = root / name
    (model_dir / VERSION).mkdir(parents=True)
    write_config(config, model_dir / "config.pbtxt")
    for file_name, src in exported.files.items():
        place_file(src, model_dir / VERSION / file_name)
    return model_dir


def write_tarball(root: Path, name: str, steps: tuple[str, ...] = ()) -> Path:
    """``<name>.tar.gz``: the model directory ``name`` (an ensemble: then its ``steps`` after it)."""
    tarball = root / f"{name}.tar.gz"
    deterministic_tar_gz_dirs([(root / d, d) for d in (name, *steps)], tarball)
    return tarball


def write_sample_request(root: Path, model: LoadedModel, exported: ExportedModel) -> SampleRequest:
    """The sample request of ``model``'s own inputs (batch 1), named as ``exported`` names them."""
    arrays = model.make_inputs(1, model.spec.axes, 7)
    return write_sample_arrays(root, [(t, arrays[s.name]) for s, t in zip(model.spec.inputs, exported.inputs)],
                               exported)


def write_sample_arrays(root: Path, inputs: list[tuple[TensorSpec, np.ndarray]], exported: ExportedModel) -> SampleRequest:
    """sample_request.json and .bin asking ``exported``'s outputs for these input arrays (batch 1)."""
    import tritonclient.http as triton_http

    def body(binary: bool) -> tuple[bytes, int | None]:
        entries = []
        for tensor, value in inputs:
            if not binary and value.dtype.kind == "f":
                value = np.round(value, 5)  # shorter JSON, same dtype
            entry = triton_http.InferInput(tensor.name, list(value.shape), tensor.kserve_datatype)
            entry.set_data_from_numpy(value, binary_data=binary)
            entries.append(entry)
        outputs = [triton_http.InferRequestedOutput(t.name, binary_data=binary) for t in exported.outputs]
        return triton_http.InferenceServerClient.generate_request_body(entries, outputs=outputs)

    json_body, _ = body(False)
    binary_body, header_size = body(True)
    assert header_size is not None  # a binary body always has a JSON header
    write_bytes_atomic(root / "sample_request.json", json_body)
    write_bytes_atomic(root / "sample_request.bin", binary_body)
    return SampleRequest("sample_request.json", "sample_request.bin", int(header_size))


def file_entries(root: Path) -> tuple[FileEntry, ...]:
    entries = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        entries.append(FileEntry(path.relative_to(root).as_posix(), sha256_of(path), path.stat().st_size))
    return tuple(entries)
