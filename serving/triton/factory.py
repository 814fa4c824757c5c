"""Pick the Triton server for this host: the tritonserver installed in this image when
``MME_TRITONSERVER`` names it (the serving image), NVIDIA's container where a GPU and
Docker are usable, else the wheel's tritonserver (CPU, python backend)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from mme.errors import UsageError
from serving.triton.base import TritonServer
from serving.triton.config import TritonServerConfig
from serving.triton.docker import DockerTritonServer, docker_engine_problem
from serving.triton.local import LocalTritonServer
from serving.triton.system import BINARY_ENV, SystemTritonServer

KINDS = ("auto", "local", "docker", "system")


def nvidia_gpu_present() -> bool:
    """True when the NVIDIA driver reports at least one GPU (NVML, else nvidia-smi)."""
    from serving.memory import gpu_device_count

    count = gpu_device_count()
    if count is not None:
        return count > 0
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and "GPU" in done.stdout


def choose_kind(kind: str = "auto", docker: str = "docker") -> str:
    if kind not in KINDS:
        raise UsageError(f"unknown Triton server kind {kind!r}; choose one of: {', '.join(KINDS)}")
    if kind != "auto":
        return kind
    if os.environ.get(BINARY_ENV):
        return "system"
    return "docker" if nvidia_gpu_present() and docker_engine_problem(docker) is None else "local"


SERVER_CLASSES: dict[str, type[TritonServer]] = {
    "local": LocalTritonServer, "docker": DockerTritonServer, "system": SystemTritonServer,
}


def server_class(kind: str = "auto", docker: str = "docker") -> type[TritonServer]:
    """The class ``create_server`` would instantiate for ``kind``."""
    return SERVER_CLASSES[choose_kind(kind, docker)]


def create_server(
    kind: str = "auto",
    config: TritonServerConfig | None = None,
    *,
    image: str | None = None,
    model_root: Path | None = None,
    cache_dir: Path | None = None,
    docker: str = "docker",
) -> TritonServer:
    """A started-on-demand server of ``kind``: "local", "docker", "system" or "auto".

    ``model_root`` is the model cache (``<root>/<hash>/model`` per target): the docker
    server mounts it at /opt/ml/models; ``cache_dir`` is where the local server keeps its
    copy of the wheel's backends when site-packages is read-only."""
    chosen = choose_kind(kind, docker)
    if chosen == "docker":
        return DockerTritonServer(config, image=image, model_root=model_root, docker=docker)
    if chosen == "system":
        return SystemTritonServer(config)
    return LocalTritonServer(config, cache_dir=cache_dir)


def choose_cache_root(requested: Path | None, required: Path | None) -> Path | None:
    """The model cache root: the server's required one (SageMaker's /opt/ml/models for
    Triton 2.70+), which a different --cache-dir cannot replace; else the requested one."""
    if required is None:
        return requested
    if requested is not None and Path(requested).resolve() != Path(required):
        raise UsageError(
            f"--cache-dir {requested}: this Triton loads models only from {required}/<hash>/model "
            f"(as SageMaker lays them out); drop --cache-dir or pass --cache-dir {required}"
        )
    return Path(required)
