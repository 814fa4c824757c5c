"""mme serve refuses TensorRT engines built for another TensorRT, before starting anything."""

from __future__ import annotations

import json
import shutil

from mme.cli import main


def test_plan_for_another_tensorrt_is_refused(packaged_test_resnet, tmp_path, capsys):
    artifact = tmp_path / "tensorrt"
    shutil.copytree(packaged_test_resnet.directory, artifact)
    manifest = json.loads((artifact / "manifest.json").read_text())
    manifest["format"] = "tensorrt"
    manifest["versions"]["tensorrt"] = "8.5.0.12"
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    code = main(["serve", "--models", str(artifact), "--port", "0", "--server", "local"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "8.5.0.12" in err[0] and "Traceback" not in err[0]
