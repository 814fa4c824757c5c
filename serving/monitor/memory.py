"""Memory readings for sizing: host memory of a server's process tree (psutil) and GPU
memory (NVML, from the optional ``nvidia-ml-py`` package), and the meter a local endpoint
or ``mme capacity`` counts with (:func:`choose_meter`).

On a GPU host the meter reads NVML's device-wide figure: it is right across PID namespaces
(a Triton in a container has other PIDs than the host sees) and includes every CUDA
context. Per-process figures are kept where the driver gives them. A host that has an NVIDIA
GPU but no readable NVML (the ``gpu`` extra, nvidia-ml-py, not installed) is refused for
"auto" rather than silently counted by host RSS: the models fill GPU memory the host's RSS
never shows, so eviction would never fire.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

import psutil

from mme.errors import UsageError

T = TypeVar("T")
NVML_NOT_AVAILABLE = (1 << 64) - 1  # NVML's "value not available" for per-process memory


@dataclass(frozen=True)
class ProcessTreeMemory:
    """Summed over the processes that were alive when read."""

    rss_bytes: int  # resident set size (shared pages counted once per process)
    uss_bytes: int | None  # unique set size; None when some process's smaps was unreadable
    processes: int
    timestamp: float  # time.time()


def process_tree_memory(pids: Iterable[int], *, uss: bool = True) -> ProcessTreeMemory:
    """Memory of the given processes (e.g. ``server.pids()``); vanished ones are skipped.
    ``uss=False`` reads RSS only (``uss_bytes`` None): USS parses each process's smaps, which cost
    the endpoint's event loop 90% of its time under thrash (25 python-backend stubs, a reading at
    every admission), and eviction goes by RSS."""
    rss = 0
    unique: int | None = 0 if uss else None
    count = 0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            rss_one = proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except psutil.AccessDenied:
            unique = None
            continue
        if unique is not None:
            try:
                uss_one: int | None = proc.memory_full_info().uss
            except (psutil.AccessDenied, psutil.ZombieProcess):
                uss_one = None
            except psutil.NoSuchProcess:
                continue
            unique = None if uss_one is None else unique + uss_one
        rss += rss_one
        count += 1
    return ProcessTreeMemory(rss_bytes=rss, uss_bytes=unique, processes=count, timestamp=time.time())


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


def _nvml_errors(nvml) -> tuple[type[BaseException], ...]:
    """NVMLError, plus NVMLLibraryMismatchError: nvidia-ml-py raises that one (not an
    NVMLError) when a driver lacks a versioned function such as the _v3 process queries."""
    mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
    return (nvml.NVMLError, mismatch) if isinstance(mismatch, type) else (nvml.NVMLError,)


def _running_processes(nvml, handle, query: str) -> list:
    """``nvmlDevice<query>`` (the newest version), falling back to its ``_v2`` on older drivers."""
    errors = _nvml_errors(nvml)
    try:
        return list(getattr(nvml, query)(handle))
    except errors:
        older = getattr(nvml, f"{query}_v2", None)
        if older is None:
            raise
        return list(older(handle))


def _nvml_query(query: Callable[[Any], T]) -> T | None:
    """``query(pynvml)`` between nvmlInit and nvmlShutdown; None without NVML (package or
    driver missing) or when NVML refuses the query."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        return query(nvml)
    except _nvml_errors(nvml):
        return None
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def gpu_device_count() -> int | None:
    """GPUs NVML sees; None when NVML is unavailable (package or driver missing)."""
    return _nvml_query(lambda nvml: nvml.nvmlDeviceGetCount())


def read_gpu_memory(index: int = 0) -> GpuMemoryReading | None:
    """Memory of GPU ``index`` and of the processes using it; None without NVML or GPU."""
    return _nvml_query(lambda nvml: _read_gpu(nvml, index))


def _read_gpu(nvml, index: int) -> GpuMemoryReading | None:
    if index >= nvml.nvmlDeviceGetCount():
        return None
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    info = nvml.nvmlDeviceGetMemoryInfo(handle)
    name = nvml.nvmlDeviceGetName(handle)
    if isinstance(name, bytes):
        name = name.decode()
    processes: dict[int, GpuProcessMemory] = {}
    # Either list can be refused (e.g. inside some containers); a process can be in both.
    for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        with contextlib.suppress(*_nvml_errors(nvml)):
            for entry in _running_processes(nvml, handle, query):
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


def gpu_compute_capability(index: int = 0) -> str | None:
    """``"9.0"`` for GPU ``index`` (what a TensorRT plan built here is tied to); None without NVML."""
    def capability(nvml) -> str:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(nvml.nvmlDeviceGetHandleByIndex(index))
        return f"{major}.{minor}"

    return _nvml_query(capability)


# -- meters: what a local endpoint and `mme capacity` count -------------------------------------

# The share of the memory limit copies may fill: the articles' 90%. The endpoint evicts above it, and
# mme capacity counts the copies that fit under it.
DEFAULT_MEMORY_THRESHOLD = 0.9
MEMORY_KINDS = ("auto", "gpu", "host")


class MemoryMeter:
    """Memory in use and its total, for eviction thresholds and capacity counts."""

    kind = ""  # "gpu" | "host"
    description = ""

    def used(self) -> int:
        raise NotImplementedError

    def total(self) -> int:
        raise NotImplementedError

    def details(self) -> dict:
        """Extra figures for metrics and reports (per-process readings where visible)."""
        return {}


class HostMemoryMeter(MemoryMeter):
    """Resident memory of the server's process tree (Triton and its python-backend stubs),
    against this host's RAM."""

    kind = "host"
    description = "host RSS of the Triton process tree"

    def __init__(self, pids: Callable[[], Iterable[int]]) -> None:
        self.pids = pids

    def used(self) -> int:
        return process_tree_memory(self.pids(), uss=False).rss_bytes

    def total(self) -> int:
        return psutil.virtual_memory().total


class GpuMemoryMeter(MemoryMeter):
    """NVML's device-wide memory in use on one GPU (works whatever PID namespace the server
    runs in), with the server's own processes' figures where the driver shows them."""

    kind = "gpu"

    def __init__(self, index: int = 0, pids: Callable[[], Iterable[int]] | None = None) -> None:
        self.index = index
        self.pids = pids
        first = read_gpu_memory(index)
        if first is None:
            raise UsageError(
                f"no GPU {index} readable through NVML (nvidia-ml-py missing, no driver, or no such GPU); "
                "install the gpu extra or pass --memory host"
            )
        self._total = first.total_bytes
        self.description = f"GPU memory of {first.name} (NVML, whole device)"

    def _reading(self) -> GpuMemoryReading:
        reading = read_gpu_memory(self.index)
        if reading is None:
            raise UsageError(f"NVML stopped answering for GPU {self.index}; check the driver (nvidia-smi)")
        return reading

    def used(self) -> int:
        return self._reading().used_bytes

    def total(self) -> int:
        return self._total

    def details(self) -> dict:
        reading = self._reading()
        mine = set(self.pids()) if self.pids is not None else set()
        visible = [p.used_bytes for p in reading.processes if p.pid in mine and p.used_bytes is not None]
        return {"gpu": reading.name, "device_used_bytes": reading.used_bytes,
                "server_processes_bytes": sum(visible) if visible else None}


def nvidia_gpu_evidence(dev: Path = Path("/dev")) -> str | None:
    """What shows an NVIDIA GPU on this host without asking NVML: a ``/dev/nvidiaN`` device
    node (the driver's, also mounted into GPU containers), else ``nvidia-smi -L`` listing one;
    None when neither does."""
    nodes = sorted(node.name for node in dev.glob("nvidia[0-9]*"))
    if nodes:
        return f"{dev / nodes[0]}"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    gpus = [line for line in done.stdout.splitlines() if line.startswith("GPU ")]
    return f"nvidia-smi -L lists {len(gpus)} GPU{'s' if len(gpus) > 1 else ''}" if done.returncode == 0 and gpus else None


def nvml_problem() -> str:
    """Why NVML cannot be read here, in words (for a host where :func:`gpu_device_count` is None)."""
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return "nvidia-ml-py is not installed"
    return "nvidia-ml-py is installed but NVML did not start: the driver's libnvidia-ml is missing or refused"


def choose_meter(kind: str, pids: Callable[[], Iterable[int]], *, instance_kind: str | None = None,
                 gpu_index: int = 0, gpu_evidence: Callable[[], str | None] | None = None) -> MemoryMeter:
    """The meter for ``kind``: "gpu", "host", or "auto" = the GPU whenever NVML sees one,
    unless the models are known to run on the CPU (``instance_kind`` KIND_CPU, e.g. cpu-local).

    "auto" refuses (UsageError) on a host that has an NVIDIA GPU NVML cannot read: host RSS
    would be counted while the models fill GPU memory. ``gpu_evidence`` says whether a GPU is
    there without NVML (default :func:`nvidia_gpu_evidence`; a test passes its own)."""
    if kind not in MEMORY_KINDS:
        raise UsageError(f"--memory {kind!r}: choose one of {', '.join(MEMORY_KINDS)}")
    if kind == "host":
        return HostMemoryMeter(pids)
    if kind == "gpu":
        return GpuMemoryMeter(gpu_index, pids)
    if instance_kind == "KIND_CPU":
        return HostMemoryMeter(pids)  # the models live in host memory whatever the host has
    count = gpu_device_count()
    if count is None:
        seen = (gpu_evidence or nvidia_gpu_evidence)()
        if seen:
            raise UsageError(
                f"--memory auto: this host has an NVIDIA GPU ({seen}) but NVML cannot be read ({nvml_problem()}), so "
                "the GPU memory the models fill cannot be counted and eviction would go by host RSS; install it with "
                "'make install-gpu' (or 'pip install nvidia-ml-py'), or pass --memory host to count host RSS anyway"
            )
    if count and count > gpu_index:
        return GpuMemoryMeter(gpu_index, pids)
    return HostMemoryMeter(pids)
