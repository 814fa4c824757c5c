"""A catalogue entry's child process takes a request file and writes a result file; the parent
reads the result, never the entry's log (which stays for people)."""

from __future__ import annotations

import pytest

import json
import subprocess
import sys
from pathlib import Path

from mme.progress import Reporter
from packager import catalogue_run
from packager.child import ChildResult
from packager.model import ModelRequest
from packager.request import PackageRequest
from tests.packager.decoy_child import REASON


@pytest.mark.integration
def test_the_child_writes_the_failures_reason_and_type_to_its_result_file(tmp_path):
    request = PackageRequest(ModelRequest("test_resnet", weights="random"), ("onnx",), tmp_path / "out", atol=1e-30,
                             rtol=0.0)
    assert PackageRequest.from_dict(json.loads(json.dumps(request.to_dict()))) == request
    request_file, result_file = tmp_path / "request.json", tmp_path / "result.json"
    request_file.write_text(json.dumps(request.to_dict()))
    done = subprocess.run([sys.executable, "-m", "packager.child", str(request_file), str(result_file)],
                          capture_output=True, text=True, timeout=600)
    result = ChildResult.read(result_file)
    assert result is not None and not result.ok and result.packaged == ()
    assert result.error_type == "OutputValuesMismatchError" and result.exit_code == done.returncode == 3
    assert result.error.startswith("[onnx] output logits differs from PyTorch beyond atol 1e-30 + rtol 0")
    assert "\n" not in result.error
    assert f"mme: error: {result.error}" in done.stderr  # the log says it too, for people
    assert not (tmp_path / "out" / "test_resnet").exists()


def test_a_failed_entrys_reason_comes_from_its_result_file_not_its_log(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(catalogue_run, "CHILD_MODULE", "tests.packager.decoy_child")
    path = tmp_path / "fleet.toml"
    path.write_text('[defaults]\nformats = ["onnx"]\n[[model]]\nname = "test_resnet"\n[[model]]\nname = "test_vit"\n')
    out = tmp_path / "out"
    (out / "catalogue-logs").mkdir(parents=True)
    stale = ChildResult(packaged=("onnx",)).to_dict()  # an earlier run's result says nothing of this one
    (out / "catalogue-logs" / "test_vit.result.json").write_text(json.dumps(stale))
    assert catalogue_run.package_catalogue(path, out, Reporter(quiet=True), jobs=2) == 2
    summary = json.loads((out / "catalogue-summary.json").read_text())
    entries = {e["name"]: e for e in summary["entries"]}
    assert entries["test_resnet"]["status"] == entries["test_vit"]["status"] == "failed"
    assert entries["test_resnet"]["error"] == REASON
    assert entries["test_vit"]["error"].startswith("the packaging process was killed by signal 9 without writing its "
                                                   "result")
    for entry in entries.values():
        assert "a decoy line in the log" in Path(entry["log"]).read_text()
    request = json.loads((out / "catalogue-logs" / "test_resnet.request.json").read_text())
    assert PackageRequest.from_dict(request).formats == ("onnx",)
    assert "catalogue: 0 packaged, 0 up to date, 2 failed" in capsys.readouterr().out
