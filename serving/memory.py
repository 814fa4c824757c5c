"""Memory readings for sizing: host memory of a server's process tree (psutil) and GPU
memory (NVML, from the optional ``nvidia-ml-py`` package)."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Iterable

import psutil

NVML_NOT_AVAILABLE = (1 << 64) - 1  # NVML's "value not available" for per-process memory


@dataclass(frozen=True)
class MemoryReading:
    """Summed over the processes that were alive when read."""

    rss_bytes: int  # resident set size (shared pages counted once per process)
    uss_bytes: int | None  # unique set size; None when some process's smaps was unreadable
    processes: int
    timestamp: float  # time.time()


def process_tree_memory(pids: Iterable[int]) -> MemoryReading:
    """Memory of the given processes (e.g. ``server.pids()``); vanished ones are skipped."""
    rss = 0
    uss: int | None = 0
    count = 0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            rss_one = proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except psutil.AccessDenied:
            uss = None
            continue
        try:
            uss_one: int | None = proc.memory_full_info().uss
        except (psutil.AccessDenied, psutil.ZombieProcess):
            uss_one = None
        except psutil.NoSuchProcess:
            continue
        rss += rss_one
        count += 1
        uss = None if uss is None or uss_one is None else uss + uss_one
    return MemoryReading(rss_bytes=rss, uss_bytes=uss, processes=count, timestamp=time.time())


@dataclass(frozen=True)
class GpuProcessMemory:
    pid: int
    used_bytes: int | None  # None where the driver does not tell (e.g. some WDDM/MIG setups)


@dataclass(frozen=True)
class GpuMemoryReading:
    index: int
    name: str
    used_bytes: int
    total_bytes: int
    processes: tuple[GpuProcessMemory, ...]
    timestamp: float

    @property
    def used_fraction(self) -> float:
        return self.used_bytes / self.total_bytes if self.total_bytes else 0.0


def _nvml():
    """The initialised pynvml module, or None (not installed, no driver, no GPU)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    return pynvml


def gpu_device_count() -> int | None:
    """GPUs NVML sees; None when NVML is unavailable (package or driver missing)."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        return nvml.nvmlDeviceGetCount()
    except nvml.NVMLError:
        return None
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def gpu_memory(index: int = 0) -> GpuMemoryReading | None:
    """Memory of GPU ``index`` and of the processes using it; None without NVML or GPU."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        if index >= nvml.nvmlDeviceGetCount():
            return None
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
        name = nvml.nvmlDeviceGetName(handle)
        if isinstance(name, bytes):
            name = name.decode()
        processes: dict[int, GpuProcessMemory] = {}
        # Either list can be refused (e.g. inside some containers); a process can be in both.
        for query in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses):
            with contextlib.suppress(nvml.NVMLError):
                for entry in query(handle):
                    used = entry.usedGpuMemory
                    used = int(used) if used is not None and int(used) < NVML_NOT_AVAILABLE else None
                    if entry.pid not in processes or processes[entry.pid].used_bytes is None:
                        processes[entry.pid] = GpuProcessMemory(pid=entry.pid, used_bytes=used)
        return GpuMemoryReading(
            index=index,
            name=str(name),
            used_bytes=int(info.used),
            total_bytes=int(info.total),
            processes=tuple(processes.values()),
            timestamp=time.time(),
        )
    except nvml.NVMLError:
        return None
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
