"""Copies of a TorchScript model loaded in this process until the real threshold, each memory
figure labelled by what it counts.

The first copy is loaded from the artifact (``torch.jit.load``), the others are copies of it
on the device (``copy.deepcopy``: parameters and buffers duplicated GPU to GPU, seconds for
hundreds of copies); each runs one inference at the max batch size, as a served copy would.
After each, the meter ``mme capacity`` counts with is read (:func:`serving.monitor.memory.choose_meter`:
NVML device-wide on the GPU, host RSS for the CPU dry run). Loading goes on while the next copy
is expected to stay under ``threshold x limit`` (the rule ``mme capacity`` loads by), and stops
there, at ``max_copies`` or at the step's deadline; which one stopped it is recorded. The
prediction ``mme capacity`` would make from the first ``probe`` copies stands next to the real
count: the first copy apart (it also carries cuDNN / cuBLAS workspaces and the allocator's
first blocks), the per-copy figure from the copies after it.
"""

from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from serving.monitor.memory import choose_meter
from sizing.capacity_report import predict_copies

MIB = 1 << 20
PROBE_COPIES = 3  # what mme capacity's prediction is made from (its --probe-copies default)
COUNTED = {
    "cuda": "device-wide: NVML used memory of the whole GPU (every process on it, CUDA contexts included)",
    "cpu": "host RSS of this process (the CPU dry run)",
}


@dataclass(frozen=True)
class CopyMemory:
    counted: str  # what baseline, deltas and used_at_stop count
    limit_mib: int
    limit_source: str
    threshold: float
    device_total_mib: int  # the meter's total: the whole GPU (or host) the check ran on
    baseline_mib: float
    first_copy_mib: float  # copy 1's delta, counted once
    per_copy_mib: float  # the mean delta of the copies after the first
    deltas_mib: list[float]
    probe_copies: int
    predicted_copies: int  # what mme capacity predicts from the first probe_copies copies
    copies_loaded: int  # loaded while the next one was expected to stay under threshold x limit
    stopped_by: str  # "threshold" | "max copies" | "deadline"
    used_at_stop_mib: float
    share_of_limit: float  # used_at_stop / limit
    process_mib: float | None  # NVML's figure for this process alone, where the driver reports it
    allocator_allocated_mib: float | None  # this process's PyTorch caching allocator: tensors live
    allocator_reserved_mib: float | None  # and blocks it holds from CUDA (what NVML sees of them)
    seconds: float


class Meter(Protocol):
    """What the fill loop reads (serving.monitor.memory's meters): ``used()`` and ``total()`` bytes."""

    description: str

    def used(self) -> int: ...

    def total(self) -> int: ...

    def details(self) -> dict: ...


def nvml_index() -> int:
    """The NVML index of torch's device 0 (CUDA_VISIBLE_DEVICES given as indices), else 0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


def meter_for(device: str, pids: Callable[[], list[int]]):
    """The project's meter: NVML on the GPU; host RSS of ``pids`` for the CPU dry run."""
    return choose_meter("gpu" if device == "cuda" else "host", pids, gpu_index=nvml_index())


def fill_copies(load_first: Callable[[], Any], clone: Callable[[Any], Any], meter: Meter, *, limit: int,
                limit_source: str, threshold: float, max_copies: int, deadline: float,
                device: str = "cuda", sync: Callable[[], None] = lambda: None, probe: int = PROBE_COPIES) -> CopyMemory:
    """Load copies until the next would pass ``threshold x limit`` (or ``max_copies``, or the
    ``time.monotonic()`` ``deadline``); the figures. ``clone`` makes copy 2, 3, ... of copy 1."""
    started = time.monotonic()
    budget = threshold * limit
    sync()
    baseline = meter.used()
    readings = [baseline]
    alive: list[Any] = []
    stopped_by = "max copies"
    try:
        alive.append(load_first())
        sync()
        readings.append(meter.used())
        while len(alive) < max_copies:
            deltas = [b - a for a, b in zip(readings, readings[1:])]
            expected = max(_mean(deltas[1:] or deltas), 0)
            if readings[-1] + expected > budget:
                stopped_by = "threshold"
                break
            if time.monotonic() >= deadline:
                stopped_by = "deadline"
                break
            alive.append(clone(alive[0]))
            sync()
            readings.append(meter.used())
        details = meter.details()
        allocator = _allocator() if device == "cuda" else (None, None)
    finally:
        alive.clear()
    deltas = [b - a for a, b in zip(readings, readings[1:])]
    per_copy = _mean(deltas[1:] or deltas)
    probe_deltas = deltas[:probe]
    probe_per_copy = _mean(probe_deltas[1:] or probe_deltas)
    process = details.get("server_processes_bytes")
    return CopyMemory(
        counted=COUNTED.get(device, meter.description), limit_mib=round(limit / MIB), limit_source=limit_source,
        threshold=threshold, device_total_mib=round(meter.total() / MIB), baseline_mib=round(baseline / MIB, 1),
        first_copy_mib=round(deltas[0] / MIB, 1), per_copy_mib=round(per_copy / MIB, 1),
        deltas_mib=[round(d / MIB, 1) for d in deltas], probe_copies=min(probe, len(deltas)),
        predicted_copies=predict_copies(baseline, deltas[0], probe_per_copy, limit, threshold),
        copies_loaded=len(deltas), stopped_by=stopped_by, used_at_stop_mib=round(readings[-1] / MIB, 1),
        share_of_limit=round(readings[-1] / limit, 3),
        process_mib=None if process is None else round(process / MIB, 1),
        allocator_allocated_mib=allocator[0], allocator_reserved_mib=allocator[1],
        seconds=round(time.monotonic() - started, 1),
    )


def _mean(values: list[int]) -> float:
    return sum(values) / len(values) if values else 0.0


def _allocator() -> tuple[float, float]:
    import torch

    return round(torch.cuda.memory_allocated() / MIB, 1), round(torch.cuda.memory_reserved() / MIB, 1)


def deep_copy(module: Any) -> Any:
    """Another copy of a loaded module on its device (parameters and buffers duplicated)."""
    return copy.deepcopy(module)
