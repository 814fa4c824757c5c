"""A whole local MME: Triton server + model cache + endpoint + HTTP front, started and
stopped together. ``mme serve`` runs it in the foreground; tests and ``mme capacity``
run it on a background thread."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Coroutine, Mapping

import uvloop

from mme.errors import UsageError
from mme.network import is_loopback
from mme.progress import Reporter
from mme.versions import release
from packager.compat import check_artifact
from packager.manifest import Manifest, is_artifact_directory
from serving.models.cache import ModelCache
from serving.models.copies import CopiesSource
from serving.models.repository import RealTimeModel
from serving.models.store import source_from_uri
from serving.monitor.instance_metrics import InstanceSampler
from serving.monitor.memory import DEFAULT_MEMORY_THRESHOLD, MemoryMeter, choose_meter, gpu_compute_capability
from serving.runtime import errors_sagemaker as sm
from serving.runtime.endpoint import SAGEMAKER_TIMEOUT_S, EndpointConfig, MultiModelEndpoint
from serving.runtime.exposure import PythonBackendWarner, open_front_warning
from serving.runtime.front import Front
from serving.runtime.http_server import HttpServer, bind_listener
from serving.runtime.realtime import RealTimeEndpoint
from serving.runtime.sigv4_verify import ACCESS_KEY_ENV, SECRET_KEY_ENV, Credentials
from serving.runtime.startup_checks import check_server_runs, served_targets
from serving.stack import (
    LocalStack,
    MultiModelStack,
    SingleModelStack,
    build_single_model_stack,
    build_stack,
    default_disk_limit,
)
from serving.triton.config import default_network
from serving.triton.container import LOAD_TIMEOUT_S
from serving.triton.factory import ServerKind, choose_kind
from serving.triton.sagemaker_serve import MODES, MULTI, SINGLE

ENDPOINT_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")  # CreateEndpoint's EndpointName pattern


@dataclass(frozen=True)
class LocalEndpointOptions:
    models: str  # directory or s3://bucket/prefix holding <name>.tar.gz objects
    host: str = "127.0.0.1"
    port: int = 8080  # 0: any free port
    memory_threshold: float = DEFAULT_MEMORY_THRESHOLD
    memory_limit_bytes: int | None = None  # default: the GPU's memory, or this host's RAM
    copies: int = 0  # answer for <stem>-v0..v{N-1}.tar.gz from <stem>.tar.gz
    server_kind: str = "auto"
    cache_dir: Path | None = None  # default: the server's required root, else a temporary directory
    s3_endpoint_url: str | None = None
    memory: str = "auto"  # what the threshold counts: gpu (NVML), host (process-tree RSS) or auto
    endpoint_name: str = sm.DEFAULT_ENDPOINT_NAME  # the only EndpointName this endpoint answers for
    variant_name: str = sm.DEFAULT_VARIANT
    account: str = sm.DEFAULT_ACCOUNT  # in ValidationError messages and LogStreamArn
    region: str = "us-east-1"
    model_wait_timeout_s: float = SAGEMAKER_TIMEOUT_S  # then 429 ModelNotReadyException
    invocation_timeout_s: float = SAGEMAKER_TIMEOUT_S  # then ModelError, OriginalStatusCode 0
    allow_unsigned: bool = False  # accept requests without a SigV4 signature (SageMaker answers 403)
    load_timeout_s: float = LOAD_TIMEOUT_S  # a container load not finished by then fails its requests
    sagemaker_env: Mapping[str, str] = field(default_factory=dict)  # SAGEMAKER_TRITON_* and the container's env
    disk_limit_bytes: int | None = None  # delete least recently used unloaded artifacts past this
    require_signature: bool = False  # answer only invocations SigV4-signed with the key pair below
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    triton_network: str = field(default_factory=default_network)  # "private" or "host" (serving/triton/netns.py)
    mode: str = MULTI  # "single": a real-time endpoint serving ``models``' one tarball (serving/runtime/realtime.py)

    def check(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"unknown --mode {self.mode!r}; choose one of: {', '.join(MODES)}")
        if self.mode == SINGLE and self.copies:
            raise UsageError("--copies names copies for TargetModel; a real-time endpoint (--mode single) takes no "
                             "TargetModel: drop --copies")
        if not 0 < self.memory_threshold <= 1:
            raise UsageError(f"--memory-threshold must be in (0, 1] (got {self.memory_threshold})")
        if self.memory_limit_bytes is not None and self.memory_limit_bytes <= 0:
            raise UsageError(f"--memory-limit must be a positive number of bytes (got {self.memory_limit_bytes})")
        if not 0 <= self.port < 65536:
            raise UsageError(f"--port must be between 0 and 65535 (got {self.port})")
        for flag, value in (("--model-wait-timeout", self.model_wait_timeout_s),
                            ("--invocation-timeout", self.invocation_timeout_s),
                            ("--load-timeout", self.load_timeout_s)):
            if not value > 0:
                raise UsageError(f"{flag} must be a positive number of seconds (got {value:g})")
        if self.disk_limit_bytes is not None and self.disk_limit_bytes <= 0:
            raise UsageError(f"--disk-limit must be a positive number of bytes (got {self.disk_limit_bytes})")
        if not (self.account.isdigit() and len(self.account) == 12):
            raise UsageError(f"--account must be a 12-digit AWS account id (got {self.account!r})")
        if self.require_signature and not (self.access_key_id and self.secret_access_key):
            raise UsageError("--require-signature needs the key pair to verify against: --access-key-id and "
                             f"--secret-access-key (or {ACCESS_KEY_ENV} and {SECRET_KEY_ENV})")
        if self.require_signature and self.allow_unsigned:
            raise UsageError("--require-signature and --allow-unsigned contradict each other; pass one of them")
        if not ENDPOINT_NAME.fullmatch(self.endpoint_name):
            raise UsageError(f"--endpoint-name {self.endpoint_name!r} is not a SageMaker endpoint name: use up to 63 "
                             "letters, digits and hyphens, starting with a letter or digit")


def _local_manifest(models: str):
    """The manifest of a local artifact directory, or None (S3 prefixes, plain tarball directories)."""
    if models.startswith("s3://") or not is_artifact_directory(Path(models)):
        return None
    return Manifest.load(Path(models))


def _check_engines(manifest) -> None:
    """Refuse, before anything starts, engines that cannot load here: built for another
    TensorRT or Torch-TensorRT than the serving release (``MME_TRITON_RELEASE``, else the
    default) runs, or for another GPU than this host's."""

    if manifest is not None:
        check_artifact(manifest, release(os.environ.get("MME_TRITON_RELEASE")),
                       compute_capability=gpu_compute_capability(), where="this host's GPU")


BLOCKING_CALLS = 64  # threads for the loop's blocking calls: container loads and unloads, fetches


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop (libuv): the front's per-request cost is what the endpoint adds to latency.
    Its default executor runs the blocking calls (``asyncio.to_thread``): each container load or
    unload holds a thread for its whole duration (the python backend's take about 2 s), and the
    standard default (cores + 4: 6 threads on 2 cores) ran at most 6 at once, loads queueing
    behind unloads; BLOCKING_CALLS leaves the container to set how many run together."""
    loop = uvloop.new_event_loop()
    loop.set_default_executor(ThreadPoolExecutor(BLOCKING_CALLS, thread_name_prefix="mme-blocking"))
    return loop


def start_loop_thread(start: Callable[[], Coroutine[Any, Any, None]], name: str) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """A daemon thread running a new event loop: ``start()`` runs to completion first (its
    exception is raised here, in the starting thread), then the loop runs until it is stopped."""
    loop = new_event_loop()
    ready = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(start())
        except BaseException as exc:  # reported to the starting thread below
            failure.append(exc)
            ready.set()
            return
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    ready.wait()
    if failure:
        raise failure[0]
    return loop, thread


def stop_loop_thread(loop: asyncio.AbstractEventLoop | None, thread: threading.Thread | None,
                     stop: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``stop()`` on a loop started by :func:`start_loop_thread`, then end the loop and its thread."""
    if loop is not None and thread is not None and thread.is_alive():
        asyncio.run_coroutine_threadsafe(stop(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


class LocalEndpoint:
    def __init__(self, options: LocalEndpointOptions, reporter: Reporter | None = None) -> None:
        options.check()
        manifest = _local_manifest(options.models)
        _check_engines(manifest)
        self.options = options
        self.reporter = reporter or Reporter(quiet=True)
        if not is_loopback(options.host) and self.credentials is None:  # said once, before anything starts
            self.reporter.warn(open_front_warning(options.host, options.port or None))
        kind = choose_kind(options.server_kind)
        check_server_runs(manifest, kind, options.models)
        self.model: RealTimeModel | None = None
        self.stack: LocalStack = self._start_single(kind) if options.mode == SINGLE else self._start_multi(kind)
        self.server = self.stack.server
        try:
            self._meter_and_sampler(manifest, self.stack.model_directory)
        except BaseException:
            self.stack.close()
            raise
        self.endpoint: MultiModelEndpoint | RealTimeEndpoint | None = None
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._http: HttpServer | None = None
        self._listener: socket.socket | None = None  # bound first: a port in use is said before Triton starts
        self._watchdog: asyncio.Task | None = None

    def _start_single(self, kind: ServerKind) -> SingleModelStack:
        """A real-time endpoint: the tarball unpacked as SageMaker does, Triton in single-model mode."""
        options = self.options
        stack = build_single_model_stack(kind, options.models, sagemaker_env=options.sagemaker_env,
                                         network=options.triton_network)
        self.model = stack.model
        self.targets: tuple[str, ...] = ()
        self.cache: ModelCache | None = None
        self.disk_limit_bytes: int | None = None
        return stack

    def _start_multi(self, kind: ServerKind) -> MultiModelStack:
        options = self.options
        source = source_from_uri(options.models, endpoint_url=options.s3_endpoint_url)
        if options.copies:
            source = CopiesSource(source, options.copies)
        self.targets = served_targets(source, options.models)  # something to serve, or one line saying what to pass
        if not self.targets:
            self.reporter.warn(f"{options.models} holds no <name>.tar.gz yet: objects put there are served on their "
                               "first request")
        # A python-backend model.py from S3 runs as this user unless Triton runs in a container.
        warner = (PythonBackendWarner(options.models, self.reporter.warn)
                  if options.models.startswith("s3://") and not kind.in_container else None)
        stack = build_stack(kind, source, cache_dir=options.cache_dir, sagemaker_env=options.sagemaker_env,
                            network=options.triton_network, in_use=self._in_use, on_fetch=warner,
                            disk_limit_bytes=options.disk_limit_bytes or default_disk_limit)
        self.cache = stack.cache
        self.disk_limit_bytes = stack.cache.disk_limit_bytes
        return stack

    def _meter_and_sampler(self, manifest, disk_path: Path) -> None:
        instance_kind = manifest.triton.instance_kind if manifest is not None else None
        self.meter: MemoryMeter = choose_meter(self.options.memory, self.server.pids, instance_kind=instance_kind)
        self.sampler = InstanceSampler(self.server.pids, disk_path)

    @property
    def url(self) -> str:
        return f"http://{self.options.host}:{self.port}"

    @property
    def credentials(self) -> Credentials | None:
        """The key pair invocations must be signed with, or None (signatures not verified)."""
        o = self.options
        if not (o.require_signature and o.access_key_id and o.secret_access_key):
            return None
        return Credentials(o.access_key_id, o.secret_access_key)

    def _in_use(self, target: str) -> bool:
        return self.endpoint is not None and self.endpoint.in_use(target)

    def memory_used(self) -> int:
        return self.meter.used()

    def _memory_limit(self) -> int:
        return self.options.memory_limit_bytes or self.meter.total()

    async def _start_async(self) -> None:
        o = self.options
        config = EndpointConfig(
            memory_limit_bytes=self._memory_limit(), memory_threshold=o.memory_threshold, region=o.region,
            account=o.account, endpoint_name=o.endpoint_name, variant_name=o.variant_name,
            model_wait_timeout_s=o.model_wait_timeout_s, invocation_timeout_s=o.invocation_timeout_s,
            allow_unsigned=o.allow_unsigned, load_timeout_s=o.load_timeout_s,
            footprint_from_workers=self.meter.kind == "host",
        )
        if self.model is not None:
            self.endpoint = RealTimeEndpoint(self.server, config, self.memory_used, self.model, self.reporter,
                                             instance_sampler=self.sampler)
        else:
            assert self.cache is not None  # the multi-model endpoint's, made by _start_multi
            self.endpoint = MultiModelEndpoint(self.cache, self.server, config, self.memory_used, self.reporter,
                                               instance_sampler=self.sampler)
        await self.endpoint.start()
        assert self._listener is not None  # bound by start_in_thread
        self._http = HttpServer(Front(self.endpoint, self.credentials), self._listener)
        await self._http.start()
        self.port = self._http.port
        self._watchdog = asyncio.get_running_loop().create_task(self.endpoint.watchdog())

    async def _stop_async(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        if self.endpoint is not None:
            self.endpoint.begin_shutdown()  # requests waiting for a load answer now
        if self._http is not None:
            await self._http.stop()
        if self.endpoint is not None:
            await self.endpoint.close()

    def start_in_thread(self) -> "LocalEndpoint":
        """Start everything; the HTTP front runs on a daemon thread's event loop."""
        self._listener = bind_listener(self.options.host, self.options.port)
        try:
            self.server.start()
        except BaseException:
            self._listener.close()
            raise
        for notice in self.server.notices:
            self.reporter.warn(notice)
        try:
            self._loop, self._thread = start_loop_thread(self._start_async, "mme-endpoint")
        except BaseException:
            self._listener.close()  # a no-op when the front had started on it
            self.server.stop()
            raise
        return self

    def call(self, coro):
        """Run a coroutine on the endpoint's loop from another thread."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def stop(self) -> None:
        try:
            stop_loop_thread(self._loop, self._thread, self._stop_async)
        finally:
            # Nothing is in flight any more (the front drained); a load still running would hold
            # Triton's exit for the whole grace period, so then it gets none.
            abandoned = self.endpoint is not None and self.endpoint.abandoned_loads > 0
            try:
                self.stack.close(grace_s=0.0 if abandoned else None)  # the server, then its temporary directory
            finally:
                self.sampler.close()

    def __enter__(self) -> "LocalEndpoint":
        return self.start_in_thread()

    def __exit__(self, *exc_info) -> None:
        self.stop()
