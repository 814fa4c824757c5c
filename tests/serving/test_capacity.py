"""mme capacity on the real server: the prediction holds on this host."""

from __future__ import annotations

import json

from mme.cli import main


def test_capacity_prediction_matches_what_fits(packaged_test_resnet, tmp_path, capsys):
    code = main(["capacity", str(packaged_test_resnet.directory), "--memory-limit", "420M", "--probe-copies", "2",
                 "--cycles", "2", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    report = json.loads((tmp_path / "capacity_test_resnet_cpu-local.json").read_text())
    predicted, actual = report["predicted_copies"], report["actual_copies"]
    assert actual >= 2
    assert abs(predicted - actual) <= max(1, round(0.1 * actual)), (predicted, actual)
    assert all(step["delta_bytes"] > 0 for step in report["steps"])
    assert report["steps"][actual - 1]["memory_bytes"] <= 0.9 * report["limit_bytes"]
    assert report["leak_check"]["returned_to_baseline"] is True
    assert {p["instance_type"] for p in report["projections"]} == {
        "ml.g4dn.2xlarge", "ml.g5.2xlarge", "ml.p3.2xlarge", "ml.g6.2xlarge", "ml.g6e.2xlarge"}
    g6e = next(p for p in report["projections"] if p["instance_type"] == "ml.g6e.2xlarge")
    g5 = next(p for p in report["projections"] if p["instance_type"] == "ml.g5.2xlarge")
    assert g6e["copies"] >= 2 * g5["copies"]
    assert f"predicted {predicted}, actual {actual}" in out


def test_capacity_bad_artifact(tmp_path, capsys):
    code = main(["capacity", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "has no manifest.json" in err and "Traceback" not in err
