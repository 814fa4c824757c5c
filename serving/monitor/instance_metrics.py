"""Instance metrics of a local endpoint, with CloudWatch's meanings for SageMaker endpoints.

Source: AWS, "Monitor Amazon SageMaker AI with Amazon CloudWatch" (instance metrics, namespace
/aws/sagemaker/Endpoints) and /work/shared/reference.md ("What SageMaker's MME front end and
Triton's SageMaker mode actually do"):

* CPUUtilization: the sum of each core's utilisation by the container's processes, 0..100 x cores.
* MemoryUtilization: memory used by the container's processes as a share of the instance's
  memory, 0..100. Here: RSS of the Triton process tree over the host's RAM, whatever memory
  meter the endpoint evicts by (a GPU endpoint's CloudWatch MemoryUtilization is host memory too).
* DiskUtilization: disk space used, percent. Here: the filesystem holding the model cache
  (``shutil.disk_usage``: used / total).
* GPUUtilization, GPUMemoryUtilization: percent, summed over GPUs (0..100 x GPUs), via NVML for
  every GPU NVML sees (device-wide, like serving.monitor.memory's GPU meter); None without a GPU.

CPU is measured from per-process ``cpu_times`` (user + system) differences between samples, so
sampling never sleeps. The first sample has no interval: it reports each process's average over
its own lifetime (what ``ps`` shows as %CPU). A process first seen later counts all its CPU time
when it started after the previous sample, otherwise the share of its lifetime average falling in
the interval; a process that ended between samples loses its last partial interval (python-backend
stubs come and go). A reused PID is a new process (keyed by PID and creation time).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import psutil

from mme.errors import UsageError
from serving.monitor.memory import _nvml, _nvml_errors


@dataclass(frozen=True)
class InstanceReading:
    """One sample of the instance metrics, in percent (CloudWatch's unit for them)."""

    cpu_percent: float  # summed over cores: 0..100 x cores
    memory_percent: float  # process tree RSS / host RAM
    disk_percent: float  # used / total of the model cache's filesystem
    gpu_percent: float | None  # summed over GPUs; None without a GPU
    gpu_memory_percent: float | None  # summed over GPUs; None without a GPU
    processes: int = 0  # processes read
    interval_s: float | None = None  # CPU measured over this interval; None: lifetime averages (first sample)
    timestamp: float = 0.0  # time.time()


class InstanceSampler:
    """Samples the instance metrics of a server's processes (e.g. ``server.pids``).

    ``gpu``: None = use NVML when it sees a GPU; False = never (GPU fields None); True = NVML
    must see a GPU (UsageError otherwise). Thread-safe; :meth:`close` releases NVML.
    """

    def __init__(self, pids: Callable[[], Iterable[int]], disk_path: Path, *, gpu: bool | None = None) -> None:
        self.pids = pids
        self.disk_path = Path(disk_path)
        self._lock = threading.Lock()
        self._marks: dict[tuple[int, float], float] = {}  # (pid, create_time) -> user+system CPU s at the last sample
        self._procs: dict[int, psutil.Process] = {}
        self._last: float | None = None  # time.monotonic() of the last sample
        self._nvml = None
        self._gpus: list = []
        if gpu is not False:
            self._open_nvml(required=gpu is True)

    # -- GPU ------------------------------------------------------------------------------------
    def _open_nvml(self, required: bool) -> None:
        nvml = _nvml()  # nvmlInit (reference-counted); kept until close()
        if nvml is not None:
            try:
                self._gpus = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            except _nvml_errors(nvml):
                self._gpus = []
            if self._gpus:
                self._nvml = nvml
            else:
                with contextlib.suppress(nvml.NVMLError):
                    nvml.nvmlShutdown()
        if required and self._nvml is None:
            raise UsageError("no GPU readable through NVML (nvidia-ml-py missing, no driver, or no GPU); "
                             "install the gpu extra or sample without GPU metrics")

    def _gpu(self) -> tuple[float | None, float | None]:
        """(GPUUtilization, GPUMemoryUtilization) summed over GPUs; (None, None) without NVML."""
        nvml = self._nvml
        if nvml is None:
            return None, None
        util = mem = 0.0
        read = 0
        for handle in self._gpus:
            try:
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)  # percent over the driver's last period
                info = nvml.nvmlDeviceGetMemoryInfo(handle)
            except _nvml_errors(nvml):
                continue  # a GPU that stopped answering (lost, reset) counts nothing
            util += float(rates.gpu)
            mem += 100.0 * int(info.used) / int(info.total) if int(info.total) else 0.0
            read += 1
        return (util, mem) if read else (None, None)

    def close(self) -> None:
        with self._lock:
            nvml, self._nvml, self._gpus = self._nvml, None, []
        if nvml is not None:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()

    # -- disk -----------------------------------------------------------------------------------
    def _disk(self) -> float:
        path = self.disk_path
        while not path.exists() and path != path.parent:  # the cache root may not exist yet
            path = path.parent
        try:
            usage = shutil.disk_usage(path)
        except OSError:
            return 0.0
        return 100.0 * usage.used / usage.total if usage.total else 0.0

    # -- processes --------------------------------------------------------------------------------
    def _process(self, pid: int) -> psutil.Process:
        proc = self._procs.get(pid)
        if proc is None or not proc.is_running():  # is_running() is False for a reused PID
            proc = self._procs[pid] = psutil.Process(pid)
        return proc

    def _pids(self) -> list[int]:
        try:
            return list(dict.fromkeys(self.pids()))
        except (psutil.Error, OSError):
            return []  # server gone or restarting

    def sample(self) -> InstanceReading:
        """The instance metrics now; CPU over the interval since the previous call (see module doc)."""
        with self._lock:
            now_wall, now = time.time(), time.monotonic()
            interval = None if self._last is None else max(now - self._last, 1e-6)
            cpu_rate = 0.0  # CPU seconds per second, summed over processes
            rss = 0
            marks: dict[tuple[int, float], float] = {}
            for pid in self._pids():
                try:
                    proc = self._process(pid)
                    with proc.oneshot():
                        times = proc.cpu_times()
                        rss_one = proc.memory_info().rss
                    created = proc.create_time()
                except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                    self._procs.pop(pid, None)
                    continue
                cpu_s = times.user + times.system
                key = (pid, created)
                marks[key] = cpu_s
                rss += rss_one
                age = max(now_wall - created, 1e-3)
                before = self._marks.get(key)
                if interval is None:
                    cpu_rate += cpu_s / age  # first sample: lifetime average
                elif before is not None:
                    cpu_rate += max(0.0, cpu_s - before) / interval
                else:  # new since the last sample (or not listed then)
                    cpu_rate += cpu_s * min(1.0, interval / age) / interval
            for pid in set(self._procs) - {key[0] for key in marks}:
                del self._procs[pid]
            self._marks, self._last = marks, now
            gpu_percent, gpu_memory_percent = self._gpu()
        total_ram = psutil.virtual_memory().total
        return InstanceReading(
            cpu_percent=min(100.0 * cpu_rate, 100.0 * (os.cpu_count() or 1)),
            memory_percent=100.0 * rss / total_ram if total_ram else 0.0,
            disk_percent=self._disk(),
            gpu_percent=gpu_percent,
            gpu_memory_percent=gpu_memory_percent,
            processes=len(marks),
            interval_s=interval,
            timestamp=now_wall,
        )
