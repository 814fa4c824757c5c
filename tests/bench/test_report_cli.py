"""`mme report` end to end, through mme.cli.main, on runs built by hand."""

from __future__ import annotations

import base64
import io
import json
import re

import pytest

from mme.cli import main
from tests.bench.runs import RunBuilder, clean_run, sizing_run, staged_run


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def decode_png(data: bytes):
    import matplotlib.image

    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(io.BytesIO(data), format="png")
    assert image.shape[0] > 200 and image.shape[1] > 400
    return image


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("mme: error: ")
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_single_run_report(tmp_path, capsys):
    run_dir = staged_run(tmp_path / "r50-onnx")
    code, out, _ = run_cli(capsys, "report", str(run_dir))
    assert code == 0
    assert f"HTML report: {run_dir / 'report.html'}" in out
    assert "max users before first failure 20" in out
    for name in ("summary.csv", "summary.json", "latency_throughput.png", "report.html", "report.md"):
        assert (run_dir / name).stat().st_size > 0, name
    assert not (run_dir / "endpoint_models.png").exists()  # no endpoint metrics in this run
    decode_png((run_dir / "latency_throughput.png").read_bytes())
    html = (run_dir / "report.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(images) == 1
    assert base64.b64decode(images[0]) == (run_dir / "latency_throughput.png").read_bytes()
    assert "<th>p95 ms</th>" in html and "<td>45.5</td>" in html  # stage table, stage 1 p90
    assert 'tr class="saturated"' in html and "generator saturated: unreliable" in html
    md = (run_dir / "report.md").read_text()
    assert "| stage | users |" in md and "](latency_throughput.png)" in md
    assert json.loads((run_dir / "summary.json").read_text())["overall"]["first_failure_users"] == 37


def test_comparison_of_two_runs_with_sizing(tmp_path, capsys):
    a = clean_run(tmp_path / "runs" / "a-pytorch", p50s=(12.0, 14.0, 20.0), format="torchscript", models_loaded=46)
    b = staged_run(tmp_path / "runs" / "b-tensorrt", format="tensorrt", models_loaded=23)
    out_dir = tmp_path / "cmp"
    code, out, _ = run_cli(capsys, "report", str(a), str(b), "--out", str(out_dir),
                           "--target-tps", "100", "--p95-slo-ms", "30")
    assert code == 0
    for name in ("comparison.png", "report.html", "report.md"):
        assert (out_dir / name).stat().st_size > 0
    for run_dir in (a, b):
        assert (run_dir / "summary.json").exists() and (run_dir / "latency_throughput.png").exists()
    decode_png((out_dir / "comparison.png").read_bytes())
    html = (out_dir / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3
    assert "<h2>Comparison</h2>" in html and "Sizing: 100 TPS" in html
    assert "resnet50 torchscript (ml.g5.2xlarge)" in html and "resnet50 tensorrt (ml.g5.2xlarge)" in html
    # a: 6 req/s at p95 20 ms -> ceil(100 / 3.6) = 28 at 60%, ceil(100 / 4.2) = 24 at 70%
    assert "28 instances at 60% utilisation, 24 at 70%" in out
    # b: stage 1 is error-free at 1 req/s with p95 47.75 > 30; stage 0 (0.4 req/s, p95 38.5) too
    assert "no error-free stage had p95 <= 30 ms" in out
    md = (out_dir / "report.md").read_text()
    assert "## Comparison" in md and "../runs/a-pytorch/latency_throughput.png" in md
    assert f"HTML report: {out_dir / 'report.html'}" in out


def test_directory_of_runs_and_default_output(tmp_path, capsys, monkeypatch):
    clean_run(tmp_path / "results" / "one")
    clean_run(tmp_path / "results" / "two", format="cpu-local")
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(capsys, "-q", "report", "results")
    assert code == 0
    reports = list((tmp_path / "results").glob("report-*/report.html"))
    assert len(reports) == 1 and f"HTML report: {reports[0].relative_to(tmp_path)}" in out
    assert (reports[0].parent / "comparison.png").exists()


def test_endpoint_metrics_chart_and_columns(tmp_path, capsys):
    builder = RunBuilder(tmp_path / "run")
    for i, users in enumerate((10, 20)):
        builder.stage(users, 10.0 * i, 10.0 * (i + 1))
        builder.ok(i, [20.0, 25.0])
    run_dir = builder.write()
    builder.metrics(0, {"ModelLoads": 5, "ModelCacheMiss": 5, "ModelCacheHit": 1}, loaded=5)
    builder.metrics(1, {"ModelLoads": 9, "ModelEvictions": 2, "ModelCacheMiss": 9, "ModelCacheHit": 4}, loaded=7)
    code, _, _ = run_cli(capsys, "report", str(run_dir))
    assert code == 0
    decode_png((run_dir / "endpoint_models.png").read_bytes())
    html = (run_dir / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 2 and "<th>evictions</th>" in html


@pytest.mark.parametrize("case", ["zero-requests", "all-failed"])
def test_degenerate_runs_still_report(tmp_path, capsys, case):
    builder = RunBuilder(tmp_path / case)
    builder.stage(10, 0.0, 10.0)
    if case == "all-failed":
        builder.fail(0, t=1.0, users=10)
    run_dir = builder.write(stopped_reason="interrupted")
    other = sizing_run(tmp_path / "other")
    code, out, err = run_cli(capsys, "report", str(run_dir), str(other), "--out", str(tmp_path / "out"),
                             "--target-tps", "10", "--p95-slo-ms", "100")
    assert code == 0, err
    decode_png((run_dir / "latency_throughput.png").read_bytes())
    decode_png((tmp_path / "out" / "comparison.png").read_bytes())
    assert "partial" in (tmp_path / "out" / "report.html").read_text()


def test_bad_inputs_give_one_line_errors(tmp_path, capsys):
    good = clean_run(tmp_path / "good")
    code, _, err = run_cli(capsys, "report", str(tmp_path / "missing"))
    assert_one_line_error(code, err, "does not exist")

    (tmp_path / "not-a-run").mkdir()
    code, _, err = run_cli(capsys, "report", str(good), str(tmp_path / "not-a-run"))
    assert_one_line_error(code, err, "not-a-run is not a bench run")
    assert not (good / "summary.json").exists()  # input is all checked before anything is written

    no_requests = clean_run(tmp_path / "no-requests")
    (no_requests / "requests.csv").unlink()
    code, _, err = run_cli(capsys, "report", str(no_requests))
    assert_one_line_error(code, err, "has no requests.csv")

    bad_value = clean_run(tmp_path / "bad-value")
    with (bad_value / "requests.csv").open("a") as fh:
        fh.write("12.5,0,10,m.tar.gz,fast,1,200,,host:1\n")
    code, _, err = run_cli(capsys, "report", str(bad_value))
    assert_one_line_error(code, err, "cannot read", "requests.csv", "line 122")

    bad_header = clean_run(tmp_path / "bad-header")
    (bad_header / "requests.csv").write_text("when,how_long\n1,2\n")
    code, _, err = run_cli(capsys, "report", str(bad_header))
    assert_one_line_error(code, err, "missing column(s) t, stage")

    binary = clean_run(tmp_path / "binary")
    (binary / "stages.csv").write_bytes(b"\xff\xfe\x00garbage")
    code, _, err = run_cli(capsys, "report", str(binary))
    assert_one_line_error(code, err, "stages.csv")

    broken_json = clean_run(tmp_path / "broken-json")
    (broken_json / "run.json").write_text("{not json")
    code, _, err = run_cli(capsys, "report", str(broken_json))
    assert_one_line_error(code, err, "not valid JSON")

    incomplete = clean_run(tmp_path / "incomplete")
    (incomplete / "run.json").write_text('{"schema_version": 1, "run_id": "x"}')
    code, _, err = run_cli(capsys, "report", str(incomplete))
    assert_one_line_error(code, err, "is not a bench run description")


@pytest.mark.parametrize("args, needle", [
    (["--target-tps", "100"], "go together"),
    (["--target-tps", "-5", "--p95-slo-ms", "100"], "positive number"),
])
def test_bad_sizing_options(tmp_path, capsys, args, needle):
    run_dir = clean_run(tmp_path / "run")
    code, _, err = run_cli(capsys, "report", str(run_dir), *args)
    assert_one_line_error(code, err, needle)
    assert not (run_dir / "summary.json").exists()
