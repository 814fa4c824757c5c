"""Triton in NVIDIA's container, for GPU hosts: ``docker run --gpus all ... tritonserver``
in SageMaker multi-model mode, the way SageMaker runs its Triton image.

The model cache (``model_root``, holding ``<hash>/model`` per target) is mounted read-only
at ``/opt/ml/models``, where SageMaker puts it, so every load url has the form Triton 2.70+
requires (``/opt/ml/models/<hash>/model``); :meth:`DockerTritonServer.model_url` maps a
host directory to that path.

The container runs as SageMaker runs it: when the image carries the label
``com.amazonaws.sagemaker.capabilities.multi-models=true`` (NVIDIA's SageMaker build, with
``/usr/bin/serve``), its command is ``serve`` with the settings as ``-e`` variables and our
flags in ``SAGEMAKER_TRITON_ADDITIONAL_ARGS``; otherwise ``tritonserver`` with the argv of
serve's Python port (:mod:`serving.triton.sagemaker_serve`) over an empty model repository
mounted from the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

from mme.versions import release
from serving.triton.base import TritonServer
from serving.triton.config import SAGEMAKER_MODEL_ROOT, ModelRootError, TritonServerConfig, TritonServerError
from serving.triton.processes import alive, tree_of
from serving.triton.sagemaker_serve import (
    ADDITIONAL_ARGS,
    GPU_LIMIT,
    MULTI_MODEL_LABEL,
    SINGLE_MODEL_REPOSITORY,
    additional_args,
    config_arguments,
    nvidia_smi_line_count,
    sagemaker_environment,
    serve_arguments,
    server_environment,
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


def image_labels(docker: str, image: str, timeout_s: float = 60.0) -> dict[str, str] | None:
    """The image's labels (``docker image inspect``), or None when it cannot be inspected."""
    try:
        done = subprocess.run([docker, "image", "inspect", image], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
        if done.returncode == 0:
            return dict(json.loads(done.stdout)[0].get("Config", {}).get("Labels") or {})
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError, AttributeError):
        pass
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
        sagemaker_serve: bool | None = None,
    ) -> None:
        """``sagemaker_serve``: run the image's ``serve`` (True) or ``tritonserver`` (False);
        None: ``serve`` when the image carries the SageMaker multi-model label."""
        super().__init__(config)
        self.requested_sagemaker_serve = sagemaker_serve
        self._image_serves: bool | None = None
        self.image = image or release().triton_container
        self.model_root = Path(model_root).resolve() if model_root is not None else None
        self.shm_size = shm_size
        self.gpus = gpus
        self.docker = docker
        self.container_name = container_name or f"mme-triton-{uuid.uuid4().hex[:12]}"

    def isolates_network(self) -> bool:
        return False  # the container has its own network; its ports are published on config.host (127.0.0.1)

    def _before_start(self) -> None:
        problem = docker_engine_problem(self.docker)
        if problem:
            raise DockerUnavailableError(
                f"cannot run Triton in Docker: {problem}; install Docker and the NVIDIA Container Toolkit "
                "and start the engine, or use the local server (kind='local')"
            )
        labels = image_labels(self.docker, self.image)
        if labels is None:
            raise DockerUnavailableError(
                f"the image {self.image} is not present on this host; pull it first: docker pull {self.image}"
            )
        self._image_serves = labels.get(MULTI_MODEL_LABEL) == "true"

    def runs_serve(self) -> bool:
        """Whether the container's command is the image's SageMaker ``serve`` script."""
        if self.requested_sagemaker_serve is not None:
            return self.requested_sagemaker_serve
        if self._image_serves is None:  # command() before start(): look now
            self._image_serves = (image_labels(self.docker, self.image) or {}).get(MULTI_MODEL_LABEL) == "true"
        return self._image_serves

    def container_environment(self) -> dict[str, str]:
        """The variables given to the container (``-e``): ``config.env``, then serve's settings
        (the config's gRPC/metrics ports as SAGEMAKER_TRITON_* unless the user set them)."""
        return {**self.config.env, **sagemaker_environment(self.config)}

    def command(self, model_repository: Path) -> list[str]:
        config = self.config
        serve = self.runs_serve()
        ports = [p for p in (config.sagemaker_port, config.http_port, config.grpc_port, config.metrics_port) if p]
        argv = [self.docker, "run", "--rm", "--name", self.container_name]
        if self.gpus:
            argv += ["--gpus", self.gpus]
        argv += ["--shm-size", self.shm_size, "--ulimit", "memlock=-1", "--ulimit", "stack=67108864"]
        for port in ports:  # same number inside and out; published on the configured host only
            argv += ["-p", f"{config.host}:{port}:{port}"]
        env = self.container_environment()
        ours = config_arguments(config, "0.0.0.0")  # inside the container; -p limits exposure
        if serve:
            value = additional_args(env, ours, config.extra_args)
            env = {k: v for k, v in env.items() if k != ADDITIONAL_ARGS} | ({ADDITIONAL_ARGS: value} if value else {})
        else:
            env = server_environment(env)  # what tritonserver would get from serve
        for key, value in env.items():
            argv += ["-e", f"{key}={value}"]
        # single-model mode: the model's repository where a real-time endpoint has it (serve reads it there)
        repository = SINGLE_MODEL_REPOSITORY if config.single_model else CONTAINER_REPOSITORY
        if not serve or config.single_model:
            argv += ["-v", f"{model_repository}:{repository}:ro"]
        if self.model_root is not None:
            argv += ["-v", f"{self.model_root}:{SAGEMAKER_MODEL_ROOT}:ro"]
        if serve:
            return [*argv, self.image, "serve"]
        gpu_count = nvidia_smi_line_count() if self.gpus and env.get(GPU_LIMIT) else 0
        args = serve_arguments(env, model_repository=repository, gpu_count=gpu_count, extra=ours,
                               default_model=config.default_model)
        return [*argv, self.image, "tritonserver", *args, *config.extra_args]

    def _startup_notices(self) -> list[str]:
        if self.runs_serve():
            return []
        return [f"{self.image} has no SageMaker serve script (no LABEL {MULTI_MODEL_LABEL}=true); "
                "started tritonserver with the arguments serve would give it"]

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
            found.update(p.pid for p in tree_of(pid) if alive(p))
        return sorted(found)

    def _before_terminate(self) -> None:
        grace = max(1, int(self.config.stop_grace_s))
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(
                [self.docker, "stop", "--time", str(grace), self.container_name],
                capture_output=True, timeout=grace + 30, check=False,
            )
