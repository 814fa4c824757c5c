"""Triton in NVIDIA's container, for GPU hosts: ``docker run --gpus all ... tritonserver``
in SageMaker multi-model mode, the way SageMaker runs its Triton image.

The model cache (``model_root``, holding ``<hash>/model`` per target) is mounted read-only
at ``/opt/ml/models``, where SageMaker puts it, so every load url has the form Triton 2.70+
requires (``/opt/ml/models/<hash>/model``); :meth:`DockerTritonServer.model_url` maps a
host directory to that path. The container's empty model repository is mounted from the
host too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import psutil

from mme.versions import release
from serving.triton.base import (
    SAGEMAKER_MODEL_ROOT,
    ModelRootError,
    TritonServer,
    TritonServerConfig,
    TritonServerError,
    alive,
    port_arguments,
)

CONTAINER_REPOSITORY = "/opt/mme/model-repository"


class DockerUnavailableError(TritonServerError):
    """No docker command, no reachable engine, or the image is not present."""


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else "no output"


def docker_engine_problem(docker: str = "docker", timeout_s: float = 15.0) -> str | None:
    """None when ``docker`` runs and reaches an engine, else why not (one line)."""
    if shutil.which(docker) is None:
        return f"the docker command ({docker}) is not installed"
    try:
        done = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )
    except subprocess.TimeoutExpired:
        return f"'{docker} info' did not answer within {timeout_s:g} s"
    except OSError as exc:
        return f"cannot run {docker}: {exc.strerror}"
    if done.returncode != 0:
        return f"the Docker engine is not reachable ({_first_line(done.stderr or done.stdout)})"
    return None


class DockerTritonServer(TritonServer):
    """tritonserver inside ``image`` (default: the release's NGC Triton container)."""

    def __init__(
        self,
        config: TritonServerConfig | None = None,
        *,
        image: str | None = None,
        model_root: Path | None = None,
        shm_size: str = "2g",
        gpus: str | None = "all",
        docker: str = "docker",
        container_name: str | None = None,
    ) -> None:
        super().__init__(config)
        self.image = image or release().triton_container
        self.model_root = Path(model_root).resolve() if model_root is not None else None
        self.shm_size = shm_size
        self.gpus = gpus
        self.docker = docker
        self.container_name = container_name or f"mme-triton-{uuid.uuid4().hex[:12]}"

    def _before_start(self) -> None:
        problem = docker_engine_problem(self.docker)
        if problem:
            raise DockerUnavailableError(
                f"cannot run Triton in Docker: {problem}; install Docker and the NVIDIA Container Toolkit "
                "and start the engine, or use the local server (kind='local')"
            )
        inspect = subprocess.run(
            [self.docker, "image", "inspect", self.image], capture_output=True, text=True, timeout=60, check=False
        )
        if inspect.returncode != 0:
            raise DockerUnavailableError(
                f"the image {self.image} is not present on this host; pull it first: docker pull {self.image}"
            )

    def command(self, model_repository: Path) -> list[str]:
        config = self.config
        ports = [p for p in (config.sagemaker_port, config.http_port, config.grpc_port, config.metrics_port) if p]
        argv = [self.docker, "run", "--rm", "--name", self.container_name]
        if self.gpus:
            argv += ["--gpus", self.gpus]
        argv += ["--shm-size", self.shm_size, "--ulimit", "memlock=-1", "--ulimit", "stack=67108864"]
        for port in ports:  # same number inside and out; published on the configured host only
            argv += ["-p", f"{config.host}:{port}:{port}"]
        argv += ["-e", "SAGEMAKER_MULTI_MODEL=true", "-e", f"SAGEMAKER_BIND_TO_PORT={config.sagemaker_port}"]
        for key, value in sorted(config.env.items()):
            argv += ["-e", f"{key}={value}"]
        argv += ["-v", f"{model_repository}:{CONTAINER_REPOSITORY}:ro"]
        if self.model_root is not None:
            argv += ["-v", f"{self.model_root}:{SAGEMAKER_MODEL_ROOT}:ro"]
        argv += [
            self.image,
            "tritonserver",
            f"--model-repository={CONTAINER_REPOSITORY}",
            "--model-control-mode=explicit",
            *port_arguments(config, bind_host="0.0.0.0"),  # inside the container; -p limits exposure
            f"--log-verbose={config.log_verbose}",
            *config.extra_args,
        ]
        return argv

    def _environment(self) -> dict[str, str]:
        return dict(os.environ)  # the server's variables go to the container with -e

    def model_url(self, model_dir: Path) -> str:
        """``<model_root>/<hash>/model`` on the host -> ``/opt/ml/models/<hash>/model`` inside."""
        if self.model_root is None:
            raise ModelRootError("DockerTritonServer has no model_root mounted; create it with model_root=<the model cache>")
        try:
            relative = Path(model_dir).resolve().relative_to(self.model_root)
        except ValueError:
            raise ModelRootError(
                f"{model_dir} is outside the mounted model cache {self.model_root}; the container cannot read it"
            ) from None
        return str(SAGEMAKER_MODEL_ROOT / relative.as_posix())

    def container_pid(self) -> int | None:
        """The container's main process as the host sees it, while the container runs."""
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            done = subprocess.run(
                [self.docker, "inspect", "--format", "{{.State.Pid}}", self.container_name],
                capture_output=True, text=True, timeout=10, check=False,
            )
            if done.returncode == 0 and done.stdout.strip().isdigit() and int(done.stdout) > 0:
                return int(done.stdout)
        return None

    def pids(self) -> list[int]:
        """The docker client plus the container's processes (tritonserver and its stubs)."""
        found = set(super().pids())
        pid = self.container_pid() if self.is_running() else None
        if pid is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                root = psutil.Process(pid)
                found.update(p.pid for p in [root, *root.children(recursive=True)] if alive(p))
        return sorted(found)

    def _before_terminate(self) -> None:
        grace = max(1, int(self.config.stop_grace_s))
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(
                [self.docker, "stop", "--time", str(grace), self.container_name],
                capture_output=True, timeout=grace + 30, check=False,
            )
