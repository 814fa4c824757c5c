"""Step 5's parts: a python-backend copy of a TorchScript artifact that runs it with PyTorch
on CUDA (the nvidia-pytriton wheel's tritonserver has the python backend only), laid out
like ``mme package`` output so ``mme capacity`` can size it, and one copy of it served by
that Triton through the local MME's container API and compared with PyTorch.

The Triton model itself is :mod:`bench.gpu_check.torchscript_cuda_model` (copied into the
model directory as ``model.py``; it runs inside Triton, not here).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from mme.fsutil import deterministic_tar_gz
from packager.layout import file_entries
from packager.manifest import Manifest
from packager.manifest_records import Validation
from packager.triton_config import read_config, write_config
from serving.models.store import LocalDirSource
from serving.stack import build_stack
from serving.triton.netns import namespace_support

PYTHON_MODEL = Path(__file__).with_name("torchscript_cuda_model.py")


@dataclass(frozen=True)
class OneCopy:
    load_s: float
    output_shape: list[int]
    max_abs_diff_vs_pytorch: float


def gpu_python_model(torchscript: Path, out: Path, device: str = "cuda") -> Path:
    """The python-backend artifact (model directory, tarball, manifest) under ``out``."""

    manifest = Manifest.load(torchscript)
    name = manifest.model
    artifact = out / "torchscript-cuda-python"
    model_dir = artifact / name
    (model_dir / "1").mkdir(parents=True)
    config = read_config(torchscript / name / "config.pbtxt")
    config.ClearField("platform")
    config.backend = "python"
    for group in config.instance_group:  # the model puts itself on the GPU
        group.kind = type(group).Kind.Value("KIND_CPU")
    config.parameters["device"].string_value = device
    config.parameters["tf32"].string_value = "false"  # fp32 math: its outputs are compared with PyTorch's on the CPU
    write_config(config, model_dir / "config.pbtxt")
    shutil.copyfile(torchscript / name / "1" / "model.pt", model_dir / "1" / "model.pt")
    shutil.copyfile(PYTHON_MODEL, model_dir / "1" / "model.py")
    sample = manifest.sample_request
    for sample_file in (sample.json_file, sample.binary_file):
        if (torchscript / sample_file).is_file():
            shutil.copyfile(torchscript / sample_file, artifact / sample_file)
    tarball = artifact / f"{name}.tar.gz"
    deterministic_tar_gz(model_dir, name, tarball)
    replace(
        manifest, format="torchscript-cuda-python", tarball=tarball.name, files=file_entries(artifact),
        triton=replace(manifest.triton, platform=None, backend="python", instance_kind="KIND_GPU",
                       max_batch_size=config.max_batch_size),
        validation=Validation(passed=None, skipped="a python-backend copy of the torchscript artifact for the GPU "
                              "check, which compares its outputs with PyTorch itself"),
    ).write(artifact)
    return artifact


def kserve_json(name: str, array) -> bytes:
    """A KServe v2 JSON request with one FP32 input."""
    return json.dumps({"inputs": [{"name": name, "shape": list(array.shape), "datatype": "FP32",
                                   "data": array.ravel().tolist()}]}).encode()


COPY_LOAD_TIMEOUT_S = 120.0  # one python-backend copy: a stub process importing torch, the model on the GPU


def triton_serves_a_gpu_copy(artifact: Path, torchscript: Path, *, load_timeout_s: float = COPY_LOAD_TIMEOUT_S) -> OneCopy:
    """One copy loaded into the wheel's Triton the way the local MME loads it (on the device
    the artifact's ``device`` parameter names), invoked, and compared with PyTorch on the CPU
    (fp32 on both sides). The reference runs on the CPU so that this process holds no CUDA
    context while Triton's copies are counted."""
    import torch

    manifest = Manifest.load(artifact)
    # Isolated where this host allows network namespaces; a lent GPU machine that does not
    # (a container) has no network to expose Triton to.
    network = "private" if namespace_support().available else "host"
    with build_stack("local", LocalDirSource(artifact), network=network, prefix="mme-gpu-check-cache-") as stack:
        cache, server = stack.cache, stack.server
        with server:
            cached = cache.fetch(manifest.tarball)
            started = time.perf_counter()
            with stack.client(timeout_s=120, load_timeout_s=load_timeout_s) as control:
                control.load(cached.container_name, server.model_url(cached.model_dir), target=manifest.tarball)
                load_s = time.perf_counter() - started
                x = np.random.default_rng(0).standard_normal((2, *manifest.inputs[0].dims), dtype=np.float32)
                reply = control.invoke(cached.container_name, kserve_json(manifest.inputs[0].name, x),
                                       "application/json", target=manifest.tarball)
        if reply.status != 200:
            raise RuntimeError(f"invoke answered {reply.status}: {reply.body[:300]!r}")
        out = reply.json()["outputs"][0]
        got = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    module = torch.jit.load(str(torchscript / manifest.model / "1" / "model.pt"), map_location="cpu").eval()
    with torch.inference_mode():
        want = module(torch.from_numpy(x)).float().numpy()
    return OneCopy(round(load_s, 2), list(got.shape), float(np.max(np.abs(got - want))))
