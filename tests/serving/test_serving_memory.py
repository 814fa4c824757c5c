from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from serving.monitor import memory


def test_process_tree_memory_sums_live_processes_and_skips_gone_ones():
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; b = bytearray(64 << 20); print(flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE,
    )
    try:
        child.stdout.readline()  # the 64 MiB are allocated (and zeroed, so resident)
        alone = memory.process_tree_memory([child.pid])
        both = memory.process_tree_memory([os.getpid(), child.pid, int(gone.stdout)])
        rss_only = memory.process_tree_memory([child.pid], uss=False)  # what the endpoint's meter reads
    finally:
        child.kill()
        child.wait()
    assert alone.rss_bytes > 64 << 20 and alone.processes == 1
    assert both.processes == 2 and both.rss_bytes > alone.rss_bytes
    assert both.uss_bytes is not None and 0 < both.uss_bytes <= both.rss_bytes
    assert both.timestamp > 0
    assert rss_only.uss_bytes is None and rss_only.processes == 1 and rss_only.rss_bytes > 64 << 20


def test_no_pids_reads_zero():
    reading = memory.process_tree_memory([])
    assert (reading.rss_bytes, reading.uss_bytes, reading.processes) == (0, 0, 0)


def test_gpu_memory_is_none_without_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert memory.read_gpu_memory() is None
    assert memory.gpu_device_count() is None


class FakeNvml:
    """The slice of pynvml (nvidia-ml-py) that read_gpu_memory uses, for one 16 GiB GPU."""

    class NVMLError(Exception):
        pass

    def __init__(self, compute, graphics_error=False):
        self.compute = compute
        self.graphics_error = graphics_error
        self.initialised = 0

    def nvmlInit(self):
        self.initialised += 1

    def nvmlShutdown(self):
        self.initialised -= 1

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("handle", index)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(used=3 << 30, total=16 << 30, free=13 << 30)

    def nvmlDeviceGetName(self, handle):
        return "Tesla T4"

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.compute]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        if self.graphics_error:
            raise self.NVMLError("not supported")
        return [types.SimpleNamespace(pid=self.compute[0][0], usedGpuMemory=self.compute[0][1])]


def test_gpu_memory_reads_the_device_and_its_processes(monkeypatch):
    fake = FakeNvml(compute=[(101, 1 << 30), (102, None)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    reading = memory.read_gpu_memory(0)
    assert (reading.name, reading.used_bytes, reading.total_bytes) == ("Tesla T4", 3 << 30, 16 << 30)
    assert reading.used_fraction == 3 / 16
    assert {p.pid: p.used_bytes for p in reading.processes} == {101: 1 << 30, 102: None}
    assert memory.read_gpu_memory(1) is None  # no such device
    assert memory.gpu_device_count() == 1
    assert fake.initialised == 0  # every init shut down


def test_gpu_memory_tolerates_a_refused_process_list(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(compute=[(7, 5 << 20)], graphics_error=True))
    assert [(p.pid, p.used_bytes) for p in memory.read_gpu_memory().processes] == [(7, 5 << 20)]


class NVMLLibraryMismatchError(Exception):
    """nvidia-ml-py's own class: not an NVMLError subclass."""


class OldDriverNvml(FakeNvml):
    """A driver without the _v3 process queries: nvidia-ml-py's unversioned names raise
    NVMLLibraryMismatchError there (throwOnVersionMismatch), the _v2 ones work."""

    NVMLLibraryMismatchError = NVMLLibraryMismatchError

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        raise NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does not match")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        raise NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does not match")

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle):
        return FakeNvml.nvmlDeviceGetComputeRunningProcesses(self, handle)

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return (7, 5)


def test_an_older_driver_falls_back_to_the_v2_process_queries(monkeypatch):
    fake = OldDriverNvml(compute=[(11, 300 << 20)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    reading = memory.read_gpu_memory(0)  # no NVMLLibraryMismatchError escapes
    assert reading is not None and reading.used_bytes == 3 << 30
    assert [(p.pid, p.used_bytes) for p in reading.processes] == [(11, 300 << 20)]
    assert memory.gpu_compute_capability(0) == "7.5"
    assert fake.initialised == 0


def test_choose_meter_counts_the_gpu_on_a_gpu_host_unless_the_models_run_on_the_cpu(monkeypatch):
    fake = FakeNvml(compute=[(os.getpid(), 1 << 30), (999999, 2 << 30)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    pids = lambda: [os.getpid()]  # noqa: E731
    meter = memory.choose_meter("auto", pids, instance_kind="KIND_GPU")
    assert isinstance(meter, memory.GpuMemoryMeter) and meter.kind == "gpu"
    assert (meter.used(), meter.total()) == (3 << 30, 16 << 30)  # the whole device: right across PID namespaces
    assert meter.details()["server_processes_bytes"] == 1 << 30  # its own processes, where the driver shows them
    assert "Tesla T4" in meter.description
    assert isinstance(memory.choose_meter("auto", pids, instance_kind="KIND_CPU"), memory.HostMemoryMeter)
    assert isinstance(memory.choose_meter("auto", pids, instance_kind=None), memory.GpuMemoryMeter)
    host = memory.choose_meter("host", pids)
    assert host.kind == "host" and host.used() > 0 and host.total() > host.used()


def test_choose_meter_without_a_gpu(monkeypatch):
    from mme.errors import UsageError

    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert isinstance(memory.choose_meter("auto", lambda: [], instance_kind="KIND_GPU"), memory.HostMemoryMeter)
    with pytest.raises(UsageError, match="--memory host"):
        memory.choose_meter("gpu", lambda: [])
    with pytest.raises(UsageError, match="choose one of auto, gpu, host"):
        memory.choose_meter("vram", lambda: [])


def test_auto_refuses_a_gpu_host_whose_nvml_cannot_be_read(monkeypatch):
    """A GPU is there (the probe says so) but nvidia-ml-py is not: counting host RSS would let the
    models fill GPU memory unseen, so "auto" refuses with the fix and the way to accept it."""
    from mme.errors import UsageError

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    gpu_here = lambda: "/dev/nvidia0"  # noqa: E731
    with pytest.raises(UsageError) as refused:
        memory.choose_meter("auto", lambda: [], instance_kind="KIND_GPU", gpu_evidence=gpu_here)
    message = str(refused.value)
    assert "\n" not in message and "/dev/nvidia0" in message and "nvidia-ml-py is not installed" in message
    assert "make install-gpu" in message and "pip install nvidia-ml-py" in message and "--memory host" in message
    with pytest.raises(UsageError, match="--memory host"):
        memory.choose_meter("auto", lambda: [], instance_kind=None, gpu_evidence=gpu_here)
    # what it names as the way out works; models that run on the CPU are counted in host memory as before
    assert isinstance(memory.choose_meter("host", lambda: [], gpu_evidence=gpu_here), memory.HostMemoryMeter)
    assert isinstance(memory.choose_meter("auto", lambda: [], instance_kind="KIND_CPU", gpu_evidence=gpu_here),
                      memory.HostMemoryMeter)
    # no GPU at all: host RSS, as before
    assert isinstance(memory.choose_meter("auto", lambda: [], instance_kind="KIND_GPU", gpu_evidence=lambda: None),
                      memory.HostMemoryMeter)
    # NVML that reads: the GPU meter, whatever the probe says
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(compute=[(7, 1 << 20)]))
    assert isinstance(memory.choose_meter("auto", lambda: [], instance_kind="KIND_GPU", gpu_evidence=gpu_here),
                      memory.GpuMemoryMeter)


def test_the_gpu_probe_reads_device_nodes_and_nvidia_smi(tmp_path, monkeypatch):
    (tmp_path / "nvidiactl").touch()  # the control node alone is not a GPU
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no nvidia-smi either
    assert memory.nvidia_gpu_evidence(tmp_path) is None
    (tmp_path / "nvidia0").touch()
    assert memory.nvidia_gpu_evidence(tmp_path) == str(tmp_path / "nvidia0")
    (tmp_path / "nvidia0").unlink()
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA A10G (UUID: GPU-x)'\n")
    smi.chmod(0o755)
    assert memory.nvidia_gpu_evidence(tmp_path) == "nvidia-smi -L lists 1 GPU"
