"""How one Triton server is run (:class:`TritonServerConfig`: ports, logs, SageMaker settings,
timeouts), the errors a server raises, and the SageMaker model-root rules the servers share.

Port 0 in a config means "pick a free port at start()": :func:`resolve_ports` does that.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Mapping

from mme.errors import MmeError

DEFAULT_SAGEMAKER_PORT = 8080
# Where SageMaker puts each target: <root>/<hash>/model. Triton 2.70+ refuses (400) a load
# url outside it (src/sagemaker_server.cc: model_path_regex_).
SAGEMAKER_MODEL_ROOT = PurePosixPath("/opt/ml/models")
SAGEMAKER_ROOT_REQUIRED_SINCE = (2, 70)
# Where the local and system kinds run Triton (serving/triton/netns.py): "private", a network
# namespace of its own reached through Unix sockets; "host", this host's network (its SageMaker
# port on 0.0.0.0). MME_TRITON_NETWORK sets the default for every command.
NETWORKS = ("private", "host")
NETWORK_ENV = "MME_TRITON_NETWORK"


class TritonServerError(MmeError):
    """The Triton server could not be prepared, started or reached."""


class TritonStartupError(TritonServerError):
    """tritonserver exited or did not answer ``GET /ping`` in time."""


class ModelRootError(TritonServerError):
    """The model cache is somewhere this server cannot load models from."""


def default_network() -> str:
    """``$MME_TRITON_NETWORK`` when set, else ``private``."""
    return os.environ.get(NETWORK_ENV) or "private"


def check_network(network: str) -> str:
    if network not in NETWORKS:
        raise TritonServerError(f"unknown Triton network {network!r} (from --triton-network or ${NETWORK_ENV}); "
                                f"choose one of: {', '.join(NETWORKS)}")
    return network


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """``"2.71.0"`` -> (2, 71, 0); None for anything else."""
    parts = (text or "").strip().split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


@dataclass(frozen=True)
class TritonServerConfig:
    """How to run one Triton server. Port 0 means: pick a free port at start().

    The server is started as SageMaker's ``serve`` script starts it; ``sagemaker_env`` holds
    its ``SAGEMAKER_TRITON_*`` settings (and any other variable for the server's environment).
    A gRPC or metrics port given here becomes ``SAGEMAKER_TRITON_ALLOW_GRPC``/``_GRPC_PORT``
    (``_ALLOW_METRICS``/``_METRICS_PORT``) unless ``sagemaker_env`` or ``env`` sets them.
    """

    sagemaker_port: int = DEFAULT_SAGEMAKER_PORT  # the MME contract (SAGEMAKER_BIND_TO_PORT)
    http_port: int | None = 0  # Triton's own KServe v2 HTTP API; None: off, as in SageMaker's image
    grpc_port: int | None = 0  # None: gRPC off (unless SAGEMAKER_TRITON_ALLOW_GRPC says otherwise)
    metrics_port: int | None = 0  # None: Prometheus metrics off (unless SAGEMAKER_TRITON_ALLOW_METRICS)
    host: str = "127.0.0.1"  # Triton 2.51's SageMaker service ignores it and binds 0.0.0.0
    network: str = field(default_factory=default_network)  # one of NETWORKS
    log_dir: Path | None = None  # None: a temporary directory removed by stop()
    log_verbose: int | None = None  # None: serve's (SAGEMAKER_TRITON_LOG_VERBOSE, default true)
    env: Mapping[str, str] = field(default_factory=dict, hash=False)  # extra environment
    sagemaker_env: Mapping[str, str] = field(default_factory=dict, hash=False)  # SAGEMAKER_TRITON_* etc.
    extra_args: tuple[str, ...] = ()  # after everything, SAGEMAKER_TRITON_ADDITIONAL_ARGS included
    startup_timeout_s: float = 60.0
    stop_grace_s: float = 10.0  # SIGTERM, then SIGKILL after this long
    # Single-model (real-time endpoint) mode, as serve runs without SAGEMAKER_MULTI_MODEL=true:
    # Triton serves this repository (SageMaker's /opt/ml/model) and loads ``default_model`` at
    # start, the model ``POST /invocations`` runs. None: the MME contract (an empty repository).
    model_repository: Path | None = None
    default_model: str | None = None

    @property
    def single_model(self) -> bool:
        return self.default_model is not None

    def ports(self) -> dict[str, int | None]:
        return {
            "sagemaker": self.sagemaker_port,
            "http": self.http_port,
            "grpc": self.grpc_port,
            "metrics": self.metrics_port,
        }


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free on ``host`` now (all held open together, then released)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def resolve_ports(config: TritonServerConfig) -> TritonServerConfig:
    """The config with every port given as 0 replaced by a free port."""
    wanted = [name for name, port in config.ports().items() if port == 0]
    if not wanted:
        return config
    chosen = dict(zip(wanted, free_ports(len(wanted), config.host)))
    return replace(
        config,
        sagemaker_port=chosen.get("sagemaker", config.sagemaker_port),
        http_port=chosen.get("http", config.http_port),
        grpc_port=chosen.get("grpc", config.grpc_port),
        metrics_port=chosen.get("metrics", config.metrics_port),
    )
