from __future__ import annotations

import os
import subprocess
import sys
import types

from serving import memory


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
    finally:
        child.kill()
        child.wait()
    assert alone.rss_bytes > 64 << 20 and alone.processes == 1
    assert both.processes == 2 and both.rss_bytes > alone.rss_bytes
    assert both.uss_bytes is not None and 0 < both.uss_bytes <= both.rss_bytes
    assert both.timestamp > 0


def test_no_pids_reads_zero():
    reading = memory.process_tree_memory([])
    assert (reading.rss_bytes, reading.uss_bytes, reading.processes) == (0, 0, 0)


def test_gpu_memory_is_none_without_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert memory.gpu_memory() is None
    assert memory.gpu_device_count() is None


class FakeNvml:
    """The slice of pynvml (nvidia-ml-py) that gpu_memory uses, for one 16 GiB GPU."""

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
    reading = memory.gpu_memory(0)
    assert (reading.name, reading.used_bytes, reading.total_bytes) == ("Tesla T4", 3 << 30, 16 << 30)
    assert reading.used_fraction == 3 / 16
    assert {p.pid: p.used_bytes for p in reading.processes} == {101: 1 << 30, 102: None}
    assert memory.gpu_memory(1) is None  # no such device
    assert memory.gpu_device_count() == 1
    assert fake.initialised == 0  # every init shut down


def test_gpu_memory_tolerates_a_refused_process_list(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(compute=[(7, 5 << 20)], graphics_error=True))
    assert [(p.pid, p.used_bytes) for p in memory.gpu_memory().processes] == [(7, 5 << 20)]
