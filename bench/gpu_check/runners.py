"""Running a packaged model on CUDA (or the CPU for the dry run) and timing it.

TorchScript through ``torch.jit.load``, TensorRT plans through the packager's
:class:`PlanExecution`. :func:`latency` times either at each batch size: on CUDA with CUDA
events on a dedicated stream (the GPU's own clock, no legacy default stream, no host-side
launch jitter), on the CPU with ``perf_counter``; percentiles as ``mme report`` computes them
(:func:`mme.stats.percentile`). TF32 is switched with the packager's
:func:`packager.formats.torchscript.fp32_math`, so TorchScript and a TensorRT plan are compared
like for like.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from mme.stats import percentile
from packager.formats.tensorrt_plan import PlanExecution
from packager.manifest import Manifest

RunOnce = Callable[[int], Any]  # runs one inference at the given batch size
TOKEN_ID_RANGE = (1000, 2000)  # ordinary word pieces in every BERT-family vocabulary (30,522+ entries)


@dataclass(frozen=True)
class ModelInputs:
    """An artifact's inputs: names, shapes without the batch axis (dynamic axes at their
    maximum) and dtypes."""

    names: list[str]
    shapes: list[tuple[int, ...]]
    dtypes: list[str]  # "float32" | "int64"


@dataclass(frozen=True)
class BatchLatency:
    p50_ms: float
    p90_ms: float
    p99_ms: float
    items_per_s: float


def manifest_inputs(directory: Path) -> ModelInputs:
    """Input names, shapes and dtypes from an artifact's manifest."""
    manifest = Manifest.load(directory)
    axes = manifest.details.axes_max
    names, shapes, dtypes = [], [], []
    for tensor in manifest.inputs:
        dims = [d if d != -1 else axes[a] if a is not None else _unnamed_axis(tensor.name)
                for d, a in zip(tensor.dims, tensor.dim_axes)]
        names.append(tensor.name)
        shapes.append(tuple(int(d) for d in dims))
        dtypes.append({"FP32": "float32", "INT64": "int64", "INT32": "int64"}[tensor.datatype])
    return ModelInputs(names, shapes, dtypes)


def _unnamed_axis(name: str) -> int:
    raise RuntimeError(f"input {name} has a dynamic axis without a name in the manifest: package it again")


def model_file(directory: Path, file_name: str) -> Path:
    """``file_name`` in version 1 of an artifact's Triton model directory."""
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


def model_inputs(inputs: ModelInputs, batch: int, device: str, seed: int = 0) -> list:
    """Inputs as a served request carries them: images as random floats; token ids drawn from
    ordinary word pieces, attention masks all ones (every position attended) and token type
    ids zeros, whatever their order; other integer inputs as token ids."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    made = []
    for name, shape, dtype in zip(inputs.names, inputs.shapes, inputs.dtypes):
        size = (batch, *shape)
        if dtype == "float32":
            tensor = torch.randn(size, generator=generator)
        elif name == "attention_mask":
            tensor = torch.ones(size, dtype=torch.int64)
        elif name == "token_type_ids":
            tensor = torch.zeros(size, dtype=torch.int64)
        else:
            tensor = torch.randint(*TOKEN_ID_RANGE, size, generator=generator, dtype=torch.int64)
        made.append(tensor.to(device))
    return made


TIMING = {"cuda": "CUDA events on a dedicated stream", "cpu": "time.perf_counter"}


def latency(run_once: RunOnce, batches: list[int], warmup: int, iters: int,
            device: str = "cuda") -> dict[str, BatchLatency]:
    """Per batch size (as a string, the report's key): percentiles of ``iters`` timed runs,
    after ``warmup`` untimed ones (see :data:`TIMING`)."""
    def ms(samples: list[float], q: float) -> float:
        value = percentile(samples, q)
        return round(value, 3) if value is not None else 0.0

    figures: dict[str, BatchLatency] = {}
    for batch in batches:
        samples = _cuda_samples(run_once, batch, warmup, iters) if device == "cuda" else \
            _cpu_samples(run_once, batch, warmup, iters)
        mean = sum(samples) / len(samples)
        figures[str(batch)] = BatchLatency(ms(samples, 50), ms(samples, 90), ms(samples, 99),
                                           round(batch / (mean / 1000), 1))
    return figures


def _cpu_samples(run_once: RunOnce, batch: int, warmup: int, iters: int) -> list[float]:
    for _ in range(warmup):
        run_once(batch)
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        run_once(batch)
        samples.append((time.perf_counter() - start) * 1000.0)
    return samples


def _cuda_samples(run_once: RunOnce, batch: int, warmup: int, iters: int) -> list[float]:
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # inputs made on the default stream are ready
    samples = []
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            run_once(batch)
        stream.synchronize()
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            run_once(batch)
            end.record(stream)
            end.synchronize()
            samples.append(float(start.elapsed_time(end)))
    return samples


def torchscript_runner(path: Path, inputs: ModelInputs, device: str = "cuda") -> tuple[Any, RunOnce]:
    """The loaded module and a function that runs it on the inputs of a batch size (made
    once per batch size)."""
    import torch

    module = torch.jit.load(str(path), map_location=device).eval()
    cache: dict[int, list] = {}

    def run_once(batch: int):
        if batch not in cache:
            cache[batch] = model_inputs(inputs, batch, device)
        with torch.inference_mode():
            return module(*cache[batch])

    return module, run_once


def tensorrt_runner(plan: Path, inputs: ModelInputs) -> RunOnce:
    """Runs a TensorRT plan on CUDA through the packager's :class:`PlanExecution` (the runner
    validation uses; it enqueues on the current stream), with input and output buffers made
    once per batch size."""
    execution = PlanExecution(plan.read_bytes())
    buffers: dict[int, dict[str, Any]] = {}

    def run_once(batch: int) -> None:
        if batch not in buffers:
            by_name = dict(zip(inputs.names, model_inputs(inputs, batch, "cuda")))
            made = {name: by_name[name] for name in execution.input_names}
            buffers[batch] = {**made, **execution.outputs_for(made)}
        execution.execute(buffers[batch])

    return run_once
