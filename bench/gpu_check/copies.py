"""GPU memory per loaded copy, read with the project's meter, and the copies that fit.

Copies of a TorchScript model are loaded one by one in this process; after each, the meter
``mme capacity`` counts with (:func:`serving.memory.choose_meter`: NVML on the GPU, host
RSS for the CPU dry run) is read, and the copies that fit under the threshold are predicted
with ``mme capacity``'s own :func:`serving.capacity.predict`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from bench.gpu_check.runners import empty_cache, synchronize

MIB = 1 << 20


@dataclass(frozen=True)
class CopyMemory:
    memory_method: str
    gpu_total_mib: int
    baseline_mib: int
    first_copy_mib: float
    per_copy_mib: float  # the mean of the copies after the first
    deltas_mib: list[float]
    this_process_mib: int | None  # where the driver shows per-process figures
    threshold: float
    copies_that_fit: int


def nvml_index() -> int:
    """The NVML index of torch's device 0 (CUDA_VISIBLE_DEVICES given as indices), else 0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


def meter_for(device: str, pids: Callable[[], list[int]]):
    """The project's meter: NVML on the GPU; host RSS of ``pids`` for the CPU dry run."""
    from serving.memory import choose_meter

    return choose_meter("gpu" if device == "cuda" else "host", pids, gpu_index=nvml_index())


def measure_copies(load_copy: Callable[[], Any], copies: int, threshold: float, device: str = "cuda") -> CopyMemory:
    """Load ``copies`` copies one by one, reading memory after each; predict what fits."""
    from serving.capacity import predict

    meter = meter_for(device, lambda: [os.getpid()])
    empty_cache(device)
    synchronize(device)
    baseline = meter.used()
    readings, alive = [baseline], []
    try:
        for _ in range(copies):
            alive.append(load_copy())
            synchronize(device)
            readings.append(meter.used())
        process = meter.details().get("server_processes_bytes")
    finally:
        alive.clear()
        empty_cache(device)
    deltas = [b - a for a, b in zip(readings, readings[1:])]
    further = deltas[1:] or deltas
    per_copy = sum(further) / len(further)
    total = meter.total()
    return CopyMemory(
        memory_method=meter.description, gpu_total_mib=round(total / MIB), baseline_mib=round(baseline / MIB),
        first_copy_mib=round(deltas[0] / MIB, 1), per_copy_mib=round(per_copy / MIB, 1),
        deltas_mib=[round(d / MIB, 1) for d in deltas],
        this_process_mib=None if process is None else round(process / MIB), threshold=threshold,
        copies_that_fit=predict(baseline + max(0, deltas[0] - per_copy), per_copy, total, threshold),
    )
