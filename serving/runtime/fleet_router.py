"""A multi-model endpoint on several instances, locally (``mme serve --instances N``): what
SageMaker runs behind one endpoint when its variant has N instances, and what ``mme capacity
--catalogue`` predicts an instance count for.

Each instance is a whole local MME (serving/runtime/local_endpoint.py: its own Triton, model cache and
memory limit). The router in front routes as the fleet simulation (sizing/fleet_sim.py)
assumes SageMaker does: a request goes to an instance that has its model, loaded or being
loaded for a request routed there before, chosen at random among them; when none has it, to an
instance chosen at random, which loads it. What each instance holds is read from its
``GET /models`` every ``MODELS_POLL_S`` (so evictions are seen), and a load the router started counts
until its reply comes back. Requests and replies pass through unchanged (the instances'
``X-Mme-Cold`` headers included, so a load test's per-model hit ratio is the fleet's);
``/metrics.json`` sums the instances' counters, ``/models`` lists every instance's models with
its index, and the router's own ``X-Mme-Instance`` reply header says which instance answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

from mme.errors import UsageError
from mme.progress import Reporter
from serving.runtime import errors_sagemaker as sm
from serving.runtime.local_endpoint import LocalEndpoint, LocalEndpointOptions, start_loop_thread, stop_loop_thread
from serving.runtime.reply_headers import TARGET_HEADER

MODELS_POLL_S = 0.25
INSTANCE_HEADER = "X-Mme-Instance"  # ours: the index of the instance that answered
HOP_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})
MAX_INSTANCES = 16


@dataclass
class _Instance:
    url: str
    loaded: set[str] = field(default_factory=set)  # from its /models, plus loads confirmed since
    loading: dict[str, int] = field(default_factory=dict)  # target -> requests routed here for a load, in flight
    confirmed: dict[str, float] = field(default_factory=dict)  # target -> when a reply showed it loaded

    def holds(self, target: str) -> bool:
        return target in self.loaded or self.loading.get(target, 0) > 0


class Router:
    """Routing state and the HTTP handlers of the fleet's front; runs on one event loop."""

    def __init__(self, urls: list[str], seed: int = 0, timeout_s: float = 300.0) -> None:
        self.instances = [_Instance(url) for url in urls]
        self.rng = random.Random(seed)
        self.timeout_s = timeout_s
        self.session: ClientSession | None = None
        self.routed = [0] * len(urls)

    def choose(self, target: str) -> tuple[int, bool]:
        """(instance index, whether it already holds ``target``)."""
        holders = [i for i, instance in enumerate(self.instances) if instance.holds(target)]
        if holders:
            return self.rng.choice(holders), True
        return self.rng.randrange(len(self.instances)), False

    async def start(self) -> None:
        self.session = ClientSession(connector=TCPConnector(limit=0), timeout=ClientTimeout(total=self.timeout_s))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def poll_forever(self) -> None:
        while True:
            await asyncio.gather(*(self._poll(instance) for instance in self.instances))
            await asyncio.sleep(MODELS_POLL_S)

    async def _poll(self, instance: _Instance) -> None:
        assert self.session is not None
        sent = time.monotonic()
        try:
            async with self.session.get(f"{instance.url}/models") as reply:
                models = (await reply.json()).get("models", [])
        except Exception:  # an instance that does not answer keeps its last known models
            return
        instance.confirmed = {t: at for t, at in instance.confirmed.items() if at >= sent}
        instance.loaded = {m["target"] for m in models} | set(instance.confirmed)

    async def invocations(self, request: web.Request) -> web.Response:
        assert self.session is not None
        body = await request.read()
        target = request.headers.get(TARGET_HEADER) or ""
        index, held = self.choose(target) if target else (self.rng.randrange(len(self.instances)), True)
        instance = self.instances[index]
        self.routed[index] += 1
        if not held:
            instance.loading[target] = instance.loading.get(target, 0) + 1
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        try:
            async with self.session.post(f"{instance.url}{request.rel_url}", data=body, headers=headers) as reply:
                payload = await reply.read()
                status, reply_headers = reply.status, reply.headers
        except Exception as exc:
            error = sm.service_unavailable(f"instance {index} did not answer ({type(exc).__name__}); retry the request")
            return web.Response(status=error.status, body=error.body, headers=dict(error.headers))
        finally:
            if not held:
                instance.loading[target] -= 1
        if status == 200 and target:
            instance.confirmed[target] = time.monotonic()
            instance.loaded.add(target)
        headers = {k: v for k, v in reply_headers.items() if k.lower() not in HOP_HEADERS}
        headers[INSTANCE_HEADER] = str(index)
        return web.Response(status=status, body=payload, headers=headers)

    async def _each(self, path: str) -> list[Any]:
        assert self.session is not None

        async def one(instance: _Instance) -> Any:
            try:
                async with self.session.get(f"{instance.url}{path}") as reply:  # type: ignore[union-attr]
                    return await reply.json()
            except Exception:
                return None

        return list(await asyncio.gather(*(one(i) for i in self.instances)))

    async def models(self, request: web.Request) -> web.Response:
        listed = []
        for index, reply in enumerate(await self._each("/models")):
            listed += [{**m, "instance": index} for m in (reply or {}).get("models", [])]
        return web.json_response({"models": listed})

    async def targets(self, request: web.Request) -> web.Response:
        assert self.session is not None
        async with self.session.get(f"{self.instances[0].url}/targets") as reply:
            return web.json_response(await reply.json())

    async def metrics_json(self, request: web.Request) -> web.Response:
        snapshots = [s for s in await self._each("/metrics.json") if s]
        merged = merge_snapshots(snapshots) | {"routed": list(self.routed)}
        return web.json_response(merged, dumps=lambda o: json.dumps(o, indent=2))

    async def ping(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    def app(self, max_body: int) -> web.Application:
        app = web.Application(client_max_size=max_body + 1)
        app.router.add_post("/endpoints/{name}/invocations", self.invocations)
        app.router.add_get("/ping", self.ping)
        app.router.add_get("/metrics.json", self.metrics_json)
        app.router.add_get("/models", self.models)
        app.router.add_get("/targets", self.targets)
        return app


def _statistics(entries: list[dict]) -> dict:
    count = sum(e.get("count") or 0 for e in entries)
    total = sum(e.get("sum") or 0.0 for e in entries)
    lows = [e["min"] for e in entries if e.get("count") and e.get("min") is not None]
    highs = [e["max"] for e in entries if e.get("count") and e.get("max") is not None]
    return {"count": count, "sum": total, "min": min(lows) if lows else None, "max": max(highs) if highs else None,
            "avg": total / count if count else None}


SUMMED_GAUGES = ("LoadedModelCount",)


def merge_snapshots(snapshots: list[dict]) -> dict:
    """The instances' ``/metrics.json`` as one endpoint's: counters and latency sums added,
    model counts added, utilisation averaged (as CloudWatch averages an endpoint's instances),
    the loaded models listed with their instance."""
    if not snapshots:
        return {}
    counts: dict[str, float] = {}
    for snapshot in snapshots:
        for name, value in (snapshot.get("counts") or {}).items():
            counts[name] = counts.get(name, 0) + (value or 0)
    names = {n for s in snapshots for n in (s.get("latency_us") or {})}
    latency = {n: _statistics([(s.get("latency_us") or {}).get(n) or {} for s in snapshots]) for n in sorted(names)}
    gauges: dict[str, float | None] = {}
    for name in {n for s in snapshots for n in (s.get("gauges") or {})}:
        values = [s["gauges"][name] for s in snapshots if (s.get("gauges") or {}).get(name) is not None]
        gauges[name] = None if not values else (sum(values) if name in SUMMED_GAUGES else sum(values) / len(values))
    first = snapshots[0]
    return {"schema_version": first.get("schema_version"), "time": max(s.get("time", 0) for s in snapshots),
            "uptime_s": min(s.get("uptime_s", 0) for s in snapshots), "instance_count": len(snapshots),
            "counts": counts, "latency_us": latency, "gauges": gauges, "units": first.get("units", {}),
            "loaded_models": [{**m, "instance": i} for i, s in enumerate(snapshots) for m in s.get("loaded_models", [])],
            "loading_models": sorted({t for s in snapshots for t in s.get("loading_models", [])}),
            "memory_threshold": first.get("memory_threshold"), "endpoint": first.get("endpoint"),
            "instances": [{"container": s.get("container"), "gauges": s.get("gauges")} for s in snapshots]}


class LocalFleet:
    """N local MMEs (each with ``options``' memory limit) behind one router at ``options``' host and port."""

    def __init__(self, options: LocalEndpointOptions, instances: int, reporter: Reporter | None = None,
                 seed: int = 0) -> None:
        if not 1 <= instances <= MAX_INSTANCES:
            raise UsageError(f"--instances must be between 1 and {MAX_INSTANCES} (got {instances})")
        if options.mode != "multi":
            raise UsageError("--instances runs a multi-model endpoint on several instances; leave --mode single out")
        if options.require_signature:
            raise UsageError("--instances does not verify signatures yet: leave --require-signature out (the fleet "
                             "listens on loopback)")
        options.check()
        self.options = options
        self.reporter = reporter or Reporter(quiet=True)
        member = replace(options, host="127.0.0.1", port=0)
        self.members = [LocalEndpoint(member, self.reporter) for _ in range(instances)]
        self.seed = seed
        self.model = None  # a multi-model endpoint (the banner's client example names a TargetModel)
        self.router: Router | None = None
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._poller: asyncio.Task | None = None

    @property
    def url(self) -> str:
        return f"http://{self.options.host}:{self.port}"

    @property
    def targets(self) -> tuple[str, ...]:
        return self.members[0].targets

    async def _start_async(self) -> None:
        o = self.options
        self.router = Router([m.url for m in self.members], self.seed,
                             timeout_s=o.model_wait_timeout_s + o.invocation_timeout_s + o.load_timeout_s)
        await self.router.start()
        self._runner = web.AppRunner(self.router.app(self.members[0].endpoint.config.max_payload_bytes),  # type: ignore[union-attr]
                                     access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, o.host, o.port, backlog=1024).start()
        self.port = self._runner.addresses[0][1]
        self._poller = asyncio.get_running_loop().create_task(self.router.poll_forever())

    async def _stop_async(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self._runner is not None:
            await self._runner.cleanup()
        if self.router is not None:
            await self.router.close()

    def start_in_thread(self) -> "LocalFleet":
        started: list[LocalEndpoint] = []
        try:
            for member in self.members:
                started.append(member.start_in_thread())
            self._loop, self._thread = start_loop_thread(self._start_async, "mme-fleet-router")
        except BaseException:
            for member in started:
                member.stop()
            raise
        return self

    def stop(self) -> None:
        try:
            stop_loop_thread(self._loop, self._thread, self._stop_async)
        finally:
            for member in self.members:
                member.stop()

    def __enter__(self) -> "LocalFleet":
        return self.start_in_thread()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
