"""CloudWatch for the local control plane's endpoints: what each endpoint counts reaches the
S3 test server's project's CloudWatch (moto), under SageMaker's namespaces and dimensions, so
GetMetricData and GetMetricStatistics (``mme metrics``, the report's CloudWatch section, any
boto3 script) answer for them.

Every ``interval_s`` each endpoint InService publishes, with dimensions ``EndpointName`` and
``VariantName``:

* ``AWS/SageMaker``, per request, as raw values (so statistics and percentiles are computed
  from every request, as CloudWatch does): ModelLatency, OverheadLatency,
  ModelLoadingWaitTime (requests that waited), ModelCacheHit (1 or 0 for requests that needed
  a model: Average = hit ratio); per interval: Invocations, InvocationsPerInstance,
  Invocation4XXErrors, Invocation5XXErrors (counts) and LoadedModelCount (all instances).
* ``/aws/sagemaker/Endpoints``, per interval: CPUUtilization, MemoryUtilization,
  DiskUtilization, GPUUtilization, GPUMemoryUtilization (averaged over the instances, as
  CloudWatch shows an endpoint's), where the endpoint measures them.

moto computes Sum, Average, Minimum, Maximum and SampleCount but no percentiles (a ``p99``
query fails inside it); :func:`enable_percentiles` gives its statistics the ``pNN`` ones, from
the raw values, for the process that runs the control plane.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import threading
from typing import Any, Iterable

from mme.stats import percentile
from serving.cloud.control_plane import ControlPlane
from serving.cloud.hosting import Hosting
from serving.deploy.cloudwatch import INSTANCE_NS, SAGEMAKER_NS
from serving.runtime.fleet_router import LocalFleet
from serving.runtime.local_endpoint import LocalEndpoint
from serving.runtime.metrics import EndpointMetrics, RequestSample

INSTANCE_GAUGES = ("CPUUtilization", "MemoryUtilization", "DiskUtilization", "GPUUtilization", "GPUMemoryUtilization")
_PERCENTILE = re.compile(r"p(\d{1,2}(?:\.\d+)?)")


def enable_percentiles() -> None:
    """moto's CloudWatch statistics with ``pNN`` (``mme.stats.percentile`` of the period's raw values)."""
    from moto.cloudwatch import models

    base = models.Statistics
    if getattr(base, "mme_percentiles", False):
        return

    class Statistics(base):  # type: ignore[misc, valid-type]
        mme_percentiles = True

        def get_statistics_for_type(self, stat: str) -> Any:
            match = _PERCENTILE.fullmatch(stat)
            if match is None:
                return super().get_statistics_for_type(stat)
            values = self.metric_single_values_list
            if values:
                return percentile(values, float(match[1]))
            aggregated = self.metric_aggregated_list  # no raw values: the period's average
            count = sum(a.sample_count for a in aggregated)
            return sum(a.sum for a in aggregated) / count if count else 0.0

    models.Statistics = Statistics  # type: ignore[misc]


def _members(runtime: LocalEndpoint | LocalFleet) -> list[LocalEndpoint]:
    return list(runtime.members) if isinstance(runtime, LocalFleet) else [runtime]


def _metrics(member: LocalEndpoint) -> EndpointMetrics | None:
    return None if member.endpoint is None else member.endpoint.metrics


async def _snapshot(member: LocalEndpoint) -> dict:
    """The endpoint's snapshot, taken on its own event loop (its state belongs to that thread)."""
    return member.endpoint.snapshot() if member.endpoint is not None else {}


def metric_data(samples: list[RequestSample], instances: int, gauges: dict[str, list[float]],
                dimensions: list[dict[str, str]], at: dt.datetime) -> dict[str, list[dict[str, Any]]]:
    """One interval's PutMetricData entries by namespace."""

    def datum(name: str, unit: str, values: Iterable[float]) -> dict[str, Any] | None:
        listed = [float(v) for v in values]
        if not listed:
            return None
        return {"MetricName": name, "Dimensions": dimensions, "Unit": unit, "Timestamp": at, "Values": listed}

    count = len(samples)
    sagemaker = [
        datum("Invocations", "None", [count]),
        datum("InvocationsPerInstance", "None", [count / instances]),
        datum("Invocation4XXErrors", "None", [sum(1 for s in samples if 400 <= s.status < 500)]),
        datum("Invocation5XXErrors", "None", [sum(1 for s in samples if 500 <= s.status < 600)]),
        datum("ModelLatency", "Microseconds", (s.model_us for s in samples if s.model_us > 0)),
        datum("OverheadLatency", "Microseconds", (s.overhead_us for s in samples if s.overhead_us > 0)),
        datum("ModelLoadingWaitTime", "Microseconds", (s.wait_us for s in samples if s.wait_us > 0)),
        datum("ModelCacheHit", "None", (1.0 if s.hit else 0.0 for s in samples if s.hit is not None)),
        datum("LoadedModelCount", "None", [sum(gauges.get("LoadedModelCount", []))] if "LoadedModelCount" in gauges else []),
    ]
    instance = [datum(name, "Percent", [sum(gauges[name]) / len(gauges[name])]) for name in INSTANCE_GAUGES
                if gauges.get(name)]
    return {SAGEMAKER_NS: [d for d in sagemaker if d], INSTANCE_NS: [d for d in instance if d]}


def _by_minute(samples: list[RequestSample]) -> list[tuple[dt.datetime, list[RequestSample]]]:
    """Samples grouped by the minute they were answered in, each group stamped with its last answer
    (naive UTC, as moto keeps times)."""
    groups: dict[int, list[RequestSample]] = {}
    for sample in samples:
        groups.setdefault(int(sample.at // 60), []).append(sample)
    return [(dt.datetime.fromtimestamp(max(s.at for s in batch), dt.timezone.utc).replace(tzinfo=None), batch)
            for _, batch in sorted(groups.items())]


class MetricsFeed:
    """Publishes every endpoint's metrics to moto's CloudWatch on a thread of its own."""

    def __init__(self, control_plane: ControlPlane, hosting: Hosting, interval_s: float) -> None:
        self.control_plane = control_plane
        self.hosting = hosting
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        enable_percentiles()
        self._thread = threading.Thread(target=self._run, name="mme-cloud-metrics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.publish()

    def publish(self) -> None:
        """One interval: every endpoint's requests and gauges since the last one."""
        from moto.backends import get_backend
        from moto.core import DEFAULT_ACCOUNT_ID

        at = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)  # moto keeps naive UTC times
        for region, endpoint, variant in self.control_plane.endpoints():
            runtime = self.hosting.runtime_of(region, endpoint)
            if runtime is None:
                continue
            samples: list[RequestSample] = []
            gauges: dict[str, list[float]] = {}
            members = _members(runtime)
            for member in members:
                metrics = _metrics(member)
                if metrics is None:
                    continue
                metrics.keep_samples()
                samples += metrics.take_samples()
                with contextlib.suppress(Exception):  # a member stopping under us: its gauges are left out
                    snapshot = member.call(_snapshot(member))
                    for name, value in (snapshot.get("gauges") or {}).items():
                        if value is not None:
                            gauges.setdefault(name, []).append(float(value))
            dimensions = [{"Name": "EndpointName", "Value": endpoint}, {"Name": "VariantName", "Value": variant}]
            backend = get_backend("cloudwatch")[DEFAULT_ACCOUNT_ID][region]
            # Requests under the minute they were answered in (an interval can straddle one, and the
            # last publish comes after the run ended: stamped now, its requests would miss the run's window).
            batches = _by_minute(samples) or [(at, [])]  # an interval with no request: zero counts, gauges
            for index, (stamp, batch) in enumerate(batches):
                last = index == len(batches) - 1
                for namespace, data in metric_data(batch, len(members), gauges if last else {}, dimensions, stamp).items():
                    if data:
                        backend.put_metric_data(namespace, data)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(Exception):
            self.publish()  # what was answered since the last interval
