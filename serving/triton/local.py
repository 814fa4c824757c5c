"""Triton from the ``nvidia-pytriton`` wheel: a real ``tritonserver`` (python backend only)
that runs without Docker or a GPU, so the cpu-local format serves on any Linux x86_64 host.

The wheel ships the python-backend stub per Python version under
``pytriton/tritonserver/python_backend_stubs/<major.minor>/``; Triton looks for it in
``backends/python/``. :func:`prepare_backends` puts it there once (or, when the wheel's
directory is read-only, into a copy of ``backends/`` under the user's cache directory).
The stub embeds the system ``libpython<major.minor>`` and ignores PYTHONPATH: it finds this
environment's packages (numpy, onnxruntime) only when this environment's ``bin/`` comes
first on PATH, which :class:`LocalTritonServer` arranges.

It is started with the arguments of SageMaker's ``serve`` script (its Python port,
:mod:`serving.triton.sagemaker_serve`), less the flags this Triton 2.51 lacks (each one
reported once in :attr:`TritonServer.notices`).
"""

from __future__ import annotations

import ctypes.util
import glob
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from serving.triton.base import TritonServer
from serving.triton.config import TritonServerConfig, TritonServerError

STUB_NAME = "triton_python_backend_stub"
INSTALL_HINT = "install it with: pip install nvidia-pytriton==0.7.0 (Linux x86_64/aarch64 only)"
# The Triton release each nvidia-pytriton wheel bundles (its server_version at startup).
WHEEL_TRITON = MappingProxyType({"0.7.0": "2.51"})


class TritonNotInstalledError(TritonServerError):
    """The nvidia-pytriton wheel, or a part of it, is missing."""


@dataclass(frozen=True)
class TritonDistribution:
    """Where the pieces of the wheel's Triton live."""

    root: Path  # .../site-packages/pytriton/tritonserver
    libs: Path  # .../site-packages/nvidia_pytriton.libs

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def backends(self) -> Path:
        return self.root / "backends"

    @property
    def caches(self) -> Path:
        return self.root / "caches"

    def stub_for(self, version: str) -> Path:
        return self.root / "python_backend_stubs" / version / STUB_NAME

    def library_path(self) -> list[Path]:
        return [self.libs, self.root / "lib"]


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def find_distribution() -> TritonDistribution:
    """Locate the wheel's Triton without importing pytriton."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonNotInstalledError(f"the local Triton server needs the nvidia-pytriton package; {INSTALL_HINT}")
    package = Path(list(spec.submodule_search_locations)[0])
    dist = TritonDistribution(root=package / "tritonserver", libs=package.parent / "nvidia_pytriton.libs")
    if not dist.binary.is_file():
        raise TritonNotInstalledError(
            f"no tritonserver binary at {dist.binary} (this nvidia-pytriton build lacks it); reinstall: {INSTALL_HINT}"
        )
    if not os.access(dist.binary, os.X_OK):
        raise TritonNotInstalledError(f"{dist.binary} is not executable; run: chmod +x {dist.binary}")
    return dist


def _copy_executable(src: Path, dest: Path) -> None:
    """Copy ``src`` to ``dest`` atomically (a running server keeps the file it opened)."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _same_file_content(a: Path, b: Path) -> bool:
    return a.is_file() and b.is_file() and a.stat().st_size == b.stat().st_size and a.read_bytes() == b.read_bytes()


def wheel_version() -> str:
    try:
        return importlib.metadata.version("nvidia-pytriton")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mme" / "triton-backends"


def prepare_backends(dist: TritonDistribution, version: str | None = None, cache_dir: Path | None = None) -> Path:
    """The backend directory to give Triton, with the python-backend stub for ``version`` in it.

    Idempotent: nothing is copied when the right stub is already in place.
    """
    version = version or python_version()
    stub = dist.stub_for(version)
    if not stub.is_file():
        available = sorted(p.parent.name for p in dist.root.glob(f"python_backend_stubs/*/{STUB_NAME}"))
        raise TritonNotInstalledError(
            f"nvidia-pytriton has no python-backend stub for Python {version} "
            f"(it has: {', '.join(available) or 'none'}); "
            "run mme with one of those Python versions"
        )
    in_place = dist.backends / "python" / STUB_NAME
    if _same_file_content(stub, in_place):
        return dist.backends
    if os.access(in_place.parent, os.W_OK):
        _copy_executable(stub, in_place)
        return dist.backends
    # Read-only site-packages: a private copy of backends/ with the stub added.
    target = (cache_dir or default_cache_dir()) / f"nvidia-pytriton-{wheel_version()}-py{version}"
    target_stub = target / "python" / STUB_NAME
    if _same_file_content(stub, target_stub):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".py{version}-"))
        shutil.copytree(dist.backends, staging, dirs_exist_ok=True)
        _copy_executable(stub, staging / "python" / STUB_NAME)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    except OSError as exc:
        raise TritonNotInstalledError(
            f"cannot place the python-backend stub: {dist.backends} is read-only and {target.parent} is not "
            f"writable ({exc.strerror}); set XDG_CACHE_HOME to a writable directory"
        ) from None
    return target


def check_libpython(version: str | None = None) -> None:
    """The stub links the shared ``libpython<version>``; fail early and clearly when it is absent."""
    version = version or python_version()
    if ctypes.util.find_library(f"python{version}") is None:
        raise TritonNotInstalledError(
            f"the python-backend stub needs the shared library libpython{version}.so.1.0, which is not installed; "
            f"install it (Debian/Ubuntu: apt-get install libpython{version})"
        )


class LocalTritonServer(TritonServer):
    """tritonserver from the nvidia-pytriton wheel, run as a child process of this one."""

    def __init__(self, config: TritonServerConfig | None = None, cache_dir: Path | None = None) -> None:
        super().__init__(config)
        self.cache_dir = cache_dir
        self._dist: TritonDistribution | None = None
        self._backends: Path | None = None
        # Python-backend shared-memory regions (/dev/shm) get this prefix; stop() removes
        # the ones a killed server left behind.
        self.shm_prefix = f"mme_triton_{uuid.uuid4().hex[:12]}_"

    def _before_start(self) -> None:
        self._dist = find_distribution()
        self._backends = prepare_backends(self._dist, cache_dir=self.cache_dir)
        check_libpython()

    def command(self, model_repository: Path) -> list[str]:
        """serve's argv for the wheel's tritonserver (flags it lacks dropped), then the wheel's
        backends and caches and this server's shared-memory prefix."""
        dist = self._distribution()
        kind_args = [
            f"--backend-directory={self._backends}",
            f"--cache-directory={dist.caches}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
        ]
        return self._ported_command(dist.binary, model_repository, kind_args, bind_host=self.config.host)

    def _distribution(self) -> TritonDistribution:
        """The wheel's Triton, resolved on first use (command() may come before start())."""
        if self._dist is None:
            self._before_start()
        assert self._dist is not None  # _before_start() resolves it or raises
        return self._dist

    def binary_label(self) -> str:
        version = wheel_version()
        triton = WHEEL_TRITON.get(version)
        return f"tritonserver {triton} (nvidia-pytriton {version})" if triton else f"tritonserver of nvidia-pytriton {version}"

    def _serve_environment(self) -> dict[str, str]:
        env = super()._serve_environment()
        libs = [str(p) for p in self._distribution().library_path()]
        if env.get("LD_LIBRARY_PATH"):
            libs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
        env["PATH"] = os.pathsep.join([str(Path(sys.prefix) / "bin"), env.get("PATH", os.defpath)])
        return env

    def _after_stop(self) -> None:
        for region in glob.glob(f"/dev/shm/{self.shm_prefix}*"):
            Path(region).unlink(missing_ok=True)
