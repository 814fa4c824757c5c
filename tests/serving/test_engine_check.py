"""mme serve refuses TensorRT engines built for another TensorRT, before starting anything."""

from __future__ import annotations

import shutil
from dataclasses import replace

from mme.cli import main
from packager.manifest import Manifest


def test_plan_for_another_tensorrt_is_refused(packaged_test_resnet, tmp_path, capsys):
    artifact = tmp_path / "tensorrt"
    shutil.copytree(packaged_test_resnet.directory, artifact)
    manifest = Manifest.load(artifact)
    replace(manifest, format="tensorrt", versions=manifest.versions | {"tensorrt": "8.5.0.12"}).write(artifact)
    code = main(["serve", "--models", str(artifact), "--port", "0", "--server", "local"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "8.5.0.12" in err[0] and "Traceback" not in err[0]
