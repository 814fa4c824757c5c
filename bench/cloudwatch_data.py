"""The one reader of the endpoint's CloudWatch metrics saved into a run directory
(``cloudwatch_metrics.json``, fetched and written by ``mme metrics --run``:
``serving.deploy.cloudwatch``), for the report's chart (``bench.charts``) and the cold-request
estimate (``bench.cold_estimate``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from serving.deploy.cloudwatch import JSON_FILE as CLOUDWATCH_FILE
from serving.deploy.cloudwatch import SCHEMA_VERSION

_UNIT_SCALE = {"microseconds": 1e-3, "milliseconds": 1.0, "seconds": 1e3}

# (metric, stat) -> datapoints (period start, value), oldest first
SeriesByMetric = dict[tuple[str, str], list[tuple[datetime, float]]]


@dataclass(frozen=True)
class CloudWatchMetrics:
    """A saved ``cloudwatch_metrics.json``, values in the report's units (latencies in ms)."""

    period_s: int
    series: SeriesByMetric


def utc_time(text: str) -> datetime:
    """An ISO 8601 time ("Z" or an offset; none means UTC) as an aware datetime."""
    moment = datetime.fromisoformat(str(text).strip().replace("Z", "+00:00"))
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment


def parse_cloudwatch(data: object) -> CloudWatchMetrics:
    """The period and the datapoints of a ``cloudwatch_metrics.json``'s content (as
    ``serving.deploy.cloudwatch.to_json`` makes it), keyed by (metric, stat), values in the
    chart's units (latencies in ms). Raises ValueError on anything malformed."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"schema version {data.get('schema_version')!r}, this mme reads {SCHEMA_VERSION}")
    period = data.get("period_s", 60)
    series = data.get("series")
    if not isinstance(series, list) or isinstance(period, bool) or not isinstance(period, int) or period <= 0:
        raise ValueError("no 'series' list or no positive 'period_s'")
    out: SeriesByMetric = {}
    for n, s in enumerate(series):
        try:
            # SampleCount counts datapoints whatever the metric's unit
            scale = 1.0 if s["stat"] == "SampleCount" else _UNIT_SCALE.get(s.get("unit"), 1.0)
            points = [(utc_time(t), float(v) * scale) for t, v in s["points"]]
            out[(str(s["metric"]), str(s["stat"]))] = sorted(points, key=lambda p: p[0])
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"series {n} malformed ({type(exc).__name__}: {exc})") from None
    return CloudWatchMetrics(period, out)


def read_cloudwatch(run_dir: Path) -> CloudWatchMetrics | None:
    """The run directory's saved CloudWatch metrics; None when there are none. Raises
    OSError or ValueError (the reason) when the file is there but unusable."""
    path = run_dir / CLOUDWATCH_FILE
    if not path.exists():
        return None
    return parse_cloudwatch(json.loads(path.read_text()))
