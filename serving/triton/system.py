"""Triton installed on this system: the ``tritonserver`` of NVIDIA's container
(``/opt/tritonserver``, all native backends: TensorRT, PyTorch, ONNX Runtime, python), run
as a local child process. This is what ``mme serve`` uses inside the serving image
(docker/serving/Dockerfile), where there is no Docker to start another container and the
pytriton wheel's binary (python backend only) would lose the native backends.

Triton 2.70+ loads models only from ``/opt/ml/models/<hash>/model`` (the path SageMaker
uses), so :meth:`SystemTritonServer.required_model_root` asks for the model cache there
unless the server is known to be older. The version comes from ``$TRITON_SERVER_VERSION``
(set in NVIDIA's Triton images) or the matrix row of ``$MME_TRITON_RELEASE``.

The binary is, in order: the ``binary`` argument, ``$MME_TRITONSERVER``, ``tritonserver`` on
PATH, ``/opt/tritonserver/bin/tritonserver``. Backends come from ``<root>/backends`` next to
the binary's ``bin/`` (Triton's own default for /opt/tritonserver).
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import uuid
from pathlib import Path

from serving.triton.base import (
    SAGEMAKER_MODEL_ROOT,
    SAGEMAKER_ROOT_REQUIRED_SINCE,
    TritonServer,
    TritonServerConfig,
    TritonServerError,
    parse_version,
    port_arguments,
)

BINARY_ENV = "MME_TRITONSERVER"
VERSION_ENV = "TRITON_SERVER_VERSION"  # NVIDIA's Triton images set it (build.py: ENV TRITON_SERVER_VERSION)
SYSTEM_ROOT = Path("/opt/tritonserver")


class SystemTritonNotFoundError(TritonServerError):
    """No tritonserver binary on this system."""


def find_system_tritonserver(binary: str | os.PathLike | None = None) -> Path:
    """The tritonserver to run (see the module docstring for the search order)."""
    explicit = (Path(binary), "the binary given") if binary else None
    if explicit is None and os.environ.get(BINARY_ENV):
        explicit = (Path(os.environ[BINARY_ENV]), f"${BINARY_ENV}")
    if explicit is not None:
        path, where = explicit
        if not path.is_file():
            raise SystemTritonNotFoundError(f"no tritonserver at {path} (from {where}); point it at an existing binary")
        return _executable(path, where)
    on_path = shutil.which("tritonserver")
    if on_path:
        return Path(on_path)
    fallback = SYSTEM_ROOT / "bin" / "tritonserver"
    if fallback.is_file():
        return _executable(fallback, "the NGC container layout")
    raise SystemTritonNotFoundError(
        f"no tritonserver on PATH or at {fallback}; run inside NVIDIA's Triton container "
        f"(the mme serving image: make docker-serve), set {BINARY_ENV}=/path/to/tritonserver, "
        "or use the local server (kind 'local') or the Docker one (kind 'docker')"
    )


def _executable(path: Path, where: str) -> Path:
    if not os.access(path, os.X_OK):
        raise SystemTritonNotFoundError(f"{path} (from {where}) is not executable; run: chmod +x {path}")
    return path


def system_triton_version() -> tuple[int, ...] | None:
    """The installed Triton's version: ``$TRITON_SERVER_VERSION``, else the matrix's for
    ``$MME_TRITON_RELEASE``; None when neither says."""
    found = parse_version(os.environ.get(VERSION_ENV))
    if found is None and os.environ.get("MME_TRITON_RELEASE"):
        from mme.errors import UsageError
        from mme.versions import release

        try:
            found = parse_version(release(os.environ["MME_TRITON_RELEASE"]).triton_server)
        except UsageError:
            found = None
    return found


def default_backend_directory(binary: Path) -> Path | None:
    """``<root>/backends`` for ``<root>/bin/tritonserver`` when it exists, else None
    (Triton then uses its built-in default, /opt/tritonserver/backends)."""
    candidate = binary.resolve().parent.parent / "backends"
    return candidate if candidate.is_dir() else None


class SystemTritonServer(TritonServer):
    """The system's tritonserver (NVIDIA's container), run as a child process of this one."""

    def __init__(
        self,
        config: TritonServerConfig | None = None,
        *,
        binary: str | os.PathLike | None = None,
        backend_directory: str | os.PathLike | None = None,
    ) -> None:
        super().__init__(config)
        self.requested_binary = binary
        self.requested_backend_directory = Path(backend_directory) if backend_directory else None
        self.binary: Path | None = None
        self.backend_directory: Path | None = None
        # Python-backend shared-memory regions (/dev/shm) get this prefix; stop() removes
        # the ones a killed server left behind.
        self.shm_prefix = f"mme_triton_{uuid.uuid4().hex[:12]}_"

    @classmethod
    def required_model_root(cls) -> Path | None:
        version = system_triton_version()
        if version is not None and version < SAGEMAKER_ROOT_REQUIRED_SINCE:
            return None
        return Path(SAGEMAKER_MODEL_ROOT)

    def _before_start(self) -> None:
        self.binary = find_system_tritonserver(self.requested_binary)
        self.backend_directory = self.requested_backend_directory or default_backend_directory(self.binary)
        if self.requested_backend_directory and not self.requested_backend_directory.is_dir():
            raise SystemTritonNotFoundError(f"backend directory {self.requested_backend_directory} does not exist")

    def command(self, model_repository: Path) -> list[str]:
        if self.binary is None:  # command() before start(): resolve now, same rules
            self._before_start()
        config = self.config
        argv = [
            str(self.binary),
            f"--model-repository={model_repository}",
            "--model-control-mode=explicit",
            *port_arguments(config, bind_host=config.host),
        ]
        if self.backend_directory is not None:
            argv.append(f"--backend-directory={self.backend_directory}")
        argv += [
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            f"--log-verbose={config.log_verbose}",
            *config.extra_args,
        ]
        return argv

    def _environment(self) -> dict[str, str]:
        env = super()._environment()
        # The python-backend stub embeds the system libpython and looks for `python` on PATH
        # to find its packages: this environment's bin/ first, so python-backend models
        # (the cpu-local format) see the packages mme runs with.
        env["PATH"] = os.pathsep.join([str(Path(sys.prefix) / "bin"), env.get("PATH", os.defpath)])
        return env

    def _after_stop(self) -> None:
        for region in glob.glob(f"/dev/shm/{self.shm_prefix}*"):
            Path(region).unlink(missing_ok=True)
