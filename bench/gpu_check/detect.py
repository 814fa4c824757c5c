"""What a GPU host offers, without failing on anything missing: `mme gpu-check detect`, and
the preflight every `mme gpu-check run` starts with (:func:`preflight_lines`: a few seconds,
before any step, so a run that dies later still said what the host had).

The facts come as a :class:`HostFacts`; :func:`shell_assignments` prints them as quoted shell
assignments (``TORCH_CUDA=1``, ``GPU_COUNT=1``, ...) that tests/gpu/gpu_check.sh evaluates.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, fields

from mme.fsutil import gzip_backend
from mme.versions import release, same_tensorrt


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
    cuda_build: str = ""  # the CUDA PyTorch was built for (torch.version.cuda)
    driver: str = ""  # the NVIDIA driver (nvidia-smi), "" when none answers
    gpu_memory_mib: int = 0  # GPU 0's total memory as the driver reports it
    grpcio: str = ""
    protobuf: str = ""
    config_schema: str = ""  # where config.pbtxt's schema comes from (packager.model_config)
    gzip: str = ""  # the tarballs' compressor here: isal, or zlib where python-isal is missing
    libpython: str = ""  # "" when the python-backend stub's libpython is found, else why not
    network_namespace: str = ""  # "" when Triton can run in a private network namespace, else why not

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
        from serving.monitor.memory import gpu_compute_capability, gpu_device_count  # noqa: PLC0415 - detection must not fail on a host that breaks it

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

        facts.cuda_build = str(torch.version.cuda or "")
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


def _driver(facts: HostFacts) -> None:
    """Driver and GPU memory from nvidia-smi (there with every driver, nvidia-ml-py or not)."""
    if not facts.nvidia_smi:
        return
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"gpu-check: nvidia-smi failed ({_first_line(exc)})", file=sys.stderr)
        return
    first = (done.stdout.strip().splitlines() or [""])[0].split(",")
    if done.returncode == 0 and len(first) == 2:
        facts.driver = first[0].strip()
        facts.gpu_memory_mib = int(float(first[1])) if first[1].strip().replace(".", "", 1).isdigit() else 0


def _software(facts: HostFacts) -> None:
    """What the packaging and serving code falls back on, and what Triton's python stub needs."""
    facts.grpcio = _version("grpcio") or ""
    facts.protobuf = _version("protobuf") or ""
    try:
        from packager.model_config import SCHEMA_SOURCE  # noqa: PLC0415 - detection must not fail on a host that breaks it

        facts.config_schema = SCHEMA_SOURCE
    except Exception as exc:  # noqa: BLE001 - the reason is the output
        facts.config_schema = f"unavailable: {_first_line(exc)}"

    facts.gzip = gzip_backend()
    try:
        from serving.triton.local import check_libpython  # noqa: PLC0415 - detection must not fail on a host that breaks it

        check_libpython()
    except Exception as exc:  # noqa: BLE001 - the reason is the output
        facts.libpython = _first_line(exc)
    try:
        from serving.triton.netns import namespace_support  # noqa: PLC0415 - detection must not fail on a host that breaks it

        facts.network_namespace = namespace_support().problem or ""
    except Exception as exc:  # noqa: BLE001 - the reason is the output
        facts.network_namespace = _first_line(exc)


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
    _driver(facts)
    _software(facts)
    try:
        facts.tensorrt, facts.tensorrt_reason = tensorrt_status()
    except Exception as exc:  # noqa: BLE001 - the reason is the output
        facts.tensorrt_reason = f"could not check TensorRT: {exc}"
    facts.onnxruntime_cuda = _onnxruntime_cuda()
    try:
        from serving.triton.docker import docker_engine_problem  # noqa: PLC0415 - detection must not fail on a host that breaks it

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


def preflight_lines(facts: HostFacts) -> list[str]:
    """What this host has, one line per part the steps rely on, for people."""
    gpu = (f"{facts.gpu_count} x {facts.gpu_name} (compute capability {facts.compute_capability}, "
           f"{facts.gpu_memory_mib or '?'} MiB)" if facts.torch_cuda else f"none usable ({facts.no_gpu_reason})")
    nvml = "unavailable" if facts.nvml_gpus == -1 else f"{facts.nvml_gpus} GPU(s)"
    return [
        f"python {facts.python}; torch {facts.torch or 'absent'} built for CUDA {facts.cuda_build or '-'}; "
        f"driver {facts.driver or 'not found (nvidia-smi)'}",
        f"GPU: {gpu}; NVML: {nvml}",
        f"TensorRT: {facts.tensorrt if facts.tensorrt and not facts.tensorrt_reason else 'absent'}"
        f"{' (' + facts.tensorrt_reason + ')' if facts.tensorrt_reason else ''}; "
        f"Torch-TensorRT {facts.torch_tensorrt or 'absent'}; ONNX Runtime CUDA: {'yes' if facts.onnxruntime_cuda else 'no'}",
        f"grpcio {facts.grpcio or 'absent'}, protobuf {facts.protobuf or 'absent'}: config.pbtxt schema from "
        f"{facts.config_schema}",
        f"tarballs gzip through {facts.gzip}{'' if facts.gzip == 'isal' else ' (python-isal absent: slower, same format)'}",
        f"Triton (nvidia-pytriton) {facts.pytriton or 'absent'}, tritonclient {facts.tritonclient or 'absent'}; "
        f"python-backend stub's libpython: {facts.libpython or 'found'}; "
        f"private network namespace (unshare): {facts.network_namespace or 'available'}",
        f"Docker: {facts.docker}",
    ]
