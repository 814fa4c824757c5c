"""tests/gpu/gpu_check.sh: without a GPU it says so and exits 4 (0 with --allow-no-gpu); on a
GPU host without TensorRT it measures first, then runs what it can, says what it did not
measure and exits 3 when the measurements were partial (the GPU branch is driven here by a
stand-in Python). Every step of `mme gpu-check run` on the CPU, in an environment of the lent
host's packages only, and the carried wheels' size: tests/gpu/test_gpu_check_env.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from tests.docker.conftest import REPO

SCRIPT = REPO / "tests" / "gpu" / "gpu_check.sh"
GPU_CHECK = [sys.executable, "-m", "mme", "gpu-check"]  # what the script runs


def run_script(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    # CUDA_VISIBLE_DEVICES="" hides any GPU from PyTorch: the no-GPU path, even on a GPU host.
    full_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "GPU_CHECK_PYTHON": sys.executable, **(env or {})}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env=full_env, capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.mark.integration
def test_without_a_gpu_it_says_so_and_exits_4():
    done = run_script()
    assert done.returncode == 4, done.stdout + done.stderr
    assert "no usable NVIDIA GPU on this host" in done.stdout
    assert "nothing GPU-side was run" in done.stdout
    assert "SKIPPED  gpu-marked tests (no GPU)" in done.stdout
    assert "SKIPPED  GPU measurements (no GPU)" in done.stdout
    # And why TensorRT is missing here, with the fix.
    assert "TensorRT: the tensorrt package is not installed: run make install-gpu" in done.stdout
    assert "https://pypi.nvidia.com" in done.stdout
    assert run_script("--allow-no-gpu").returncode == 0


def test_bad_usage_exits_2():
    done = run_script("--no-such-option")
    assert done.returncode == 2 and "unknown option" in done.stderr


def test_helper_detect_and_run_without_a_gpu(tmp_path):
    from bench.gpu_check.detect import detect

    facts = detect().to_dict()
    assert {"torch_cuda", "gpu_count", "nvml_gpus", "tensorrt", "tensorrt_reason", "pytriton", "project_tests",
            "docker", "no_gpu_reason"} <= set(facts)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([*GPU_CHECK, "run", "--out", str(tmp_path)], cwd=REPO, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 4 and "no usable NVIDIA GPU" in run.stdout
    assert json.loads((tmp_path / "facts.json").read_text())["torch_cuda"] is False


@pytest.fixture
def stand_in_python(tmp_path):
    """A 'python' that answers detect with a GPU host's facts (no TensorRT; $FACTS_EXTRA
    appended), records its calls, and exits with $PYTEST_RC / $COMPARE_RC."""
    facts = tmp_path / "facts.sh"
    facts.write_text("TORCH='2.11.0'\nTORCH_CUDA=1\nGPU_COUNT=1\nGPU_NAME='NVIDIA H200'\nNVML_GPUS=1\n"
                     "COMPUTE_CAPABILITY=9.0\nNVIDIA_SMI=1\nTENSORRT=''\nTENSORRT_REASON='the tensorrt package is not "
                     "installed: run make install-gpu'\nTORCH_TENSORRT=''\nONNXRUNTIME_CUDA=0\nPYTEST=1\n"
                     "PROJECT_TESTS=@PROJECT_TESTS@\nPYTRITON='0.7.0'\n"
                     "DOCKER='the docker command (docker) is not installed'\nNO_GPU_REASON=''\n")
    log = tmp_path / "calls.log"
    python = tmp_path / "python"
    python.write_text(f"""#!/bin/sh
echo "$*" >> {log}
case "$*" in
  "-m mme gpu-check detect"*) sed "s/@PROJECT_TESTS@/${{PROJECT_TESTS_FACT:-1}}/" {facts}; echo "${{FACTS_EXTRA:-}}" ;;
  "-m mme gpu-check run"*) echo "measurement figures"; exit ${{COMPARE_RC:-0}} ;;
  "-m pytest"*) exit ${{PYTEST_RC:-0}} ;;
esac
""")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return python, log


def test_gpu_host_without_tensorrt_runs_what_it_can_and_says_what_it_skipped(stand_in_python):
    python, log = stand_in_python
    done = run_script(env={"GPU_CHECK_PYTHON": str(python)})
    assert done.returncode == 0, done.stdout + done.stderr
    calls = log.read_text().splitlines()
    pytest_call = next(c for c in calls if c.startswith("-m pytest"))
    assert "-m gpu" in pytest_call and pytest_call.endswith("tests/packager/test_gpu_formats.py")
    run_call = next(i for i, c in enumerate(calls) if c.startswith("-m mme gpu-check run --out results/gpu-check"))
    assert run_call < calls.index(pytest_call)  # the measurements first: a short lease gets them
    out = done.stdout
    assert "RAN      gpu-marked tests: passed" in out
    assert "RAN      GPU measurements: every figure measured" in out
    assert "SKIPPED  gpu tests that need TensorRT: the tensorrt package is not installed: run make install-gpu" in out
    assert "TensorRT: the tensorrt package is not installed" in out
    assert "SKIPPED  Docker images (the docker command (docker) is not installed)" in out
    assert "FAILED" not in out


def test_a_bare_gpu_host_skips_the_test_suite_and_still_measures(stand_in_python):
    python, log = stand_in_python
    done = run_script("--out", "somewhere", env={"GPU_CHECK_PYTHON": str(python), "PROJECT_TESTS_FACT": "0"})
    assert done.returncode == 0, done.stdout + done.stderr
    calls = log.read_text().splitlines()
    assert not any(c.startswith("-m pytest") for c in calls)
    assert "-m mme gpu-check run --out somewhere" in calls
    assert "SKIPPED  gpu-marked tests (the project's test dependencies are not installed" in done.stdout


def test_no_usable_gpu_exits_4_unless_allowed(stand_in_python):
    python, log = stand_in_python
    extra = "TORCH_CUDA=0\nGPU_COUNT=0\nNO_GPU_REASON='the driver sees 1 GPU(s) but PyTorch cannot use them'"
    done = run_script(env={"GPU_CHECK_PYTHON": str(python), "FACTS_EXTRA": extra})
    assert done.returncode == 4
    assert "no usable NVIDIA GPU on this host (the driver sees 1 GPU(s) but PyTorch cannot use them)" in done.stdout
    assert not any(c.startswith(("-m pytest", "-m mme gpu-check run")) for c in log.read_text().splitlines())
    assert run_script("--allow-no-gpu", env={"GPU_CHECK_PYTHON": str(python), "FACTS_EXTRA": extra}).returncode == 0


def test_partial_measurements_exit_3_and_say_so(stand_in_python):
    python, _ = stand_in_python
    done = run_script(env={"GPU_CHECK_PYTHON": str(python), "COMPARE_RC": "3"})
    assert done.returncode == 3, done.stdout + done.stderr
    assert "RAN      GPU measurements: PARTIAL, the headlines name what was NOT MEASURED" in done.stdout


def test_gpu_host_failures_make_the_exit_code_1(stand_in_python):
    python, _ = stand_in_python
    done = run_script(env={"GPU_CHECK_PYTHON": str(python), "PYTEST_RC": "1", "COMPARE_RC": "1"})
    assert done.returncode == 1
    assert "FAILED   gpu-marked tests (pytest exit 1)" in done.stdout
    assert "FAILED   GPU measurements (exit 1" in done.stdout


def test_no_gpu_tests_selected_is_a_skip_not_a_failure(stand_in_python):
    python, _ = stand_in_python
    done = run_script("--skip-tests", env={"GPU_CHECK_PYTHON": str(python)})
    assert done.returncode == 0
    assert "SKIPPED  gpu-marked tests (--skip-tests)" in done.stdout
    done = run_script(env={"GPU_CHECK_PYTHON": str(python), "PYTEST_RC": "5"})
    assert done.returncode == 0 and "gpu-marked tests: none selected" in done.stdout


def test_script_is_executable_bash():
    assert SCRIPT.stat().st_mode & stat.S_IXUSR
    assert SCRIPT.read_text().startswith("#!/usr/bin/env bash")
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    assert "-m mme gpu-check detect" in SCRIPT.read_text() and "-m mme gpu-check run" in SCRIPT.read_text()
    from mme.cli import build_parser

    args = build_parser().parse_args(["gpu-check", "run", "--out", "somewhere", "--device", "cpu"])
    assert args.func.__module__ == "mme.cli.gpu_check" and args.device == "cpu"
