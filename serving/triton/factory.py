"""Pick the Triton server for this host: the tritonserver installed in this image when
``MME_TRITONSERVER`` names it (the serving image), NVIDIA's container where a GPU and
Docker are usable, else the wheel's tritonserver (CPU, python backend)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

from mme.errors import UsageError
from serving.triton.base import TritonServer, TritonServerConfig
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


def create_server(
    kind: str = "auto",
    config: TritonServerConfig | None = None,
    *,
    image: str | None = None,
    model_dirs: Sequence[Path] = (),
    cache_dir: Path | None = None,
    docker: str = "docker",
) -> TritonServer:
    """A started-on-demand server of ``kind``: "local", "docker", "system" or "auto"."""
    chosen = choose_kind(kind, docker)
    if chosen == "docker":
        return DockerTritonServer(config, image=image, model_dirs=model_dirs, docker=docker)
    if chosen == "system":
        return SystemTritonServer(config)
    return LocalTritonServer(config, cache_dir=cache_dir)
