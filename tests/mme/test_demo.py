"""`mme demo` chains package, capacity, serve, bench and report: a small, fast version."""

from __future__ import annotations

import pytest

import csv
import json
from pathlib import Path

from bench.stages import peak_users_for
from mme.cli import main

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def test_demo_end_to_end(tmp_path, capsys):
    code = main(["demo", "--model", "test_resnet", "--out", str(tmp_path / "artifacts"), "--results",
                 str(tmp_path / "results"), "--memory-limit", "300M", "--time-scale", "0.03", "--max-copies", "4"])
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0
    html = next((tmp_path / "results").glob("demo-*-test_resnet/report.html"))
    run_dir = html.parent
    assert f"open {html}" in out
    text = html.read_text()
    assert text.count("data:image/png;base64,") >= 2  # latency/throughput and endpoint model charts
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["stages"]) == 11  # the article's staged shape, time-compressed
    capacity = json.loads((run_dir / "capacity.json").read_text())
    run = json.loads((run_dir / "run.json").read_text())
    assert run["copies"] == min(4, capacity["actual_copies"])
    # copies counted as they are while serving: served under the same limit, they stay under it
    assert capacity["counted"] == "loaded" and capacity["limit_bytes"] == 300 * 2**20
    peak = max(s["memory_utilization"] for s in summary["stages"] if s["memory_utilization"] is not None)
    assert 0 < peak <= 100, peak
    assert summary["overall"]["failures"] == 0
    assert (run_dir / "latency_throughput.png").stat().st_size > 10_000
    # the load sized from what the capacity run measured, and the copies counted with that many in flight
    peak = peak_users_for(capacity["served_rps"], capacity["served_latency_ms"] / 1000, (0.05, 0.5))
    assert max(s["users"] for s in summary["stages"]) == peak == capacity["overhead_concurrency"]
    assert f"peak {peak} users: one copy served {capacity['served_rps']:.2f} requests/s" in captured.err
    assert "memory per stage (users: % of the limit)" in out and "under the 90% threshold at every stage" in out
    assert "breaking point: not reached: no failure up to" in out


def test_demo_realtime_end_to_end(tmp_path, capsys):
    """The second article's flow: package, a real-time endpoint (no TargetModel), staged load,
    the report with the per-level table and the instances for a target TPS at 60% and 70%."""
    code = main(["demo-realtime", "--model", "prajjwal1/bert-tiny", "--out", str(tmp_path / "artifacts"), "--results",
                 str(tmp_path / "results"), "--time-scale", "0.03", "--target-tps", "500", "--p95-slo-ms", "5000",
                 "--in-process", "2"])
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0
    markdown = next((tmp_path / "results").glob("demo-realtime-*-prajjwal1--bert-tiny/report.md"))
    run_dir = markdown.parent
    run = json.loads((run_dir / "run.json").read_text())
    assert run["mode"] == "single" and run["copies"] == 0
    # text in: the packaged tokenizer's ensemble, sent the article's sentence
    assert run["content_type"] == "application/json" and run["extra"]["payload_source"].endswith("sample_request.json")
    sample = json.loads(Path(run["extra"]["payload_source"]).read_text())
    assert sample["inputs"][0]["datatype"] == "BYTES" and sample["inputs"][0]["data"] == ["I am super happy right now."]
    baseline = run["extra"]["in_process"]
    assert baseline["pipeline"] == "packaged tokenizer + encoder" and baseline["requests"] > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["stages"]) == 11 and summary["overall"]["failures"] == 0
    text = markdown.read_text()
    assert "## Sizing: 500 TPS with p95 <= 5000 ms" in text
    table = [line for line in text.split("## Sizing", 1)[1].splitlines() if line.startswith("|")]
    row = table[2]  # header, separator, the run's row
    cells = [c.strip() for c in row.strip("|").split("|")]
    at60, at70 = int(cells[4]), int(cells[5])
    assert at60 >= at70 >= 1  # more headroom, more instances
    assert f"{baseline['requests_per_s']:.2f} requests/s" in text and "of it" in text
    assert f"open {run_dir / 'report.html'}" in out
    # the load sized from the in-process baseline measured first (recorded, not measured again)
    peak = peak_users_for(baseline["requests_per_s"], baseline["p50_ms"] / 1000, (0.05, 0.5))
    assert max(s["users"] for s in summary["stages"]) == peak
    assert f"peak {peak} users: the in-process baseline served {baseline['requests_per_s']:.2f} requests/s" in captured.err


def test_a_load_that_breaks_the_endpoint_is_the_demos_finding(tmp_path, capsys):
    """Every request past its (1 ms) timeout: the demo still writes the report and the capacity,
    names the breaking point and exits 0."""
    code = main(["demo", "--model", "test_resnet", "--out", str(tmp_path / "artifacts"), "--results",
                 str(tmp_path / "results"), "--memory-limit", "300M", "--time-scale", "0.03", "--max-copies", "2",
                 "--peak-users", "20", "--timeout", "0.001"])
    out = capsys.readouterr().out
    assert code == 0
    html = next((tmp_path / "results").glob("demo-*-test_resnet/report.html"))
    run_dir = html.parent
    assert f"open {html}" in out and (run_dir / "capacity.json").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    overall = summary["overall"]
    assert overall["failure_rate"] > 0.01 and max(s["users"] for s in summary["stages"]) == 20
    assert f"the load broke the endpoint: {overall['failures']} of {overall['requests']} requests failed" in out
    broke = (f"{overall['breaking_users']} users ({overall['breaking_failures']} of {overall['breaking_requests']} "
             "requests failed)")
    expected = (f"failures from the first stage on: {broke}" if overall["before_breaking_stage"] is None else
                f"{overall['before_breaking_users']} users at {overall['before_breaking_rps']:.2f} requests/s; "
                f"first failures at {broke}")
    assert f"breaking point: {expected}" in out
    assert "breaking point (the last stage before the first failures)" in (run_dir / "report.md").read_text()


def test_demo_fleet_puts_the_predicted_hit_ratio_next_to_the_measured_one(tmp_path, capsys):
    """A catalogue packaged with two jobs, measured, its run predicted, served under a limit that
    holds part of it, the mix sent open loop, and the report's per-model table."""
    code = main(["demo-fleet", "--models", "test_resnet,test_vit,test_convnext", "--memory-limit", "330M",
                 "--rps", "3", "--duration", "25", "--out", str(tmp_path / "artifacts"),
                 "--results", str(tmp_path / "results")])
    out = capsys.readouterr().out
    assert code == 0
    run_dir = next((tmp_path / "results").glob("demo-fleet-*-run"))
    run = json.loads((run_dir / "run.json").read_text())
    assert run["extra"]["mix"]["targets"] == ["test_resnet.tar.gz", "test_vit.tar.gz", "test_convnext.tar.gz"]
    plan = json.loads((run_dir / "fleet-plan.json").read_text())
    predicted = {m["target"]: m["hit_ratio"] for m in plan["plans"][0]["simulation"]["models"]}
    rows = {row["target"]: row for row in csv.DictReader((run_dir / "per_model.csv").open())}
    assert set(rows) == set(predicted)
    assert sum(int(r["requests"]) for r in rows.values()) > 30
    assert int(rows["test_resnet.tar.gz"]["requests"]) > int(rows["test_convnext.tar.gz"]["requests"])  # Zipf
    for target, row in rows.items():
        assert row["hit_ratio"] != "" and 0.0 <= float(row["hit_ratio"]) <= 1.0
        assert float(row["predicted_hit_ratio"]) == round(predicted[target], 4)
    text = (run_dir / "report.md").read_text()
    assert "### Per model" in text and "predicted hit ratio" in text
    assert "overall: measured" in out and "predicted" in out
    summary = json.loads((tmp_path / "artifacts" / "catalogue-summary.json").read_text())
    assert summary["jobs"] == 2 and summary["counts"]["packaged"] == 3


def test_demo_cloud_end_to_end(tmp_path, capsys, monkeypatch):
    """The first article's cloud loop on a local SageMaker: push, deploy, staged bench, CloudWatch
    metrics, report, delete, through the commands; the report's CloudWatch section has figures."""
    for name in [n for n in __import__("os").environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    code = main(["demo-cloud", "--model", "test_resnet", "--out", str(tmp_path / "artifacts"), "--results",
                 str(tmp_path / "results"), "--copies", "3", "--time-scale", "0.03"])
    out = capsys.readouterr().out
    assert code == 0
    html = next((tmp_path / "results").glob("demo-cloud-*-test_resnet/report.html"))
    run_dir = html.parent
    assert f"open {html}" in out and "mme deploy -> first successful invoke:" in out
    run = json.loads((run_dir / "run.json").read_text())
    assert run["copies"] == 3 and run["endpoint"] == "mme-demo-cloud" and run["endpoint_url"].startswith("http://127.0.0.1:")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["overall"]["failures"] == 0
    cloudwatch = json.loads((run_dir / "cloudwatch_metrics.json").read_text())
    series = {(s["metric"], s["stat"]): [v for _, v in s["points"]] for s in cloudwatch["series"]}
    # every request the bench sent (and the demo's first invoke), counted by the endpoint, read back from CloudWatch
    requests = summary["overall"]["requests"]
    assert requests <= sum(series[("Invocations", "Sum")]) <= requests + 1
    assert series[("ModelLatency", "p99")] and series[("LoadedModelCount", "Maximum")][-1] == 3
    assert "CloudWatch" in (run_dir / "report.md").read_text()
    assert not list((tmp_path / "results" / "demo-cloud-deployments").glob("*.json"))  # mme delete removed its state
