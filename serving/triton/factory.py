"""The Triton server kinds, one table (:data:`SERVER_KINDS`): what each kind is, what it can
run, whether it runs in a container, how it is built and the model root it requires.
:func:`choose_kind` picks one for this host ("auto": the tritonserver installed in this image
when ``MME_TRITONSERVER`` names it, NVIDIA's container where a GPU and Docker are usable, else
the wheel's tritonserver: CPU, python backend) and :func:`create_server` builds it.

Adding a kind is a module with its :class:`~serving.triton.base.TritonServer` subclass and one
row here: ``--server``'s choices, the startup checks (what it can run), the model cache's root
and the exposure warnings all read the row.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable

from mme.errors import UsageError
from serving.monitor.memory import gpu_device_count
from serving.triton.base import TritonServer
from serving.triton.config import TritonServerConfig
from serving.triton.docker import DockerTritonServer, docker_engine_problem
from serving.triton.local import LocalTritonServer
from serving.triton.system import BINARY_ENV, SystemTritonServer

if TYPE_CHECKING:
    from packager.manifest_records import TritonSettings

AUTO = "auto"
# Triton's rule: the backend that runs each platform of a config.pbtxt
PLATFORM_BACKENDS = MappingProxyType({
    "onnxruntime_onnx": "onnxruntime", "tensorrt_plan": "tensorrt", "pytorch_libtorch": "pytorch",
    "tensorflow_savedmodel": "tensorflow", "tensorflow_graphdef": "tensorflow",
})


@dataclass(frozen=True)
class ServerOptions:
    """What a kind is built from; each kind takes the fields it needs."""

    config: TritonServerConfig | None = None
    image: str | None = None  # docker: the Triton image (default: the release's)
    model_root: Path | None = None  # the model cache (<root>/<hash>/model per target), mounted by docker
    cache_dir: Path | None = None  # local: where the wheel's backends are copied when site-packages is read-only
    docker: str = "docker"


@dataclass(frozen=True)
class ServerKind:
    """One kind of Triton server: a row of :data:`SERVER_KINDS`."""

    name: str  # what --server takes
    description: str  # how messages name it: "the <name> server (<description>)"
    triton: str  # whose Triton it runs, as a refusal names it ("NVIDIA's")
    server: type[TritonServer]  # its class: how it starts and stops, the model root it requires
    build: Callable[[ServerOptions], TritonServer]
    backends: frozenset[str] | None  # the Triton backends its tritonserver has (None: all of SageMaker's image's)
    # Triton runs in a container of its own: its own network (ports published on 127.0.0.1) and
    # a python-backend model's code does not run as this user.
    in_container: bool
    preference: int  # "auto" takes the available kind of lowest preference
    available: Callable[[str], bool]  # whether "auto" may take it on this host (the docker command given)

    def build_server(self, config: TritonServerConfig | None = None, **options: Any) -> TritonServer:
        """A server of this kind (not started); ``options``: the rest of :class:`ServerOptions`."""
        return self.build(ServerOptions(config, **options))

    def required_model_root(self) -> Path | None:
        """The one directory it loads models from (the model cache must live there), or None."""
        return self.server.required_model_root()

    def runs(self, backend: str | None) -> bool:
        """Whether its tritonserver has ``backend`` (None: not known, taken as yes)."""
        return self.backends is None or backend is None or backend in self.backends

    @property
    def text(self) -> str:
        return f"the {self.name} server ({self.description})"


def nvidia_gpu_present() -> bool:
    """True when the NVIDIA driver reports at least one GPU (NVML, else nvidia-smi)."""
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


SERVER_KINDS = MappingProxyType({kind.name: kind for kind in (
    ServerKind(
        name="local", description="the nvidia-pytriton wheel's CPU tritonserver, python backend only",
        triton="the nvidia-pytriton wheel's", server=LocalTritonServer,
        build=lambda o: LocalTritonServer(o.config, cache_dir=o.cache_dir),
        backends=frozenset({"python"}), in_container=False,
        preference=3, available=lambda docker: True),
    ServerKind(
        name="docker", description="NVIDIA's image under Docker, GPU hosts",
        triton="NVIDIA's", server=DockerTritonServer,
        build=lambda o: DockerTritonServer(o.config, image=o.image, model_root=o.model_root, docker=o.docker),
        backends=None, in_container=True,
        preference=2, available=lambda docker: nvidia_gpu_present() and docker_engine_problem(docker) is None),
    ServerKind(
        name="system", description="the tritonserver of this image, e.g. SageMaker's Triton image",
        triton="SageMaker's", server=SystemTritonServer,
        build=lambda o: SystemTritonServer(o.config),
        backends=None, in_container=False,
        preference=1, available=lambda docker: bool(os.environ.get(BINARY_ENV))),
)})
SERVER_CHOICES = (AUTO, *SERVER_KINDS)  # what --server takes


def by_preference() -> list[ServerKind]:
    """The kinds in the order "auto" tries them."""
    return sorted(SERVER_KINDS.values(), key=lambda kind: kind.preference)


def server_help() -> str:
    """--server's help, from the table."""
    kinds = "; ".join(f"{kind.name}: {kind.description}" for kind in SERVER_KINDS.values())
    order = ", ".join(kind.name for kind in by_preference())
    return f"the Triton server: {kinds}; default auto: the first of {order} this host can run"


def choose_kind(kind: str = AUTO, docker: str = "docker") -> ServerKind:
    if kind not in SERVER_CHOICES:
        raise UsageError(f"unknown Triton server kind {kind!r}; choose one of: {', '.join(SERVER_CHOICES)}")
    if kind != AUTO:
        return SERVER_KINDS[kind]
    return next(k for k in by_preference() if k.available(docker))


def create_server(
    kind: str | ServerKind = AUTO,
    config: TritonServerConfig | None = None,
    *,
    image: str | None = None,
    model_root: Path | None = None,
    cache_dir: Path | None = None,
    docker: str = "docker",
) -> TritonServer:
    """A started-on-demand server of ``kind`` (a row, or its name or "auto").

    ``model_root`` is the model cache (``<root>/<hash>/model`` per target): the docker
    server mounts it at /opt/ml/models; ``cache_dir`` is where the local server keeps its
    copy of the wheel's backends when site-packages is read-only."""
    chosen = kind if isinstance(kind, ServerKind) else choose_kind(kind, docker)
    return chosen.build_server(config, image=image, model_root=model_root, cache_dir=cache_dir, docker=docker)


def backend_of(triton: "TritonSettings") -> str | None:
    """The Triton backend that runs a model of these settings (its backend, or its platform's)."""
    if triton.backend:
        return triton.backend
    return PLATFORM_BACKENDS.get(triton.platform or "", triton.platform)


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
