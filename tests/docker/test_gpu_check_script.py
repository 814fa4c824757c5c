"""tests/gpu/gpu_check.sh: without a GPU it says so and exits 0 (4 with --require-gpu);
on a GPU host without TensorRT it runs what it can and says what it skipped (the GPU
branch is driven here by a stand-in Python)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docker.conftest import REPO

SCRIPT = REPO / "tests" / "gpu" / "gpu_check.sh"
HELPER = REPO / "tests" / "gpu" / "gpu_check.py"


def run_script(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    # CUDA_VISIBLE_DEVICES="" hides any GPU from PyTorch: the no-GPU path, even on a GPU host.
    full_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "GPU_CHECK_PYTHON": sys.executable, **(env or {})}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env=full_env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_without_a_gpu_it_says_so_and_exits_0():
    done = run_script()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no usable NVIDIA GPU on this host" in done.stdout
    assert "nothing GPU-side was run" in done.stdout
    assert "SKIPPED  gpu-marked tests (no GPU)" in done.stdout
    assert "SKIPPED  TorchScript vs TensorRT comparison (no GPU)" in done.stdout


def test_bad_usage_exits_2():
    done = run_script("--no-such-option")
    assert done.returncode == 2 and "unknown option" in done.stderr


def test_helper_detect_and_compare_without_a_gpu():
    sys.path.insert(0, str(HELPER.parent))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(HELPER.parent))
    facts = gpu_check.detect()
    assert {"torch_cuda", "gpu_count", "nvml_gpus", "tensorrt", "torch_tensorrt", "docker", "no_gpu_reason"} <= set(facts)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    compare = subprocess.run([sys.executable, str(HELPER), "compare"], cwd=REPO, env=env,
                             capture_output=True, text=True)
    assert compare.returncode == 4 and "no usable NVIDIA GPU" in compare.stdout


@pytest.fixture
def stand_in_python(tmp_path):
    """A 'python' that answers detect with a GPU host's facts (no TensorRT; $FACTS_EXTRA
    appended), records its calls, and exits with $PYTEST_RC / $COMPARE_RC."""
    facts = tmp_path / "facts.sh"
    facts.write_text("TORCH='2.14.1'\nTORCH_CUDA=1\nGPU_COUNT=1\nGPU_NAME='NVIDIA L4'\nNVML_GPUS=1\n"
                     "NVIDIA_SMI=1\nTENSORRT=''\nTORCH_TENSORRT=''\nONNXRUNTIME_CUDA=0\nPYTEST=1\n"
                     "DOCKER='the docker command (docker) is not installed'\nNO_GPU_REASON=''\n")
    log = tmp_path / "calls.log"
    python = tmp_path / "python"
    python.write_text(f"""#!/bin/sh
echo "$*" >> {log}
case "$1" in
  tests/gpu/gpu_check.py)
    case "$2" in
      detect) cat {facts}; echo "${{FACTS_EXTRA:-}}" ;;
      compare) echo "compare figures"; exit ${{COMPARE_RC:-0}} ;;
    esac ;;
  -m) exit ${{PYTEST_RC:-0}} ;;
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
    assert "-m gpu" in pytest_call and "not tensorrt and not plan" in pytest_call
    assert any(c.startswith("tests/gpu/gpu_check.py compare --model resnet50 --batches 1,16") for c in calls)
    out = done.stdout
    assert "RAN      gpu-marked tests: passed" in out
    assert "RAN      comparison for resnet50" in out
    assert "SKIPPED  gpu tests that need TensorRT" in out
    assert "SKIPPED  TensorRT side of the comparison (tensorrt not installed)" in out
    assert "SKIPPED  Docker images (the docker command (docker) is not installed)" in out
    assert "FAILED" not in out


def test_require_gpu_exits_4_when_pytorch_cannot_use_the_gpu(stand_in_python):
    python, log = stand_in_python
    extra = "TORCH_CUDA=0\nGPU_COUNT=0\nNO_GPU_REASON='the driver sees 1 GPU(s) but PyTorch cannot use them'"
    done = run_script("--require-gpu", env={"GPU_CHECK_PYTHON": str(python), "FACTS_EXTRA": extra})
    assert done.returncode == 4
    assert "no usable NVIDIA GPU on this host (the driver sees 1 GPU(s) but PyTorch cannot use them)" in done.stdout
    assert not any(c.startswith(("-m pytest", "tests/gpu/gpu_check.py compare")) for c in log.read_text().splitlines())
    assert run_script(env={"GPU_CHECK_PYTHON": str(python), "FACTS_EXTRA": extra}).returncode == 0


def test_gpu_host_failures_make_the_exit_code_1(stand_in_python):
    python, _ = stand_in_python
    done = run_script(env={"GPU_CHECK_PYTHON": str(python), "PYTEST_RC": "1", "COMPARE_RC": "1"})
    assert done.returncode == 1
    assert "FAILED   gpu-marked tests (pytest exit 1)" in done.stdout
    assert "FAILED   comparison for resnet50" in done.stdout


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
    assert Path(HELPER).is_file()
