"""Cold requests on an endpoint that does not say which requests waited for a load
(SageMaker): estimated from the run's latencies and CloudWatch's ModelLoadingWaitTime
SampleCount saved by `mme metrics --run` (serving.deploy.cloudwatch.save writes the file
here), the method named in summary.json and the report."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from bench.analysis import analyse
from bench.cold_estimate import COLD_ESTIMATE_METHOD
from bench.results import RequestRecord
from bench.summary_records import COLD_METHOD
from mme.cli import main
from serving.deploy import cloudwatch
from tests.bench.runs import RunBuilder

START = datetime(2025, 1, 1, tzinfo=timezone.utc)  # RunBuilder's run.json started_at
WARM_MS = 50.0
# (sent at, latency ms): slow requests; the one sent at 59 s finishes in the second minute
SLOW = [(5.0, 3000.0), (7.0, 2500.0), (20.0, 900.0), (59.0, 3000.0), (65.0, 4000.0)]


def _run(run_dir: Path, cold: int | None = None) -> RunBuilder:
    """One 3-minute stage: a 50 ms request every second, the slow ones above, one failure."""
    b = RunBuilder(run_dir)
    b.stage(10, 0.0, 180.0)
    slow = dict(SLOW)
    for second in range(180):
        t = float(second)
        b.requests.append(RequestRecord(t, 0, 10, f"m-v{second % 3 + 1}.tar.gz", slow.get(t, WARM_MS), 1, 200, "",
                                        "host:1", cold=cold))
    b.fail(0, 8.5, 10, latency=9000.0)  # slowest of all, but failed: never counted as cold
    return b


def _save_waited(run_dir: Path, per_minute: list[float] | None) -> None:
    """cloudwatch_metrics.json with ModelLoadingWaitTime's SampleCount per minute (None: without it)."""
    times = tuple((START + timedelta(minutes=m)).isoformat(timespec="seconds") for m in range(3))
    series = [cloudwatch.Series("m0", "AWS/SageMaker", "Invocations", "Sum", "count", times, (60.0, 60.0, 60.0))]
    if per_minute is not None:
        series.append(cloudwatch.Series("m1", "AWS/SageMaker", "ModelLoadingWaitTime", "SampleCount", "microseconds",
                                        times, tuple(per_minute)))
    end = (START + timedelta(minutes=3)).isoformat(timespec="seconds")
    cloudwatch.save(cloudwatch.MetricsReport("mme-r", "AllTraffic", "us-east-1", times[0], end, 60, end,
                                             tuple(series)), run_dir)


def test_the_slowest_requests_of_each_minute_are_the_ones_cloudwatch_says_waited(tmp_path):
    run_dir = _run(tmp_path / "run").write(endpoint="mme-r", endpoint_url=None)
    _save_waited(run_dir, [2.0, 2.0, 0.0])
    summary = analyse(run_dir)
    o = summary.overall
    # minute 0: 3000 and 2500 ms (not the 900 ms one, nor the failed one); minute 1: 4000 ms and
    # the 3000 ms request sent at 59 s, which finished at 62 s
    assert o.cold_requests == 4 and o.cold_method == COLD_ESTIMATE_METHOD
    assert o.cold_max_ms == 4000.0 and o.cold_p50_ms == pytest.approx(3000.0)
    assert o.warm_p50_ms == WARM_MS and o.warm_p99_ms < 900.0 + 1e-9
    assert summary.stages[0].cold_requests == 4

    assert main(["report", str(run_dir)]) == 0
    report = (run_dir / "report.md").read_text()
    assert "estimated: in each CloudWatch period" in report
    saved = json.loads((run_dir / "summary.json").read_text())
    assert saved["overall"]["cold_requests"] == 4 and saved["overall"]["cold_method"] == COLD_ESTIMATE_METHOD


def test_more_waits_than_requests_in_a_minute_marks_what_there_is(tmp_path):
    run_dir = _run(tmp_path / "run").write(endpoint="mme-r", endpoint_url=None)
    _save_waited(run_dir, [500.0, 0.0, 0.0])  # other clients' loads in the same minute
    o = analyse(run_dir).overall
    assert o.cold_requests == 59 and o.warm_p50_ms == WARM_MS  # minute 0's successes (the 59 s one ends later)


def test_the_endpoints_own_word_wins_over_the_estimate(tmp_path):
    b = _run(tmp_path / "run", cold=0)
    b.requests[65] = replace(b.requests[65], cold=1)
    run_dir = b.write()
    _save_waited(run_dir, [2.0, 2.0, 0.0])
    o = analyse(run_dir).overall
    assert o.cold_requests == 1 and o.cold_method == COLD_METHOD and o.cold_max_ms == 4000.0


def test_without_cloudwatch_waits_cold_requests_stay_unknown(tmp_path):
    run_dir = _run(tmp_path / "run").write(endpoint="mme-r", endpoint_url=None)
    assert analyse(run_dir).overall.cold_requests is None  # no file: nothing claimed
    _save_waited(run_dir, None)
    summary = analyse(run_dir)
    assert summary.overall.cold_requests is None and summary.overall.cold_method is None
    assert any("no ModelLoadingWaitTime SampleCount" in w for w in summary.warnings)
