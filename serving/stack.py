"""The local stack, assembled in one place: a Triton server of one kind, configured as
SageMaker's image runs it behind an endpoint, over the model cache it loads from (or, for a
real-time endpoint, the repository of its one model), and clients of its container API.

The local endpoint builds one per instance (:mod:`serving.runtime.local_endpoint`, both modes;
a fleet of them in :mod:`serving.runtime.fleet_router`), ``mme capacity`` builds one to count
copies in (:func:`sizing.capacity.measure_capacity`) and the GPU check one to serve a copy on
the GPU (:func:`bench.gpu_check.triton.triton_serves_a_gpu_copy`)::

    with build_stack("local", LocalDirSource(artifact)) as stack:   # nothing started yet
        stack.start()
        cached = stack.cache.fetch(target)
        with stack.client(load_timeout_s=120) as control:
            control.load(cached.container_name, stack.server.model_url(cached.model_dir), target=target)
    # the server stopped, the temporary model cache removed
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

from serving.models.cache import ModelCache
from serving.models.cache_entries import disk_usage
from serving.models.repository import RealTimeModel, prepare_repository
from serving.models.store import ModelSource
from serving.triton.base import TritonServer
from serving.triton.config import TritonServerConfig, default_network
from serving.triton.container import ContainerClient
from serving.triton.factory import ServerKind, choose_cache_root, choose_kind

DISK_SHARE = 0.9  # of the free space at start: what the model cache may grow into by default


def default_disk_limit(cache_dir: Path) -> int:
    """What the cache holds now plus 90% of the free space on its filesystem: unloaded models
    are deleted before the disk fills, as SageMaker does on an instance."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    return max(1, disk_usage(cache_dir) + int(DISK_SHARE * shutil.disk_usage(cache_dir).free))


def endpoint_server_config(sagemaker_env: Mapping[str, str] | None = None, network: str | None = None,
                           **single: Any) -> TritonServerConfig:
    """Triton as SageMaker's image runs it behind an endpoint: the SageMaker port only (HTTP,
    gRPC and metrics off), its ``SAGEMAKER_TRITON_*`` settings honoured, in a network namespace
    of its own unless ``network`` (default: ``$MME_TRITON_NETWORK``, else private) says "host".
    ``single``: a real-time endpoint's ``model_repository`` and ``default_model``."""
    return TritonServerConfig(sagemaker_port=0, http_port=None, grpc_port=None, metrics_port=None,
                              sagemaker_env=dict(sagemaker_env or {}), network=network or default_network(), **single)


class LocalStack:
    """A built stack: its ``server`` (not started yet) and what it reads models from. As a context
    manager it is closed on exit (the server stopped, the stack's temporary directory removed)."""

    def __init__(self, kind: ServerKind, server: TritonServer, workdir: tempfile.TemporaryDirectory | None) -> None:
        self.kind = kind
        self.server = server
        self._workdir = workdir

    @property
    def model_directory(self) -> Path:
        """Where the server reads models from."""
        raise NotImplementedError

    def start(self) -> "LocalStack":
        self.server.start()
        return self

    def client(self, **options: Any) -> ContainerClient:
        """A client of the server's container API (``timeout_s``, ``load_timeout_s``)."""
        return ContainerClient(self.server.sagemaker_url, **options)

    def close(self, *, grace_s: float | None = None) -> None:
        """Stop the server (if it runs) and remove the stack's temporary directory; idempotent."""
        try:
            self.server.stop(grace_s=grace_s)
        finally:
            if self._workdir is not None:
                self._workdir.cleanup()
                self._workdir = None

    def __enter__(self) -> "LocalStack":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


class MultiModelStack(LocalStack):
    """A multi-model endpoint's: the server loads targets from ``cache``."""

    def __init__(self, kind: ServerKind, server: TritonServer, cache: ModelCache,
                 workdir: tempfile.TemporaryDirectory | None) -> None:
        super().__init__(kind, server, workdir)
        self.cache = cache

    @property
    def model_directory(self) -> Path:
        return self.cache.root

    def __enter__(self) -> "MultiModelStack":
        return self


class SingleModelStack(LocalStack):
    """A real-time endpoint's: the server runs ``model`` in single-model mode."""

    def __init__(self, kind: ServerKind, server: TritonServer, model: RealTimeModel,
                 workdir: tempfile.TemporaryDirectory | None) -> None:
        super().__init__(kind, server, workdir)
        self.model = model

    @property
    def model_directory(self) -> Path:
        return self.model.repository


def _kind(kind: str | ServerKind) -> ServerKind:
    return kind if isinstance(kind, ServerKind) else choose_kind(kind)


def build_stack(kind: str | ServerKind, source: ModelSource, *, cache_dir: Path | None = None,
                sagemaker_env: Mapping[str, str] | None = None, network: str | None = None,
                disk_limit_bytes: int | Callable[[Path], int] | None = None,
                in_use: Callable[[str], bool] | None = None, on_fetch: Callable[[str, Path], None] | None = None,
                prefix: str = "mme-cache-") -> MultiModelStack:
    """A multi-model stack: the model cache over ``source`` in the kind's required root, else
    ``cache_dir``, else a temporary directory (``prefix``) removed on close; the server loading
    from it. ``disk_limit_bytes``: bytes, or how to reckon them from the cache's directory
    (:func:`default_disk_limit`); ``in_use`` and ``on_fetch`` as :class:`ModelCache` takes them."""
    chosen = _kind(kind)
    root = choose_cache_root(cache_dir, chosen.required_model_root())
    workdir = None
    if root is None:
        workdir = tempfile.TemporaryDirectory(prefix=prefix)
        root = Path(workdir.name)
    try:
        limit = disk_limit_bytes(root) if callable(disk_limit_bytes) else disk_limit_bytes
        cache = ModelCache(root, source, disk_limit_bytes=limit, in_use=in_use, on_fetch=on_fetch)
        server = chosen.build_server(endpoint_server_config(sagemaker_env, network), model_root=cache.root)
    except BaseException:
        if workdir is not None:
            workdir.cleanup()
        raise
    return MultiModelStack(chosen, server, cache, workdir)


def build_single_model_stack(kind: str | ServerKind, models: str, *, sagemaker_env: Mapping[str, str] | None = None,
                             network: str | None = None) -> SingleModelStack:
    """A real-time stack: ``models``' one tarball unpacked as SageMaker does (in a temporary
    directory removed on close) and the server in single-model mode over it."""
    chosen = _kind(kind)
    workdir = tempfile.TemporaryDirectory(prefix="mme-realtime-")
    try:
        model = prepare_repository(models, Path(workdir.name), sagemaker_env or {})
        config = endpoint_server_config(sagemaker_env, network, model_repository=model.repository,
                                        default_model=model.default_model)
        server = chosen.build_server(config)
    except BaseException:
        workdir.cleanup()
        raise
    return SingleModelStack(chosen, server, model, workdir)
