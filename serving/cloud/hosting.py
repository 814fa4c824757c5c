"""The endpoints a local control plane runs: each one a real local endpoint (a multi-model or
real-time endpoint on the local Triton, ``serving.runtime``) reading its model data from the
S3-compatible server, with ``InitialInstanceCount`` instances behind the fleet router.

Each instance's memory limit is its instance type's GPU memory (``mme/instances.toml``: the
usable total the driver reports on that GPU, e.g. 23,028 MiB for an ml.g5's A10G) unless the
control plane was started with one (``mme cloud --memory-limit``); what the limit counts is
what ``mme serve`` counts here (GPU memory through NVML where there is a GPU, else the serving
processes' memory). Starting runs on a thread of its own, so CreateEndpoint answers at once
and DescribeEndpoint says Creating until the endpoint answers or Failed with the reason.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from mme.errors import MmeError
from mme.progress import Reporter
from mme.versions import Release
from serving.monitor.memory import DEFAULT_MEMORY_THRESHOLD
from serving.runtime.fleet_router import LocalFleet
from serving.runtime.local_endpoint import LocalEndpoint, LocalEndpointOptions
from serving.triton.config import default_network
from serving.triton.sagemaker_serve import MULTI, SINGLE

SINGLE_MODEL_FILE = "model.tar.gz"


@dataclass(frozen=True)
class CloudOptions:
    """How the local control plane runs what it is asked to create."""

    host: str = "127.0.0.1"
    port: int = 4566  # 0: any free port
    account: str = "000000000000"  # in every ARN and the runtime's messages
    memory_limit_bytes: int | None = None  # per instance; default: the instance type's GPU memory
    memory_threshold: float = DEFAULT_MEMORY_THRESHOLD
    memory: str = "auto"  # what the limit counts: gpu, host or auto (as mme serve --memory)
    server_kind: str = "auto"
    triton_network: str = field(default_factory=default_network)
    metrics_interval_s: float = 5.0  # how often each endpoint's metrics reach CloudWatch


@dataclass(frozen=True)
class VariantRuntime:
    """What one endpoint runs: its one production variant and that variant's model."""

    endpoint: str
    variant: str
    instance_type: str
    instance_count: int
    mode: str  # MULTI or SINGLE
    model_data_url: str
    environment: Mapping[str, str]
    release: Release
    memory_limit_bytes: int
    region: str


class ModelData(Protocol):
    def download(self, url: str, into: Path) -> Path: ...


class S3ModelData:
    """Model data read from the S3-compatible server at ``endpoint_url`` (the control plane's own)."""

    def __init__(self, endpoint_url: str) -> None:
        self.endpoint_url = endpoint_url

    def client(self) -> Any:
        import boto3

        return boto3.session.Session().client("s3", endpoint_url=self.endpoint_url, region_name="us-east-1")

    def download(self, url: str, into: Path) -> Path:
        bucket, _, key = url[len("s3://"):].partition("/")
        target = into / SINGLE_MODEL_FILE
        from botocore.exceptions import ClientError

        try:
            self.client().download_file(bucket, key, str(target))
        except ClientError:
            raise StartFailed(f"Failed to download model data(bucket: {bucket}, key: {key}). Please ensure that there "
                              "is an object located at the URL and that the role passed to CreateModel has permissions "
                              "to download the model.") from None
        return target


class StartFailed(MmeError):
    """An endpoint could not start; the message becomes its FailureReason."""


@dataclass
class _Running:
    runtime: LocalEndpoint | LocalFleet
    workdir: tempfile.TemporaryDirectory | None

    def stop(self) -> None:
        try:
            self.runtime.stop()
        finally:
            if self.workdir is not None:
                self.workdir.cleanup()


class Hosting:
    """Starts, swaps and stops the endpoints' runtimes; thread-safe."""

    def __init__(self, options: CloudOptions, s3_endpoint_url: str, reporter: Reporter | None = None,
                 model_data: ModelData | None = None) -> None:
        self.options = options
        self.s3_endpoint_url = s3_endpoint_url
        self.reporter = reporter or Reporter(quiet=True)
        self.model_data = model_data or S3ModelData(s3_endpoint_url)
        self._lock = threading.Lock()
        self._running: dict[tuple[str, str], _Running] = {}  # (region, endpoint) -> runtime
        self._threads: list[threading.Thread] = []

    def url_of(self, region: str, endpoint: str) -> str | None:
        with self._lock:
            running = self._running.get((region, endpoint))
        return None if running is None else running.runtime.url

    def runtime_of(self, region: str, endpoint: str) -> LocalEndpoint | LocalFleet | None:
        with self._lock:
            running = self._running.get((region, endpoint))
        return None if running is None else running.runtime

    def running(self) -> list[tuple[str, str, LocalEndpoint | LocalFleet]]:
        """(region, endpoint, runtime) of every endpoint answering now."""
        with self._lock:
            return [(region, name, r.runtime) for (region, name), r in self._running.items()]

    def start(self, spec: VariantRuntime, done: Callable[[str | None], bool]) -> None:
        """Start ``spec``'s runtime on a thread; ``done(None)`` once it answers, ``done(reason)``
        if it cannot start. ``done`` returns False when the endpoint is no longer wanted (deleted
        while it started), and the runtime is stopped again. A runtime already running under the
        same name (an update) is replaced only once the new one answers."""
        thread = threading.Thread(target=self._start, args=(spec, done), name=f"mme-cloud-{spec.endpoint}", daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _start(self, spec: VariantRuntime, done: Callable[[str | None], bool]) -> None:
        self.reporter.info(f"  endpoint {spec.endpoint}: starting {spec.instance_count} x {spec.instance_type} "
                           f"({spec.mode}-model, {spec.model_data_url})")
        try:
            running = self._run(spec)
        except Exception as exc:  # every reason the endpoint cannot start is its FailureReason
            reason = str(exc) if isinstance(exc, MmeError) else f"{type(exc).__name__}: {exc}"
            self.reporter.warn(f"endpoint {spec.endpoint} failed: {reason}")
            done(reason)
            return
        key = (spec.region, spec.endpoint)
        with self._lock:
            previous = self._running.get(key)
            self._running[key] = running
        if previous is not None:
            previous.stop()
        if not done(None):
            self.stop(spec.region, spec.endpoint)

    def _run(self, spec: VariantRuntime) -> _Running:
        o = self.options
        workdir = None
        models = spec.model_data_url
        if spec.mode == SINGLE:
            workdir = tempfile.TemporaryDirectory(prefix="mme-cloud-")
            models = str(self.model_data.download(spec.model_data_url, Path(workdir.name)).parent)
        options = LocalEndpointOptions(
            models=models, host="127.0.0.1", port=0, memory_threshold=o.memory_threshold,
            memory_limit_bytes=spec.memory_limit_bytes, server_kind=o.server_kind, memory=o.memory,
            s3_endpoint_url=self.s3_endpoint_url if spec.mode == MULTI else None, endpoint_name=spec.endpoint,
            variant_name=spec.variant, account=o.account, region=spec.region, sagemaker_env=dict(spec.environment),
            triton_network=o.triton_network, mode=spec.mode,
        )
        try:
            runtime: LocalEndpoint | LocalFleet
            if spec.instance_count > 1:
                runtime = LocalFleet(options, spec.instance_count, self.reporter)
            else:
                runtime = LocalEndpoint(options, self.reporter)
            runtime.start_in_thread()
            for member in runtime.members if isinstance(runtime, LocalFleet) else [runtime]:
                if member.endpoint is not None:  # CloudWatch gets every request, the first ones too
                    member.endpoint.metrics.keep_samples()
        except BaseException:
            if workdir is not None:
                workdir.cleanup()
            raise
        return _Running(runtime, workdir)

    def stop(self, region: str, endpoint: str) -> bool:
        """Stop an endpoint's runtime (its Triton and cache gone when this returns)."""
        with self._lock:
            running = self._running.pop((region, endpoint), None)
        if running is None:
            return False
        running.stop()
        self.reporter.info(f"  endpoint {endpoint}: stopped")
        return True

    def close(self) -> None:
        with self._lock:
            names = list(self._running)
            threads = list(self._threads)
        for region, name in names:
            with contextlib.suppress(Exception):
                self.stop(region, name)
        for thread in threads:
            thread.join(timeout=1)

