"""mme metrics: the GetMetricData request (checked by Stubber against CloudWatch's model),
pagination, and the files saved into a bench run directory."""

from __future__ import annotations

import csv
import json
from datetime import datetime, timezone

import pytest

from bench.results import RunInfo
from serving.deploy import cloudwatch
from mme.aws.errors import AwsError

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)


def _run_dir(tmp_path, **overrides):
    run_dir = tmp_path / "results" / "run-1"
    run_dir.mkdir(parents=True)
    fields = dict(run_id="run-1", endpoint="mme-r", endpoint_url=None, region="us-east-1", mode="multi", model="r50",
                  format="onnx", instance_type="ml.g5.2xlarge", copies=3, target_distribution="uniform", client="fast",
                  workers=1, shape="staged", content_type="application/json", payload_bytes=600_000,
                  started_at="2024-05-01T12:00:30+00:00", ended_at="2024-05-01T12:05:10+00:00")
    fields.update(overrides)
    RunInfo(**fields).write(run_dir)
    return run_dir


def test_queries_cover_both_namespaces_with_endpoint_and_variant_dimensions():
    queries = cloudwatch.build_queries("mme-r", "AllTraffic")
    by_metric = {}
    for q in queries:
        stat = q["MetricStat"]
        assert stat["Period"] == 60
        assert stat["Metric"]["Dimensions"] == [{"Name": "EndpointName", "Value": "mme-r"}, {"Name": "VariantName", "Value": "AllTraffic"}]
        by_metric.setdefault(stat["Metric"]["MetricName"], set()).add(stat["Metric"]["Namespace"])
    assert {m for m, ns in by_metric.items() if ns == {"AWS/SageMaker"}} == {
        "Invocations", "ModelLatency", "OverheadLatency", "InvocationsPerInstance", "Invocation4XXErrors",
        "Invocation5XXErrors", "ModelLoadingWaitTime", "ModelCacheHit", "LoadedModelCount"}
    assert {m for m, ns in by_metric.items() if ns == {"/aws/sagemaker/Endpoints"}} == {
        "CPUUtilization", "MemoryUtilization", "GPUUtilization", "GPUMemoryUtilization"}
    assert len({q["Id"] for q in queries}) == len(queries)


def test_metrics_for_a_run_are_fetched_paginated_and_saved(tmp_path, stubbed, run_cli, monkeypatch):
    run_dir = _run_dir(tmp_path)
    cw, stub = stubbed("cloudwatch")
    queries = cloudwatch.build_queries("mme-r", "AllTraffic")
    expected = {"MetricDataQueries": queries, "StartTime": T0, "EndTime": T0.replace(minute=6),
                "ScanBy": "TimestampAscending"}
    ids = {q["Label"]: q["Id"] for q in queries}
    t = [T0.replace(minute=m) for m in range(6)]
    stub.add_response("get_metric_data", {
        "MetricDataResults": [
            {"Id": ids["Invocations Sum"], "Label": "Invocations Sum", "Timestamps": t[:3], "Values": [10.0, 200.0, 400.0], "StatusCode": "PartialData"},
            {"Id": ids["ModelLatency p99"], "Label": "ModelLatency p99", "Timestamps": t[:2], "Values": [52000.0, 61000.0], "StatusCode": "Complete"},
        ],
        "NextToken": "page-2",
    }, expected)
    stub.add_response("get_metric_data", {
        "MetricDataResults": [
            {"Id": ids["Invocations Sum"], "Label": "Invocations Sum", "Timestamps": t[3:], "Values": [380.0, 390.0, 5.0], "StatusCode": "Complete"},
            {"Id": ids["GPUMemoryUtilization Maximum"], "Label": "x", "Timestamps": [t[1]], "Values": [81.5], "StatusCode": "Complete"},
        ],
    }, dict(expected, NextToken="page-2"))
    monkeypatch.setattr("mme.aws.session.client", lambda session, service, endpoint_url=None: cw)

    code, out, err = run_cli("metrics", "--run", str(run_dir))
    assert code == 0, err
    stub.assert_no_pending_responses()
    saved = json.loads((run_dir / "cloudwatch_metrics.json").read_text())
    assert (saved["endpoint"], saved["variant"], saved["region"], saved["period_s"]) == ("mme-r", "AllTraffic", "us-east-1", 60)
    assert (saved["start"], saved["end"]) == ("2024-05-01T12:00:00+00:00", "2024-05-01T12:06:00+00:00")
    series = {(s["metric"], s["stat"]): s for s in saved["series"]}
    assert [p[1] for p in series[("Invocations", "Sum")]["points"]] == [10.0, 200.0, 400.0, 380.0, 390.0, 5.0]
    assert series[("ModelLatency", "p99")]["unit"] == "microseconds"
    assert series[("GPUMemoryUtilization", "Maximum")]["namespace"] == "/aws/sagemaker/Endpoints"
    assert series[("CPUUtilization", "Average")]["points"] == []
    rows = list(csv.DictReader((run_dir / "cloudwatch_metrics.csv").open()))
    assert len(rows) == 6 + 2 + 1
    assert rows[0] == {"timestamp": "2024-05-01T12:00:00+00:00", "namespace": "AWS/SageMaker", "metric": "Invocations",
                       "stat": "Sum", "unit": "count", "value": "10.0"}
    assert "Invocations" in out and "written" in out.splitlines()[-1]


def test_window_checks(tmp_path, run_cli, aws_env):
    with pytest.raises(AwsError, match="ends"):
        cloudwatch.Window.around(T0, T0.replace(minute=0, second=0))
    window = cloudwatch.Window.around(T0.replace(second=59), T0.replace(minute=1, second=1))
    assert (window.start, window.end) == (T0, T0.replace(minute=2))
    with pytest.raises(AwsError, match="ISO 8601"):
        cloudwatch.parse_time("yesterday", "--start")
    run_dir = _run_dir(tmp_path, ended_at=None)
    code, _, err = run_cli("metrics", "--run", str(run_dir))
    assert code == 2 and "has no ended_at" in err
    code, _, err = run_cli("metrics", "--start", "2024-05-01T12:00:00Z")
    assert code == 2 and "--endpoint is required" in err
