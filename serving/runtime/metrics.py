"""Endpoint metrics with CloudWatch's names, units and meanings for SageMaker multi-model endpoints.

Source: AWS, "Monitor Amazon SageMaker AI with Amazon CloudWatch" (invocation, multi-model
loading and instance metrics) and /work/shared/reference.md, "What SageMaker's MME front end
and Triton's SageMaker mode actually do".

* Per request (microseconds): ModelLatency (the container's time), OverheadLatency (the
  front's total time minus ModelLatency, so it *includes* any wait for a model load),
  ModelLoadingWaitTime (only requests that waited for a load). ModelCacheHit is a 0/1 value
  per request: Average = hit ratio, Sum = hits, SampleCount = requests that needed a model.
* Invocation counts: Invocations, Invocation4XXErrors, Invocation5XXErrors,
  InvocationsPerInstance (Invocations / instance count; one instance locally).
* Per model event (microseconds): ModelDownloadingTime, ModelLoadingTime, ModelUnloadingTime
  (and ModelExtractionTime, ours). Gauge LoadedModelCount.
* Instance (percent): CPUUtilization (summed over cores), MemoryUtilization (host memory),
  DiskUtilization, GPUUtilization and GPUMemoryUtilization (summed over GPUs; None without
  one), fed by :meth:`EndpointMetrics.instance` from serving.monitor.instance_metrics.
* Ours: MemoryLimitUtilization (what eviction counts: used / the endpoint's memory limit),
  MemoryUsedBytes, MemoryLimitBytes, ModelLoads, ModelEvictions, ModelCacheMiss, ContainerRestarts.

Exposed as Prometheus text through a custom collector, so names are CloudWatch's exactly (no
``_total`` suffix: counts are untyped families; latencies are histograms ``<name>_bucket``,
``_sum``, ``_count``), and as a JSON :meth:`~EndpointMetrics.snapshot` (CloudWatch statistics
count/sum/min/max/avg) read from those same families, so the two never disagree; only each
latency's minimum and maximum, which Prometheus has no type for, come from beside them (read
under the same lock). State is plain numbers under one lock: :meth:`request` is on every
invocation's path and costs a few microseconds.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from typing import TYPE_CHECKING, Iterator, NamedTuple

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, HistogramMetricFamily, Metric, UnknownMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from serving.monitor.instance_metrics import InstanceReading

SCHEMA_VERSION = 1
MAX_SAMPLES = 200_000  # requests kept between two take_samples() calls


class RequestSample(NamedTuple):
    """One request's figures, as CloudWatch receives them (0: no sample of that metric)."""

    status: int
    model_us: float
    overhead_us: float
    wait_us: float
    hit: bool | None
    at: float = 0.0  # when it was answered (time.time()): CloudWatch files a request under its own minute

# Histogram bounds in microseconds, 50 us .. 5 min (model loads of large models take minutes).
US_BUCKETS: tuple[float, ...] = (
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 30_000_000, 60_000_000, 120_000_000, 300_000_000)
_BUCKET_LABELS = tuple(floatToGoString(b) for b in US_BUCKETS) + ("+Inf",)

# name -> help text; all in microseconds (CloudWatch's unit for these).
LATENCIES: dict[str, str] = {
    "ModelLatency": "time the container took to answer a request, as seen from the front (us)",
    "OverheadLatency": "front's total time per request minus ModelLatency, including any wait for a model load (us)",
    "ModelLoadingWaitTime": "time a request waited for its model to be downloaded and loaded; only requests that waited (us)",
    "ModelDownloadingTime": "time to download a model's tarball into the cache (us)",
    "ModelLoadingTime": "time the container took to load a model (us)",
    "ModelUnloadingTime": "time the container took to unload a model (us)",
    "ModelExtractionTime": "time to unpack a downloaded tarball (us; not a CloudWatch metric)",
}
COUNTS: dict[str, str] = {
    "Invocations": "invocation requests received (4XX/5XX included)",
    "Invocation4XXErrors": "invocations answered with a 4xx status (400, 413, 424 ModelError, 429...)",
    "Invocation5XXErrors": "invocations answered with a 5xx status",
    "InvocationsPerInstance": "Invocations divided by the instance count (one instance locally, so = Invocations)",
    "ModelCacheHit": "Sum of ModelCacheHit: requests whose model was already loaded; "
                     "hit ratio = ModelCacheHit / (ModelCacheHit + ModelCacheMiss)",
    "ModelCacheMiss": "requests whose model was not loaded (not a CloudWatch metric)",
    "ModelLoads": "models loaded into the container (not a CloudWatch metric)",
    "ModelEvictions": "models unloaded to make room (not a CloudWatch metric)",
    "ContainerRestarts": "serving container crashes recovered (not a CloudWatch metric)",
    "ModelWorkerFailures": "models whose worker process died, unloaded to reload on demand (not a CloudWatch metric)",
    "UnknownModelResends": "invocations sent again because Triton answered 'unknown model' for a model it holds (not a CloudWatch metric)",
    "LoadsAboveThreshold": "loads that left memory above the eviction threshold: nothing idle was left to unload "
                           "(not a CloudWatch metric)",
}
GAUGES: dict[str, str] = {
    "LoadedModelCount": "models loaded in the container",
    "MemoryUsedBytes": "memory the endpoint counts against its limit (bytes)",
    "MemoryLimitBytes": "memory limit the endpoint evicts against (bytes)",
    "MemoryLimitUtilization": "MemoryUsedBytes / MemoryLimitBytes, percent (eviction threshold; not a CloudWatch metric)",
    "MemoryUtilization": "host memory used by the container's processes (RSS) / the host's RAM, percent",
    "CPUUtilization": "CPU used by the container's processes, summed over cores (0..100 x cores), percent",
    "DiskUtilization": "disk space used on the filesystem holding the model cache, percent",
    "GPUUtilization": "GPU utilisation summed over GPUs (0..100 x GPUs), percent; absent without a GPU",
    "GPUMemoryUtilization": "GPU memory used summed over GPUs (0..100 x GPUs), percent; absent without a GPU",
}
UNITS: dict[str, str] = {
    **{name: "Microseconds" for name in LATENCIES}, **{name: "None" for name in COUNTS},
    "LoadedModelCount": "None", "MemoryUsedBytes": "Bytes", "MemoryLimitBytes": "Bytes",
    **{name: "Percent" for name in GAUGES if name.endswith("Utilization")},
}
OUTCOMES = ("ok", "model_error", "error")


class _Stat:
    """One latency: histogram buckets, count and sum (its Prometheus family), minimum and maximum."""

    __slots__ = ("count", "total", "minimum", "maximum", "buckets")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.minimum = 0.0
        self.maximum = 0.0
        self.buckets = [0] * (len(US_BUCKETS) + 1)

    def observe(self, value: float) -> None:
        if self.count == 0 or value < self.minimum:
            self.minimum = value
        if self.count == 0 or value > self.maximum:
            self.maximum = value
        self.count += 1
        self.total += value
        self.buckets[bisect_left(US_BUCKETS, value)] += 1  # first bound >= value: Prometheus's "le"

    def copy(self) -> _Stat:
        other = _Stat()
        other.count, other.total, other.minimum, other.maximum = self.count, self.total, self.minimum, self.maximum
        other.buckets = list(self.buckets)
        return other


def _statistics(count: float, total: float, minimum: float, maximum: float) -> dict:
    """CloudWatch's statistics of a metric: SampleCount, Sum, Minimum, Maximum, Average."""
    n = int(count)
    return {"count": n, "sum": round(total, 3), "min": round(minimum, 3) if n else None,
            "max": round(maximum, 3) if n else None, "avg": round(total / n, 6) if n else None}


class _Collector(Collector):
    """Yields the metric families at scrape time from the endpoint's plain counters."""

    def __init__(self, metrics: EndpointMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self._metrics._read()[0])


class EndpointMetrics:
    """Thread-safe metrics of one local endpoint; one Prometheus registry each (``self.registry``)."""

    def __init__(self, *, instance_count: int = 1) -> None:
        self.instance_count = instance_count
        self.started = time.time()
        self._lock = threading.Lock()
        self._stats = {name: _Stat() for name in LATENCIES}
        self._counts = {name: 0 for name in COUNTS if name != "InvocationsPerInstance"}
        self._outcomes = {outcome: 0 for outcome in OUTCOMES}
        self._gauges: dict[str, float | int | None] = {name: None for name in GAUGES}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self._samples: list[RequestSample] | None = None  # kept only once keep_samples() is called

    def keep_samples(self) -> None:
        """From now on keep each request's figures for :meth:`take_samples` (what publishes raw
        values to CloudWatch, so its percentiles are exact): at most MAX_SAMPLES between takes."""
        with self._lock:
            if self._samples is None:
                self._samples = []

    def take_samples(self) -> list[RequestSample]:
        """The requests answered since the last take (oldest first), and forget them."""
        with self._lock:
            taken, self._samples = self._samples or [], ([] if self._samples is not None else None)
        return taken

    # -- per request (hot path) -------------------------------------------------------------
    def request(self, target: str, status: int, *, model_us: float, total_us: float, wait_us: float,
                hit: bool | None) -> None:
        """One invocation answered with HTTP ``status``.

        ``model_us``: the container's time (0: the container was not called, no ModelLatency
        sample). ``total_us``: the front's whole time (0: not timed, no OverheadLatency sample);
        OverheadLatency = total_us - model_us, so it includes ``wait_us``. ``wait_us``: time waited
        for a model load (0: none, no ModelLoadingWaitTime sample). ``hit``: whether the model
        was loaded when asked; None when the request never needed a model (no ModelCacheHit
        sample). ``target`` is not a label: CloudWatch has no per-model metrics, and targets are
        unbounded (the endpoint's ``loaded_models`` counts per model).
        """
        # Prometheus "outcome" label: "ok" (2xx), "model_error" (424 ModelError), "error" (anything else)
        outcome = "ok" if 200 <= status < 300 else "model_error" if status == 424 else "error"
        stats = self._stats
        with self._lock:
            counts = self._counts
            counts["Invocations"] += 1
            self._outcomes[outcome] += 1
            if 400 <= status < 500:
                counts["Invocation4XXErrors"] += 1
            elif 500 <= status < 600:
                counts["Invocation5XXErrors"] += 1
            if hit is not None:
                counts["ModelCacheHit" if hit else "ModelCacheMiss"] += 1
            if model_us > 0:
                stats["ModelLatency"].observe(model_us)
            if total_us > 0:
                stats["OverheadLatency"].observe(max(0.0, total_us - model_us))
            if wait_us > 0:
                stats["ModelLoadingWaitTime"].observe(wait_us)
            if self._samples is not None and len(self._samples) < MAX_SAMPLES:
                self._samples.append(RequestSample(status, model_us, max(0.0, total_us - model_us) if total_us > 0 else 0.0,
                                                   wait_us, hit, time.time()))

    # -- model events ---------------------------------------------------------------------------
    def model_loaded(self, load_s: float, download_s: float | None, extract_s: float | None) -> None:
        """A load finished. ``download_s``/``extract_s`` are None when the tarball was already cached."""
        with self._lock:
            self._counts["ModelLoads"] += 1
            self._stats["ModelLoadingTime"].observe(load_s * 1e6)
            if download_s is not None:
                self._stats["ModelDownloadingTime"].observe(download_s * 1e6)
            if extract_s is not None:
                self._stats["ModelExtractionTime"].observe(extract_s * 1e6)

    def model_unloaded(self, unload_s: float, evicted: bool) -> None:
        with self._lock:
            self._stats["ModelUnloadingTime"].observe(unload_s * 1e6)
            if evicted:
                self._counts["ModelEvictions"] += 1

    def restarted(self) -> None:
        with self._lock:
            self._counts["ContainerRestarts"] += 1

    def worker_failed(self) -> None:
        with self._lock:
            self._counts["ModelWorkerFailures"] += 1

    def unknown_model_resent(self) -> None:
        with self._lock:
            self._counts["UnknownModelResends"] += 1

    def load_above_threshold(self) -> None:
        with self._lock:
            self._counts["LoadsAboveThreshold"] += 1

    # -- gauges -------------------------------------------------------------------------------
    def memory(self, used: int, limit: int, loaded: int) -> None:
        """What the endpoint counts against its memory limit, and the loaded model count."""
        with self._lock:
            self._gauges.update(MemoryUsedBytes=used, MemoryLimitBytes=limit, LoadedModelCount=loaded,
                                MemoryLimitUtilization=round(100.0 * used / limit, 2) if limit else None)

    def instance(self, reading: InstanceReading) -> None:
        """An instance sample (serving.monitor.instance_metrics.InstanceSampler.sample())."""
        def pct(value: float | None) -> float | None:
            return None if value is None else round(value, 2)

        with self._lock:
            self._gauges.update(CPUUtilization=pct(reading.cpu_percent), MemoryUtilization=pct(reading.memory_percent),
                                DiskUtilization=pct(reading.disk_percent), GPUUtilization=pct(reading.gpu_percent),
                                GPUMemoryUtilization=pct(reading.gpu_memory_percent))

    # -- reading ------------------------------------------------------------------------------
    def _read(self) -> tuple[list[Metric], dict[str, tuple[float, float]]]:
        """The metric families, and each latency's (minimum, maximum), from one consistent copy."""
        with self._lock:
            counts: dict[str, float] = dict(self._counts)
            outcomes, gauges = dict(self._outcomes), dict(self._gauges)
            stats = {n: s.copy() for n, s in self._stats.items()}
        families: list[Metric] = []
        invocations = UnknownMetricFamily("Invocations", COUNTS["Invocations"], labels=["outcome"])
        for outcome, n in outcomes.items():
            invocations.add_metric([outcome], n)
        families.append(invocations)
        counts["InvocationsPerInstance"] = counts["Invocations"] / self.instance_count
        for name, doc in COUNTS.items():
            if name != "Invocations":
                families.append(UnknownMetricFamily(name, doc, value=counts[name]))
        for name, stat in stats.items():
            cumulative, buckets = 0, []
            for label, n in zip(_BUCKET_LABELS, stat.buckets):
                cumulative += n
                buckets.append((label, cumulative))
            families.append(HistogramMetricFamily(name, LATENCIES[name], buckets=buckets, sum_value=stat.total))
        for name, doc in GAUGES.items():
            if gauges.get(name) is not None:
                families.append(GaugeMetricFamily(name, doc, value=gauges[name]))
        return families, {name: (stat.minimum, stat.maximum) for name, stat in stats.items()}

    def snapshot(self) -> dict:
        """JSON-ready: schema_version 1; ``counts`` (Sums), ``latency_us`` (count/sum/min/max/avg per
        metric, ModelCacheHit's avg = hit ratio), ``gauges`` (None = not measured), ``units``;
        read from the Prometheus families."""
        families, extremes = self._read()
        now = time.time()
        values: dict[str, float] = {}  # unlabelled samples by name
        outcomes: dict[str, float] = {}
        for family in families:
            for sample in family.samples:
                if "outcome" in sample.labels:
                    outcomes[sample.labels["outcome"]] = sample.value
                elif not sample.labels:
                    values[sample.name] = sample.value
        counts = {name: sum(outcomes.values()) if name == "Invocations" else values[name]
                  for name in (*(n for n in COUNTS if n != "InvocationsPerInstance"), "InvocationsPerInstance")}
        counts.update({f"Invocations.{outcome}": n for outcome, n in outcomes.items()})
        latency = {name: _statistics(values[f"{name}_count"], values[f"{name}_sum"], *extremes[name])
                   for name in LATENCIES}
        hits, misses = counts["ModelCacheHit"], counts["ModelCacheMiss"]  # 0/1 samples: their statistics
        latency["ModelCacheHit"] = _statistics(hits + misses, float(hits), 0.0 if misses else 1.0,
                                               1.0 if hits else 0.0)
        return {"schema_version": SCHEMA_VERSION, "time": now, "uptime_s": round(now - self.started, 3),
                "instance_count": self.instance_count, "counts": counts, "latency_us": latency,
                "gauges": {name: values.get(name) for name in GAUGES}, "units": dict(UNITS)}

    def prometheus_text(self) -> bytes:
        return generate_latest(self.registry)
