"""Triton python-backend model ``gpu-metrics``: how much memory the models on this endpoint use.

Deployed by ``mme capacity --endpoint`` beside the copies it loads (the articles read GPU
memory through such a model, since a SageMaker endpoint gives no shell). Each request
answers with four outputs:

  used_bytes   INT64  memory in use
  total_bytes  INT64  memory there is
  utilization  FP32   used / total
  source       BYTES  where the figures come from

Sources, first that works: ``nvml:pynvml`` (nvidia-ml-py), ``nvml:ctypes`` (libnvidia-ml.so.1,
which the NVIDIA container runtime mounts into every GPU container) - memory used and total
summed over the visible GPUs; without a GPU, the resident memory of the model-serving
process tree (the Triton server, this stub's parent, and all its children: every loaded
model's stub) against the host's RAM: ``host-rss:psutil`` or ``host-rss:proc`` (read from
/proc when psutil does not import). Copied verbatim into the model tarball; nothing is generated.
"""

import ctypes
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def _nvml_pynvml():
    import pynvml

    pynvml.nvmlInit()
    try:
        used = total = 0
        for index in range(pynvml.nvmlDeviceGetCount()):
            info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
            used += int(info.used)
            total += int(info.total)
        return used, total
    finally:
        pynvml.nvmlShutdown()


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def _nvml_ctypes():
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    if lib.nvmlInit_v2() != 0:
        raise OSError("nvmlInit failed")
    try:
        count = ctypes.c_uint()
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            raise OSError("nvmlDeviceGetCount failed")
        used = total = 0
        for index in range(count.value):
            handle = ctypes.c_void_p()
            memory = _NvmlMemory()
            if lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
                raise OSError("nvmlDeviceGetHandleByIndex failed")
            if lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) != 0:
                raise OSError("nvmlDeviceGetMemoryInfo failed")
            used += memory.used
            total += memory.total
        return used, total
    finally:
        lib.nvmlShutdown()


def _host_psutil(root):
    import psutil

    parent = psutil.Process(root)
    used = 0
    for proc in [parent] + parent.children(recursive=True):
        try:
            used += proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return used, psutil.virtual_memory().total


def _host_proc(root):
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    used = 0
    for pid in tree:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        used += int(line.split()[1]) * 1024
        except OSError:
            continue
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    return used, total


def read_memory():
    """(used bytes, total bytes, source)."""
    if os.environ.get("MME_METRICS_SOURCE", "") != "host":  # lets a GPU host test the fallback
        for source, reader in (("nvml:pynvml", _nvml_pynvml), ("nvml:ctypes", _nvml_ctypes)):
            try:
                used, total = reader()
            except Exception:
                continue
            if total > 0:
                return used, total, source
    root = os.getppid()  # the Triton server that started this stub
    try:
        used, total = _host_psutil(root)
        return used, total, "host-rss:psutil"
    except ImportError:
        used, total = _host_proc(root)
        return used, total, "host-rss:proc"


class TritonPythonModel:
    def initialize(self, args):
        read_memory()  # fail the load, not the first request, if nothing can be read

    def execute(self, requests):
        responses = []
        for _ in requests:
            try:
                used, total, source = read_memory()
            except Exception as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"cannot read memory: {exc}")))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("used_bytes", np.array([used], dtype=np.int64)),
                pb_utils.Tensor("total_bytes", np.array([total], dtype=np.int64)),
                pb_utils.Tensor("utilization", np.array([used / total if total else 0.0], dtype=np.float32)),
                pb_utils.Tensor("source", np.array([source.encode()], dtype=np.object_)),
            ]))
        return responses
