"""What a GPU host offers, without failing on anything missing: `mme gpu-check detect`.

The facts come as a :class:`HostFacts`; :func:`shell_assignments` prints them as quoted shell
assignments (``TORCH_CUDA=1``, ``GPU_COUNT=1``, ...) that tests/gpu/gpu_check.sh evaluates.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shlex
import shutil
import sys
from dataclasses import asdict, dataclass, fields


@dataclass
class HostFacts:
    python: str = "%d.%d.%d" % sys.version_info[:3]
    torch: str | None = None
    torch_cuda: bool = False
    gpu_count: int = 0
    gpu_name: str = ""
    compute_capability: str = ""
    nvml_gpus: int = -1  # -1: NVML unavailable (nvidia-ml-py missing or no driver)
    nvidia_smi: bool = False
    tensorrt: str = ""
    tensorrt_reason: str = ""  # why TensorRT is missing or unusable here; "" when usable
    torch_tensorrt: str = ""
    onnxruntime_cuda: bool = False
    pytriton: str = ""
    tritonclient: str = ""
    pytest: bool = False
    project_tests: bool = False  # the project's test dependencies import
    docker: str = ""  # "ok" or why the Docker engine cannot be used
    no_gpu_reason: str = ""  # why PyTorch cannot use a GPU; "" when it can

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _version(*dists: str) -> str | None:
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()
    return text[0] if text else type(exc).__name__


def tensorrt_status() -> tuple[str, str]:
    """(version or "", why it is missing or differs from the release's, or "")."""
    from mme.versions import release, same_tensorrt

    wanted = release().tensorrt
    installed = _version("tensorrt", "tensorrt-cu13", "tensorrt-cu12")
    if installed is None:
        return "", (f"the tensorrt package is not installed: run make install-gpu (pip's --extra-index-url "
                    f"https://pypi.nvidia.com: PyPI alone has only a stub of tensorrt-cu13-libs {wanted} that downloads "
                    "from NVIDIA's index), or use the builder image (make docker-package)")
    try:
        import tensorrt  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - the reason is the output
        return "", f"tensorrt {installed} is installed but does not import ({_first_line(exc)})"
    if wanted and not same_tensorrt(installed, wanted):
        return installed, (f"tensorrt {installed} is installed but release {release().name} serves plans of "
                           f"TensorRT {wanted}: plans built here would not load there")
    return installed, ""


def _nvml(facts: HostFacts) -> None:
    try:
        from serving.memory import gpu_compute_capability, gpu_device_count

        count = gpu_device_count()
        facts.nvml_gpus = -1 if count is None else count
        facts.compute_capability = gpu_compute_capability(0) or ""
    except Exception as exc:  # noqa: BLE001 - detection must not fail; NVML counts as unavailable
        facts.nvml_gpus = -1
        print(f"gpu-check: reading NVML failed ({_first_line(exc)})", file=sys.stderr)


def _torch(facts: HostFacts) -> None:
    if not facts.torch:
        facts.no_gpu_reason = "PyTorch is not installed in this Python"
        return
    try:
        import torch

        facts.torch_cuda = bool(torch.cuda.is_available())
        if facts.torch_cuda:
            facts.gpu_count = torch.cuda.device_count()
            facts.gpu_name = torch.cuda.get_device_name(0)
            major, minor = torch.cuda.get_device_capability(0)
            facts.compute_capability = f"{major}.{minor}"
        elif facts.nvml_gpus > 0:
            facts.no_gpu_reason = (
                f"the driver sees {facts.nvml_gpus} GPU(s) but PyTorch cannot use them "
                f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}; a CPU-only torch or a driver too old?)"
            )
        else:
            nvml = "NVML is unavailable" if facts.nvml_gpus == -1 else "NVML reports no GPU"
            facts.no_gpu_reason = f"PyTorch sees no CUDA device and {nvml}"
    except Exception as exc:  # noqa: BLE001 - the reason is the output
        facts.no_gpu_reason = f"importing torch failed: {_first_line(exc)}"


def _onnxruntime_cuda() -> bool:
    if not _importable("onnxruntime"):
        return False
    try:
        import onnxruntime

        return "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    except Exception as exc:  # noqa: BLE001 - a broken onnxruntime is no CUDA provider
        print(f"gpu-check: onnxruntime does not import ({_first_line(exc)})", file=sys.stderr)
        return False


def detect() -> HostFacts:
    """What this host offers, without failing on anything missing."""
    facts = HostFacts(
        torch=_version("torch"),
        nvidia_smi=shutil.which("nvidia-smi") is not None,
        torch_tensorrt=_version("torch-tensorrt") or "",
        pytriton=_version("nvidia-pytriton") or "",
        tritonclient=_version("tritonclient") or "",
        pytest=_importable("pytest"),
        project_tests=all(_importable(m) for m in ("pytest", "boto3", "locust", "aiohttp", "tritonclient")),
    )
    _nvml(facts)
    _torch(facts)
    try:
        facts.tensorrt, facts.tensorrt_reason = tensorrt_status()
    except Exception as exc:  # noqa: BLE001 - the reason is the output
        facts.tensorrt_reason = f"could not check TensorRT: {exc}"
    facts.onnxruntime_cuda = _onnxruntime_cuda()
    try:
        from serving.triton.docker import docker_engine_problem

        facts.docker = docker_engine_problem(timeout_s=10.0) or "ok"
    except Exception as exc:  # noqa: BLE001 - the reason is the output
        facts.docker = f"unknown ({_first_line(exc)})"
    return facts


def shell_assignments(facts: HostFacts) -> str:
    """One ``KEY=value`` line per fact, values shell-quoted; booleans as 0/1, None as ''."""
    lines = []
    for item in fields(facts):
        value = getattr(facts, item.name)
        if isinstance(value, bool):
            value = int(value)
        elif value is None:
            value = ""
        lines.append(f"{item.name.upper()}={shlex.quote(str(value))}")
    return "\n".join(lines)
