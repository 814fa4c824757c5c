"""The second article's flow on a laptop (issue 16): `mme serve --mode single` is a real-time
endpoint on the real Triton; its banner's client command (no TargetModel) runs as shown, and
`mme bench --mode single --artifact` load-tests it with the artifact's sample request."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from tests.bench.helpers import ROOT, bench_env, run_bench, saved_run, served_in_background

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


@pytest.fixture(scope="module")
def served(test_resnet_cpu_local, tmp_path_factory):
    artifact_dir, _ = test_resnet_cpu_local
    with served_in_background(artifact_dir, tmp_path_factory.mktemp("serve"), "--mode", "single") as (url, banner):
        yield artifact_dir, url, banner


def test_the_banner_names_the_model_and_its_client_command_sends_no_target_model(served):
    _, _, banner = served
    assert "local real-time endpoint at" in banner and "model: test_resnet (SAGEMAKER_TRITON_DEFAULT_MODEL_NAME)" in banner
    command = banner.split("try it: ", 1)[1].splitlines()[0]
    assert "TargetModel" not in command
    argv = shlex.split(command)
    done = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, env=bench_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"outputs"' in done.stdout and "test_resnet" in done.stdout


def test_bench_single_mode_with_the_artifacts_sample(served, tmp_path):
    artifact_dir, url, _ = served
    completed = run_bench("--endpoint", "local", "--endpoint-url", url, "--mode", "single", "--artifact",
                          str(artifact_dir), "--shape", "constant", "--users", "2", "--duration", "3",
                          "--out", str(tmp_path / "results"))
    run = saved_run(completed)
    assert run.info.mode == "single" and run.info.copies == 0
    assert run.requests and all(r.ok for r in run.requests) and {r.target for r in run.requests} == {""}


def test_bench_without_single_mode_is_told_to_pass_it(served, tmp_path):
    artifact_dir, url, _ = served
    out = tmp_path / "results"
    completed = run_bench("--endpoint", "local", "--endpoint-url", url, "--artifact", str(artifact_dir),
                          "--shape", "constant", "--users", "1", "--duration", "1", "--out", str(out))
    assert completed.returncode == 2, completed.stderr
    err = completed.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "is a real-time endpoint (mme serve --mode single): pass --mode single" in err
    assert not out.exists() or not any(out.iterdir())
