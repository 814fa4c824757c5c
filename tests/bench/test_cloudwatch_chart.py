"""`mme report` draws the CloudWatch metrics `mme metrics --run` saved into a run directory
(cloudwatch_metrics.json, written here by serving.deploy.cloudwatch.save itself)."""

from __future__ import annotations

import base64
import io
import json
import math
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

from mme.cli import main
from serving.deploy import cloudwatch
from tests.bench.runs import RunBuilder

START = datetime(2025, 1, 1, tzinfo=timezone.utc)  # RunBuilder's run.json started_at
MINUTES = 12
IMAGE = re.compile(r'src="data:image/png;base64,([^"]+)"')


def long_run(run_dir: Path) -> Path:
    """Four two-minute stages (10, 20, 40, 80 users) starting at the run's start."""
    b = RunBuilder(run_dir)
    for i, users in enumerate((10, 20, 40, 80)):
        b.stage(users, 120.0 * i, 120.0 * (i + 1))
        b.ok(i, [20.0 + 10 * i] * 5)
    return b.write()


def value(spec: cloudwatch.MetricSpec, stat: str, minute: int) -> float:
    load = min(1.0, minute / 8)  # grows with the stages, then flat
    if spec.unit == "microseconds":
        base = {"ModelLatency": 20_000, "OverheadLatency": 2_000, "ModelLoadingWaitTime": 900_000}[spec.name]
        factor = {"Average": 1.0, "p50": 0.9, "p90": 1.6, "p99": 2.5, "Maximum": 3.5, "SampleCount": 0}[stat]
        return 3.0 * (minute % 4 == 1) if stat == "SampleCount" else base * factor * (1 + load)
    if spec.unit == "percent":
        return (70.0 if stat == "Average" else 90.0) * load + 5 * math.sin(minute)
    counts = {"Invocations": 600 * load, "InvocationsPerInstance": 600 * load, "Invocation4XXErrors": 0.0,
              "Invocation5XXErrors": 12.0 * (minute >= 9), "ModelCacheHit": 580 * load,
              "LoadedModelCount": 4 + 6 * load}
    if spec.name == "ModelCacheHit" and stat == "Average":  # the hit ratio
        return 0.5 + 0.45 * load
    return counts[spec.name]


def metrics_report(minutes: int = MINUTES) -> cloudwatch.MetricsReport:
    series = []
    for index, spec in enumerate(cloudwatch.METRICS):
        for stat in spec.stats:
            times = [START + timedelta(minutes=m) for m in range(minutes)]
            series.append(cloudwatch.Series(
                cloudwatch.query_id(index, spec, stat), spec.namespace, spec.name, stat, spec.unit,
                tuple(t.isoformat(timespec="seconds") for t in times),
                tuple(float(value(spec, stat, m)) for m in range(minutes))))
    end = START + timedelta(minutes=minutes)
    return cloudwatch.MetricsReport("mme-r", "AllTraffic", "us-east-1", START.isoformat(timespec="seconds"),
                                    end.isoformat(timespec="seconds"), cloudwatch.PERIOD_S,
                                    end.isoformat(timespec="seconds"), tuple(series))


def report(capsys, run_dir: Path) -> tuple[str, str]:
    code = main(["report", str(run_dir)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Traceback" not in err
    return (run_dir / "report.html").read_text(), err


def test_cloudwatch_metrics_are_drawn_and_embedded(tmp_path, capsys):
    run_dir = long_run(tmp_path / "run")
    html_without, _ = report(capsys, run_dir)
    assert not (run_dir / "cloudwatch.png").exists()

    json_path, _ = cloudwatch.save(metrics_report(), run_dir)
    assert json_path.name == "cloudwatch_metrics.json"
    html, err = report(capsys, run_dir)
    assert "WARNING" not in err
    png = (run_dir / "cloudwatch.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    image = matplotlib.image.imread(io.BytesIO(png), format="png")
    assert image.shape[0] > 600 and image.shape[1] > 800
    assert image[..., :3].std() > 0.05  # something is drawn, not a blank canvas

    images = IMAGE.findall(html)
    assert len(images) == len(IMAGE.findall(html_without)) + 1
    assert base64.b64decode(images[-1]) == png
    assert "CloudWatch metrics" in html
    assert "](cloudwatch.png)" in (run_dir / "report.md").read_text()


def test_cloudwatch_series_units_and_keys():
    from bench.cloudwatch_data import parse_cloudwatch

    saved = parse_cloudwatch(cloudwatch.to_json(metrics_report(3)))
    period, series = saved.period_s, saved.series
    assert period == 60
    latency = series[("ModelLatency", "Average")]
    assert [round(v, 3) for _, v in latency] == [20.0, 22.5, 25.0]  # microseconds -> ms
    assert latency[0][0] == START
    assert series[("CPUUtilization", "Average")][0][1] == 0.0  # percent stays percent
    assert [v for _, v in series[("ModelLoadingWaitTime", "SampleCount")]] == [0.0, 3.0, 0.0]  # a count


def test_malformed_cloudwatch_file_warns_and_still_reports(tmp_path, capsys):
    run_dir = long_run(tmp_path / "run")
    html_without, _ = report(capsys, run_dir)
    bad = run_dir / "cloudwatch_metrics.json"
    for text in ("{not json", json.dumps({"schema_version": 1, "series": [{"metric": "Invocations"}]}),
                 json.dumps([1, 2]), json.dumps(cloudwatch.to_json(metrics_report(0)))):
        bad.write_text(text)
        html, err = report(capsys, run_dir)
        warnings = [line for line in err.splitlines() if line.startswith("WARNING:")]
        assert len(warnings) == 1 and "cloudwatch_metrics.json" in warnings[0], err
        assert not (run_dir / "cloudwatch.png").exists()
        assert len(IMAGE.findall(html)) == len(IMAGE.findall(html_without))
        assert (run_dir / "report.md").stat().st_size > 0
