"""Running a packaged model on CUDA (or the CPU for the dry run) and timing it.

TorchScript through ``torch.jit.load``, TensorRT plans through the TensorRT runtime with
torch-allocated buffers; :func:`latency` times either at each batch size and reports
percentiles as ``mme report`` computes them (:func:`mme.stats.percentile`).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

RunOnce = Callable[[int], Any]  # runs one inference at the given batch size


@dataclass(frozen=True)
class ModelInputs:
    """An artifact's inputs: shapes without the batch axis (dynamic axes at their maximum)."""

    shapes: list[tuple[int, ...]]
    dtypes: list[str]  # "float32" | "int64"


@dataclass(frozen=True)
class BatchLatency:
    p50_ms: float
    p90_ms: float
    p99_ms: float
    items_per_s: float


def manifest_inputs(directory: Path) -> ModelInputs:
    """Input shapes and dtypes from an artifact's manifest."""
    from packager.manifest import Manifest

    manifest = Manifest.load(directory)
    axes = manifest.details.axes_max
    shapes, dtypes = [], []
    for tensor in manifest.inputs:
        dims = [d if d != -1 else axes[a] if a is not None else _unnamed_axis(tensor.name)
                for d, a in zip(tensor.dims, tensor.dim_axes)]
        shapes.append(tuple(int(d) for d in dims))
        dtypes.append({"FP32": "float32", "INT64": "int64", "INT32": "int64"}[tensor.datatype])
    return ModelInputs(shapes, dtypes)


def _unnamed_axis(name: str) -> int:
    raise RuntimeError(f"input {name} has a dynamic axis without a name in the manifest: package it again")


def model_file(directory: Path, file_name: str) -> Path:
    """``file_name`` in version 1 of an artifact's Triton model directory."""
    from packager.manifest import Manifest

    return directory / Manifest.load(directory).model / "1" / file_name


def synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def empty_cache(device: str) -> None:
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def random_inputs(inputs: ModelInputs, batch: int, device: str) -> list:
    import torch

    return [torch.randn((batch, *shape), device=device) if dtype == "float32" else
            torch.randint(1, 1000, (batch, *shape), device=device, dtype=torch.int64)
            for shape, dtype in zip(inputs.shapes, inputs.dtypes)]


def latency(run_once: RunOnce, batches: list[int], warmup: int, iters: int,
            device: str = "cuda") -> dict[str, BatchLatency]:
    """Per batch size (as a string, the report's key): percentiles of ``iters`` timed runs."""
    from mme.stats import percentile

    def ms(samples: list[float], q: float) -> float:
        value = percentile(samples, q)
        return round(value, 3) if value is not None else 0.0

    figures: dict[str, BatchLatency] = {}
    for batch in batches:
        for _ in range(warmup):
            run_once(batch)
        synchronize(device)
        samples = []
        for _ in range(iters):
            start = time.perf_counter()
            run_once(batch)
            synchronize(device)
            samples.append((time.perf_counter() - start) * 1000.0)
        mean = sum(samples) / len(samples)
        figures[str(batch)] = BatchLatency(ms(samples, 50), ms(samples, 90), ms(samples, 99),
                                           round(batch / (mean / 1000), 1))
    return figures


def torchscript_runner(path: Path, inputs: ModelInputs, device: str = "cuda") -> tuple[Any, RunOnce]:
    """The loaded module and a function that runs it on random inputs of a batch size."""
    import torch

    module = torch.jit.load(str(path), map_location=device).eval()
    cache: dict[int, list] = {}

    def run_once(batch: int):
        if batch not in cache:
            cache[batch] = random_inputs(inputs, batch, device)
        with torch.inference_mode():
            return module(*cache[batch])

    return module, run_once


def copy_loader(path: Path, inputs: ModelInputs, max_batch: int, device: str = "cuda") -> Callable[[], Any]:
    """Loads one copy and runs one max-batch inference on it, as a served copy would."""
    def load():
        module, run_once = torchscript_runner(path, inputs, device)
        run_once(max_batch)
        return module
    return load


def tensorrt_runner(plan: Path, inputs: ModelInputs) -> RunOnce:
    """Runs a TensorRT plan on CUDA through the packager's :class:`PlanExecution` (the runner
    validation uses), with input and output buffers made once per batch size."""
    from packager.formats.tensorrt_plan import PlanExecution

    execution = PlanExecution(plan.read_bytes())
    buffers: dict[int, dict[str, Any]] = {}

    def run_once(batch: int) -> None:
        if batch not in buffers:
            made = dict(zip(execution.input_names, random_inputs(inputs, batch, "cuda")))
            buffers[batch] = {**made, **execution.outputs_for(made)}
        execution.execute(buffers[batch])

    return run_once
