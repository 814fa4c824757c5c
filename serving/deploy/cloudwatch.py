"""``mme metrics``: an endpoint's CloudWatch metrics for a run window, saved next to the run.

One GetMetricData request set (paginated) at a 60 s period over the window rounded out to
whole minutes: the invocation metrics of namespace ``AWS/SageMaker`` (MME ones included)
and the instance metrics of ``/aws/sagemaker/Endpoints``, both with the dimensions
``EndpointName`` and ``VariantName``. Saved as ``cloudwatch_metrics.json`` (one series per
metric and statistic) and ``cloudwatch_metrics.csv`` (one row per datapoint).
Latencies are in microseconds, utilisations in percent (per core / per GPU summed), as
CloudWatch reports them.
"""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterable

from mme.aws.errors import AwsError
from mme.aws.session import aws_errors, explain
from mme.fsutil import write_bytes_atomic, write_json_atomic

SAGEMAKER_NS = "AWS/SageMaker"
INSTANCE_NS = "/aws/sagemaker/Endpoints"
PERIOD_S = 60
JSON_FILE = "cloudwatch_metrics.json"
CSV_FILE = "cloudwatch_metrics.csv"
SCHEMA_VERSION = 1
CSV_FIELDS = ("timestamp", "namespace", "metric", "stat", "unit", "value")
ONE_MINUTE_RETENTION = timedelta(days=15)


@dataclass(frozen=True)
class MetricSpec:
    namespace: str
    name: str
    stats: tuple[str, ...]
    unit: str


METRICS = (
    MetricSpec(SAGEMAKER_NS, "Invocations", ("Sum",), "count"),
    MetricSpec(SAGEMAKER_NS, "InvocationsPerInstance", ("Sum",), "count"),
    MetricSpec(SAGEMAKER_NS, "ModelLatency", ("Average", "p50", "p90", "p99", "Maximum"), "microseconds"),
    MetricSpec(SAGEMAKER_NS, "OverheadLatency", ("Average", "p50", "p99", "Maximum"), "microseconds"),
    MetricSpec(SAGEMAKER_NS, "Invocation4XXErrors", ("Sum",), "count"),
    MetricSpec(SAGEMAKER_NS, "Invocation5XXErrors", ("Sum",), "count"),
    MetricSpec(SAGEMAKER_NS, "ModelLoadingWaitTime", ("Average", "Maximum", "SampleCount"), "microseconds"),
    MetricSpec(SAGEMAKER_NS, "ModelCacheHit", ("Sum", "Average"), "count"),  # Average: the hit ratio
    MetricSpec(SAGEMAKER_NS, "LoadedModelCount", ("Maximum", "Average"), "count"),
    MetricSpec(INSTANCE_NS, "CPUUtilization", ("Average", "Maximum"), "percent"),
    MetricSpec(INSTANCE_NS, "MemoryUtilization", ("Average", "Maximum"), "percent"),
    MetricSpec(INSTANCE_NS, "GPUUtilization", ("Average", "Maximum"), "percent"),
    MetricSpec(INSTANCE_NS, "GPUMemoryUtilization", ("Average", "Maximum"), "percent"),
)


@dataclass(frozen=True)
class Window:
    start: datetime  # UTC, whole minute
    end: datetime

    @classmethod
    def around(cls, start: datetime, end: datetime) -> "Window":
        start, end = _utc(start), _utc(end)
        if end <= start:
            raise AwsError(f"the metrics window ends ({end.isoformat()}) before it starts ({start.isoformat()}); check --start/--end")
        floor = start.replace(second=0, microsecond=0)
        ceil = end.replace(second=0, microsecond=0)
        if ceil < end:
            ceil += timedelta(minutes=1)
        return cls(floor, ceil)


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def parse_time(text: str, option: str) -> datetime:
    try:
        return _utc(datetime.fromisoformat(text.strip().replace("Z", "+00:00")))
    except ValueError:
        raise AwsError(f"{option} {text!r} is not an ISO 8601 time; write e.g. 2024-05-01T12:00:00Z") from None


@dataclass(frozen=True)
class Series:
    id: str
    namespace: str
    metric: str
    stat: str
    unit: str
    timestamps: tuple[str, ...]
    values: tuple[float, ...]


@dataclass(frozen=True)
class MetricsReport:
    endpoint: str
    variant: str
    region: str
    start: str
    end: str
    period_s: int
    fetched_at: str
    series: tuple[Series, ...]
    messages: tuple[str, ...] = ()
    schema_version: int = SCHEMA_VERSION

    @property
    def points(self) -> int:
        return sum(len(s.values) for s in self.series)


def query_id(index: int, spec: MetricSpec, stat: str) -> str:
    return f"m{index}_{spec.name.lower()}_{stat.lower()}"


def build_queries(endpoint: str, variant: str) -> list[dict]:
    dims = [{"Name": "EndpointName", "Value": endpoint}, {"Name": "VariantName", "Value": variant}]
    queries = []
    for index, spec in enumerate(METRICS):
        for stat in spec.stats:
            queries.append({
                "Id": query_id(index, spec, stat),
                "Label": f"{spec.name} {stat}",
                "MetricStat": {
                    "Metric": {"Namespace": spec.namespace, "MetricName": spec.name, "Dimensions": [dict(d) for d in dims]},
                    "Period": PERIOD_S,
                    "Stat": stat,
                },
                "ReturnData": True,
            })
    return queries


def _iso(moment: datetime) -> str:
    return _utc(moment).isoformat(timespec="seconds")


def fetch(cw: Any, endpoint: str, variant: str, window: Window, region: str,
          now: datetime | None = None) -> MetricsReport:
    queries = build_queries(endpoint, variant)
    lookup: dict[str, tuple[MetricSpec, str]] = {}
    for index, spec in enumerate(METRICS):
        for stat in spec.stats:
            lookup[query_id(index, spec, stat)] = (spec, stat)
    collected: dict[str, list[tuple[str, float]]] = {q["Id"]: [] for q in queries}
    messages: list[str] = []
    request: dict[str, Any] = {
        "MetricDataQueries": queries, "StartTime": window.start, "EndTime": window.end, "ScanBy": "TimestampAscending",
    }
    while True:
        try:
            reply = cw.get_metric_data(**request)
        except aws_errors() as exc:
            raise AwsError(explain(exc, "read CloudWatch metrics of", f"endpoint {endpoint}", "cloudwatch:GetMetricData")) from None
        for result in reply.get("MetricDataResults", ()):
            points = collected.setdefault(result["Id"], [])
            points.extend((_iso(t), float(v)) for t, v in zip(result.get("Timestamps", ()), result.get("Values", ())))
            if result.get("StatusCode") not in (None, "Complete", "PartialData"):
                messages.append(f"{result['Id']}: {result.get('StatusCode')}")
        messages.extend(f"{m.get('Code')}: {m.get('Value')}" for m in reply.get("Messages", ()))
        token = reply.get("NextToken")
        if not token:
            break
        request["NextToken"] = token
    series = []
    for qid, points in collected.items():
        spec, stat = lookup[qid]
        points = sorted(set(points))
        series.append(Series(qid, spec.namespace, spec.name, stat, spec.unit,
                             tuple(p[0] for p in points), tuple(p[1] for p in points)))
    fetched = now or datetime.now(timezone.utc)
    return MetricsReport(endpoint, variant, region, _iso(window.start), _iso(window.end), PERIOD_S,
                         _iso(fetched), tuple(series), tuple(messages))


def to_json(report: MetricsReport) -> dict:
    data = asdict(report)
    data["series"] = [
        {k: v for k, v in asdict(s).items() if k not in ("timestamps", "values")}
        | {"points": [[t, v] for t, v in zip(s.timestamps, s.values)]}
        for s in report.series
    ]
    return {"schema_version": data.pop("schema_version"), **data}


def csv_rows(report: MetricsReport) -> Iterable[tuple]:
    rows: list[tuple] = []
    for s in report.series:
        rows.extend((t, s.namespace, s.metric, s.stat, s.unit, v) for t, v in zip(s.timestamps, s.values))
    return sorted(rows, key=lambda r: (r[0], r[1], r[2], r[3]))


def save(report: MetricsReport, directory: Path) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = directory / JSON_FILE, directory / CSV_FILE
    write_json_atomic(json_path, to_json(report))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    writer.writerows(csv_rows(report))
    write_bytes_atomic(csv_path, buffer.getvalue().encode())
    return json_path, csv_path


def summary_lines(report: MetricsReport) -> list[str]:
    lines = [f"CloudWatch metrics of {report.endpoint}/{report.variant} ({report.region}), {report.start} .. {report.end}, {report.period_s} s period"]
    lines.append(f"  {'metric':<24} {'stat':<11} {'points':>6} {'min':>12} {'mean':>12} {'max':>12}  unit")
    for s in report.series:
        if s.values:
            low, mean, high = min(s.values), sum(s.values) / len(s.values), max(s.values)
            lines.append(f"  {s.metric:<24} {s.stat:<11} {len(s.values):>6} {low:>12.6g} {mean:>12.6g} {high:>12.6g}  {s.unit}")
        else:
            lines.append(f"  {s.metric:<24} {s.stat:<11} {0:>6} {'-':>12} {'-':>12} {'-':>12}  {s.unit}")
    return lines


def window_warnings(window: Window, now: datetime | None = None) -> list[str]:
    now = _utc(now or datetime.now(timezone.utc))
    notes = []
    if now - window.start > ONE_MINUTE_RETENTION:
        notes.append("the window starts more than 15 days ago: CloudWatch keeps 60 s datapoints for 15 days only")
    if window.end > now:
        notes.append("the window ends in the future: the last minutes have no datapoints yet (they arrive within a few minutes)")
    return notes
