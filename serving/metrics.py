"""Endpoint metrics named like CloudWatch's for multi-model endpoints.

Per request: ModelLatency and OverheadLatency (microseconds, as CloudWatch reports them),
ModelLoadingWaitTime, ModelCacheHit. Per model event: ModelDownloadingTime,
ModelLoadingTime, ModelUnloadingTime. Gauges: LoadedModelCount, memory used and its
utilisation. Exposed as Prometheus text (one registry per endpoint, no globals) and as a
JSON snapshot the bench reads.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_US_BUCKETS = (250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
               1_000_000, 2_500_000, 5_000_000, 10_000_000, 30_000_000)


@dataclass
class _Totals:
    count: int = 0
    total: float = 0.0
    maximum: float = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.maximum = max(self.maximum, value)

    def to_dict(self) -> dict:
        return {"count": self.count, "sum": round(self.total, 3), "max": round(self.maximum, 3),
                "avg": round(self.total / self.count, 3) if self.count else None}


@dataclass
class EndpointMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.invocations = Counter("Invocations", "invocations by target model and outcome", ["target", "outcome"], registry=r)
        self.model_latency = Histogram("ModelLatency", "container time per request (us)", buckets=_US_BUCKETS, registry=r)
        self.overhead_latency = Histogram("OverheadLatency", "front time per request minus ModelLatency (us)", buckets=_US_BUCKETS, registry=r)
        self.loading_wait = Histogram("ModelLoadingWaitTime", "time a request waited for its model (us)", buckets=_US_BUCKETS, registry=r)
        self.cache_hit = Counter("ModelCacheHit", "requests whose model was already loaded", registry=r)
        self.cache_miss = Counter("ModelCacheMiss", "requests that had to wait for a load", registry=r)
        self.downloading = Histogram("ModelDownloadingTime", "download time per model (us)", buckets=_US_BUCKETS, registry=r)
        self.loading = Histogram("ModelLoadingTime", "container load time per model (us)", buckets=_US_BUCKETS, registry=r)
        self.unloading = Histogram("ModelUnloadingTime", "container unload time per model (us)", buckets=_US_BUCKETS, registry=r)
        self.evictions = Counter("ModelEvictions", "models unloaded to make room", registry=r)
        self.loaded_count = Gauge("LoadedModelCount", "models loaded in the container", registry=r)
        self.memory_used = Gauge("MemoryUsedBytes", "memory used by the serving container", registry=r)
        self.memory_limit = Gauge("MemoryLimitBytes", "memory the endpoint may use", registry=r)
        self.memory_utilization = Gauge("MemoryUtilization", "memory used / limit, percent", registry=r)
        self.server_restarts = Counter("ContainerRestarts", "serving container crashes recovered", registry=r)
        self._lock = threading.Lock()
        self._totals: dict[str, _Totals] = {}
        self._counts: dict[str, int] = {}
        self.started = time.time()

    def _add(self, name: str, value: float) -> None:
        with self._lock:
            self._totals.setdefault(name, _Totals()).add(value)

    def _count(self, name: str, by: int = 1) -> None:
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + by

    def request(self, target: str, outcome: str, model_us: float, total_us: float, wait_us: float, hit: bool) -> None:
        self.invocations.labels(target=target, outcome=outcome).inc()
        self._count(f"Invocations.{outcome}")
        (self.cache_hit if hit else self.cache_miss).inc()
        self._count("ModelCacheHit" if hit else "ModelCacheMiss")
        if model_us:
            self.model_latency.observe(model_us)
            self._add("ModelLatency", model_us)
        overhead = max(0.0, total_us - model_us - wait_us)
        self.overhead_latency.observe(overhead)
        self._add("OverheadLatency", overhead)
        if wait_us:
            self.loading_wait.observe(wait_us)
            self._add("ModelLoadingWaitTime", wait_us)

    def model_loaded(self, load_s: float, download_s: float | None, extract_s: float | None) -> None:
        """``download_s``/``extract_s`` are None when the tarball was already in the cache."""
        self.loading.observe(load_s * 1e6)
        self._add("ModelLoadingTime", load_s * 1e6)
        self._count("ModelLoads")
        if download_s is not None:
            self.downloading.observe(download_s * 1e6)
            self._add("ModelDownloadingTime", download_s * 1e6)
        if extract_s is not None:
            self._add("ModelExtractionTime", extract_s * 1e6)

    def model_unloaded(self, unload_s: float, evicted: bool) -> None:
        self.unloading.observe(unload_s * 1e6)
        self._add("ModelUnloadingTime", unload_s * 1e6)
        if evicted:
            self.evictions.inc()
            self._count("ModelEvictions")

    def restarted(self) -> None:
        self.server_restarts.inc()
        self._count("ContainerRestarts")

    def memory(self, used: int, limit: int, loaded: int) -> None:
        self.memory_used.set(used)
        self.memory_limit.set(limit)
        self.memory_utilization.set(100.0 * used / limit if limit else 0.0)
        self.loaded_count.set(loaded)
        with self._lock:
            self._gauges = {"MemoryUsedBytes": used, "MemoryLimitBytes": limit,
                            "MemoryUtilization": round(100.0 * used / limit, 2) if limit else None,
                            "LoadedModelCount": loaded}

    def prometheus_text(self) -> bytes:
        return generate_latest(self.registry)

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "schema_version": 1,
                "time": time.time(),
                "uptime_s": round(time.time() - self.started, 3),
                "counts": dict(self._counts),
                "latency_us": {name: t.to_dict() for name, t in self._totals.items()},
                "gauges": dict(getattr(self, "_gauges", {})),
            }
