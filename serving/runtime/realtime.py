"""A local real-time (single-model) endpoint: what SageMaker runs for an endpoint whose model is
one ``model.tar.gz`` on the Triton image, without ``SAGEMAKER_MULTI_MODEL``.

SageMaker unpacks the tarball into ``/opt/ml/model`` and runs the image's ``serve``; in
single-model mode serve starts ``tritonserver --model-repository=/opt/ml/model
--load-model=$SAGEMAKER_TRITON_DEFAULT_MODEL_NAME`` (the only model directory when the variable is
unset; an error for several, unless the variable names one of them, e.g. an ensemble), and
Triton's SageMaker service runs that model for ``POST /invocations``. Requests name no
TargetModel: one that does gets SageMaker's ValidationError.

:func:`serving.models.repository.prepare_repository` is serve's part (unpack, pick the default
model, refuse what serve refuses); :class:`RealTimeEndpoint` answers the front (serving/runtime/front.py) as
:class:`serving.runtime.endpoint.MultiModelEndpoint` does: the same outcomes, metrics and shutdown,
without loads, evictions or a model cache. A Triton that dies is started again once per
request (it loads the model again at start).
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from mme.progress import Reporter
from serving.models.repository import RealTimeModel
from serving.monitor.instance_metrics import InstanceSampler
from serving.runtime import outcomes as out
from serving.runtime.container_port import TritonContainer
from serving.runtime.endpoint import EndpointConfig
from serving.runtime.forward import InvocationTimedOut
from serving.runtime.metrics import EndpointMetrics
from serving.triton.base import TritonServer
from serving.triton.container import ContainerUnreachable
from serving.triton.sagemaker_serve import SINGLE


class RealTimeEndpoint:
    """One model behind ``/endpoints/{name}/invocations``, no TargetModel (serving/runtime/front.py)."""

    mode = SINGLE

    def __init__(self, server: TritonServer, config: EndpointConfig, memory_probe: Callable[[], int],
                 model: RealTimeModel, reporter: Reporter | None = None, metrics: EndpointMetrics | None = None,
                 instance_sampler: InstanceSampler | None = None) -> None:
        self.server = server
        self.config = config
        self.memory_probe = memory_probe
        self.model = model
        self.reporter = reporter or Reporter(quiet=True)
        self.metrics = metrics or EndpointMetrics()
        self.instance_sampler = instance_sampler
        self._container: TritonContainer | None = None
        self._closing = False
        self._restart_lock = asyncio.Lock()
        self.abandoned_loads = 0  # nothing loads after the start: kept for the shutdown's rule
        self.invocations = 0

    @property
    def default_model(self) -> str:
        return self.model.default_model

    @property
    def limit(self) -> int:
        return self.config.memory_limit_bytes

    async def start(self) -> None:
        self._container = TritonContainer(self.server, load_timeout_s=self.config.load_timeout_s,
                                          invocation_timeout_s=self.config.invocation_timeout_s,
                                          loads_in_flight=lambda: 0)
        self._record_memory()

    def begin_shutdown(self) -> None:
        self._closing = True

    async def close(self) -> None:
        self.begin_shutdown()
        if self._container is not None:
            await self._container.close()

    def in_use(self, target: str) -> bool:
        return False  # no model cache to protect

    def loaded_models(self) -> list[dict]:
        return [{"target": self.default_model, "models": list(self.model.models), "invocations": self.invocations,
                 "model_dir": str(self.model.repository / self.default_model)}]

    def _record_memory(self) -> int:
        used = self.memory_probe()
        self.metrics.memory(used, self.limit, 1)
        return used

    def snapshot(self) -> dict:
        self._record_memory()
        if self.instance_sampler is not None:
            self.metrics.instance(self.instance_sampler.sample())
        return {**self.metrics.snapshot(), "loaded_models": self.loaded_models(), "loading_models": [],
                "memory_threshold": self.config.memory_threshold, "mode": SINGLE,
                "endpoint": {"name": self.config.endpoint_name, "variant": self.config.variant_name},
                "container": {"kind": type(self.server).__name__, "pid": self.server.pid,
                              "url": self.server.sagemaker_url}}

    async def invoke(self, target: str | None, body: bytes, content_type: str, accept: str | None) -> out.Outcome:
        if target:
            return out.TargetOnRealTime()
        if len(body) > self.config.max_payload_bytes:
            return out.PayloadTooLarge(self.config.max_payload_bytes)
        assert self._container is not None  # start() made it before any request
        restarted = False
        self.invocations += 1  # once per request, a retry after a restart included
        while True:
            if self._closing and not self.server.is_running():
                return out.ShuttingDown(self.default_model, hit=True)
            start = time.perf_counter()
            try:
                status, headers, data = await self._container.invoke(self.default_model, body, content_type, accept)
            except InvocationTimedOut:
                return out.ModelTimedOut(model_s=time.perf_counter() - start, hit=True)
            except ContainerUnreachable as exc:
                if not restarted and not self._closing and await self._restart_if_dead():
                    restarted = True
                    continue
                return out.ContainerUnavailable(str(exc), hit=True)
            model_s = time.perf_counter() - start
            if status == 200:
                return out.Invoked(data, headers.get("Content-Type", "application/json"), model_s=model_s, hit=True)
            return out.InvokeFailed(status, data.decode("utf-8", "replace"), model_s=model_s, hit=True)

    async def _restart_if_dead(self) -> bool:
        """Start Triton again if it died (serve's container would be replaced): True when it runs again."""
        async with self._restart_lock:
            if self.server.is_running():
                return True  # another request restarted it, or it never died
            self.reporter.warn(f"Triton exited (code {self.server.returncode}); starting it again with "
                               f"{self.default_model}")
            self.metrics.restarted()
            try:
                await asyncio.to_thread(self.server.restart)
            except Exception as exc:  # reported; the request answers 503
                self.reporter.warn(f"Triton did not start again: {exc}")
                return False
            return True

    async def watchdog(self, interval_s: float = 1.0) -> None:
        """Start a Triton that died between requests again."""
        while True:
            await asyncio.sleep(interval_s)
            if not self._closing and not self.server.is_running():
                await self._restart_if_dead()
