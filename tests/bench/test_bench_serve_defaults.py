"""The first hour (issue 15): `mme serve --models ARTIFACT` and `mme bench --artifact ARTIFACT`
with their defaults work together on the real local endpoint. The banner names the targets
and prints a client command that runs as shown; the bench targets what the endpoint serves,
refuses names it does not serve before anything is sent, and `--warmup` loads every target
before the first stage, reported apart."""

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
    with served_in_background(artifact_dir, tmp_path_factory.mktemp("serve")) as (url, banner):
        yield artifact_dir, url, banner


def test_the_banner_names_the_targets_and_its_client_command_runs_as_shown(served):
    artifact_dir, url, banner = served
    assert "TargetModel: test_resnet.tar.gz" in banner
    command = banner.split("try it: ", 1)[1].splitlines()[0]
    argv = shlex.split(command)
    assert argv[0] == "python" and argv[1] == "-c"
    done = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, env=bench_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"outputs"' in done.stdout and "test_resnet" in done.stdout  # Triton's answer, as boto3 returned it


def test_bench_with_its_defaults_targets_what_the_endpoint_serves_after_a_warmup(served, tmp_path):
    artifact_dir, url, _ = served
    completed = run_bench("--endpoint", "local", "--endpoint-url", url, "--artifact", str(artifact_dir),
                          "--shape", "constant", "--users", "2", "--duration", "3", "--warmup",
                          "--out", str(tmp_path / "results"))
    run = saved_run(completed)
    assert run.info.copies == 1 and {r.target for r in run.requests} == {"test_resnet.tar.gz"}
    assert run.requests and all(r.ok for r in run.requests)
    assert all(r.cold == 0 for r in run.requests)  # the warm-up loaded the model before the first stage
    warmup = run.info.extra["warmup"]
    assert (warmup["targets"], warmup["failed"]) == (1, 0)
    assert warmup["per_target"][0]["target"] == "test_resnet.tar.gz" and warmup["per_target"][0]["ok"]
    assert "warm-up done" in completed.stderr


def test_bench_refuses_targets_the_endpoint_does_not_serve_before_sending_anything(served, tmp_path):
    artifact_dir, url, _ = served
    out = tmp_path / "results"
    completed = run_bench("--endpoint", "local", "--endpoint-url", url, "--artifact", str(artifact_dir),
                          "--copies", "2", "--shape", "constant", "--users", "1", "--duration", "1", "--out", str(out))
    assert completed.returncode == 2, completed.stderr
    err = completed.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "does not serve test_resnet-v0.tar.gz, test_resnet-v1.tar.gz" in err
    assert "it answers for test_resnet.tar.gz" in err and "leave --copies out" in err and "--copies 2" in err
    assert not out.exists() or not any(out.iterdir())  # no run directory left behind


def test_bench_single_mode_against_a_multi_model_endpoint_is_refused(served, tmp_path):
    artifact_dir, url, _ = served
    completed = run_bench("--endpoint", "local", "--endpoint-url", url, "--mode", "single", "--artifact",
                          str(artifact_dir), "--shape", "constant", "--users", "1", "--duration", "1",
                          "--out", str(tmp_path / "results"))
    assert completed.returncode == 2, completed.stderr
    assert "is a multi-model endpoint: leave --mode single out" in completed.stderr
