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

Where the image has SageMaker's ``serve`` script (``/usr/bin/serve``, or ``serve`` on PATH,
holding ``tritonserver --allow-sagemaker=true``), the server is that script run with bash, as
SageMaker runs it: our flags travel in ``SAGEMAKER_TRITON_ADDITIONAL_ARGS`` (before the
user's) and PATH resolves ``tritonserver`` to the chosen binary. The script does not exec, so
the process tree is bash, tritonserver, then the python-backend stubs. Elsewhere the script's
Python port (:mod:`serving.triton.sagemaker_serve`) builds the argv.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

from mme.errors import UsageError
from mme.versions import release
from serving.triton.base import TritonServer
from serving.triton.config import (
    SAGEMAKER_MODEL_ROOT,
    SAGEMAKER_ROOT_REQUIRED_SINCE,
    TritonServerConfig,
    TritonServerError,
    parse_version,
)
from serving.triton.sagemaker_serve import (
    ADDITIONAL_ARGS,
    additional_args,
    config_arguments,
    find_serve_script,
    is_serve_script,
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
    """The system's tritonserver (NVIDIA's container), run as a child process of this one,
    through the image's SageMaker ``serve`` script when it has one."""

    def __init__(
        self,
        config: TritonServerConfig | None = None,
        *,
        binary: str | os.PathLike | None = None,
        backend_directory: str | os.PathLike | None = None,
        serve_script: str | os.PathLike | None = None,
    ) -> None:
        super().__init__(config)
        self.requested_binary = binary
        self.requested_backend_directory = Path(backend_directory) if backend_directory else None
        self.requested_serve_script = Path(serve_script) if serve_script else None
        self.binary: Path | None = None
        self.backend_directory: Path | None = None
        self.serve_script: Path | None = None  # None: serve's Python port
        self._path_dir: Path | None = None  # holds a `tritonserver` link when PATH finds another one
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
        if self.requested_serve_script is not None:
            if not is_serve_script(self.requested_serve_script):
                raise SystemTritonNotFoundError(
                    f"{self.requested_serve_script} is not SageMaker's Triton serve script "
                    "(no 'tritonserver --allow-sagemaker=true' line); point serve_script at one"
                )
            self.serve_script = self.requested_serve_script
        else:
            self.serve_script = find_serve_script()
        self._path_dir = None
        if self.serve_script is not None:
            self._path_dir = self._tritonserver_on_path()

    def _tritonserver_on_path(self) -> Path | None:
        """None when PATH already finds ``self.binary`` as ``tritonserver``; else a private
        directory with a ``tritonserver`` link to it, to put first on PATH."""
        binary = self.binary
        assert binary is not None  # resolved by _before_start()
        found = shutil.which("tritonserver", path=self._base_path())
        if found and os.path.samefile(found, binary):
            return None
        directory = Path(tempfile.mkdtemp(prefix="mme-tritonserver-bin-"))
        (directory / "tritonserver").symlink_to(binary.resolve())
        return directory

    def binary_label(self) -> str:
        version = os.environ.get(VERSION_ENV)
        return f"tritonserver {version} ({self.binary})" if version else f"tritonserver {self.binary}"

    def _kind_args(self) -> list[str]:
        args = [] if self.backend_directory is None else [f"--backend-directory={self.backend_directory}"]
        return [*args, f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}"]

    def command(self, model_repository: Path) -> list[str]:
        """``bash <serve>`` where the image has the script; else serve's argv for the binary."""
        if self.binary is None:  # command() before start(): resolve now, same rules
            self._before_start()
        if self.serve_script is not None:
            return ["bash", str(self.serve_script)]
        assert self.binary is not None  # resolved by _before_start()
        return self._ported_command(self.binary, model_repository, self._kind_args(), bind_host=self.config.host)

    def _base_path(self) -> str:
        # The python-backend stub embeds the system libpython and looks for `python` on PATH
        # to find its packages: this environment's bin/ first, so python-backend models
        # (the cpu-local format) see the packages mme runs with.
        path = {**os.environ, **self.config.env}.get("PATH", os.defpath)
        return os.pathsep.join([str(Path(sys.prefix) / "bin"), path])

    def _serve_environment(self) -> dict[str, str]:
        env = super()._serve_environment()
        env["PATH"] = self._base_path()
        return env

    def _environment(self) -> dict[str, str]:
        if self.serve_script is None:
            return super()._environment()
        env = self._serve_environment()  # bash applies serve's ping-mode quirk itself
        before = [*config_arguments(self.config, self.config.host), *self._kind_args()]
        env[ADDITIONAL_ARGS] = additional_args(env, before, self.config.extra_args)
        if self._path_dir is not None:
            env["PATH"] = os.pathsep.join([str(self._path_dir), env["PATH"]])
        return env

    def _after_stop(self) -> None:
        for region in glob.glob(f"/dev/shm/{self.shm_prefix}*"):
            Path(region).unlink(missing_ok=True)
        if self._path_dir is not None:
            shutil.rmtree(self._path_dir, ignore_errors=True)
            self._path_dir = None
