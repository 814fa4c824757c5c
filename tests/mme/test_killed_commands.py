"""Nothing outlives ``mme capacity`` or ``mme bench`` however they die: each is SIGKILLed
mid-run (no handler of theirs runs) and every process it had started must be gone within 10 s.
``mme serve`` has the same test beside its other faults (tests/serving/test_local_endpoint_faults.py)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from typing import Callable

import psutil
import pytest

from mme.process import ROOT
from tests.bench.fake_endpoint import FakeEndpoint
from tests.bench.helpers import bench_env

pytestmark = pytest.mark.integration


def _kill_mid_run(command: list[str], started: Callable[[list[psutil.Process]], bool], what: str) -> None:
    """Start ``command``; once ``started`` holds for its descendants, SIGKILL it and require all
    of them gone within 10 s. Kills only what it started."""
    proc = subprocess.Popen(command, cwd=ROOT, env=bench_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    descendants: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"{what} ended before it was killed: {proc.stderr.read()[-2000:]}"
            with contextlib.suppress(psutil.Error):
                descendants = psutil.Process(proc.pid).children(recursive=True)
                if started(descendants):
                    break
            assert time.monotonic() < deadline, f"{what} did not start its children within 120 s"
            time.sleep(0.1)
        proc.kill()
        proc.wait(timeout=10)
        _, still = psutil.wait_procs(descendants, timeout=10)
        assert not still, f"{what}: still running 10 s after SIGKILL: {[(p.pid, p.name()) for p in still]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for p in descendants:
            with contextlib.suppress(psutil.Error):
                p.kill()


def _cmdlines(procs: list[psutil.Process]) -> list[str]:
    lines = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            lines.append(" ".join(p.cmdline()))
    return lines


def test_sigkilled_mme_capacity_leaves_no_triton(test_resnet_cpu_local, tmp_path):
    artifact, _ = test_resnet_cpu_local

    def loading(procs: list[psutil.Process]) -> bool:  # Triton up and a python-backend stub started
        lines = _cmdlines(procs)
        return any("tritonserver" in line for line in lines) and any("triton_python_backend_stub" in line
                                                                      for line in lines)

    _kill_mid_run([sys.executable, "-m", "mme", "-q", "capacity", str(artifact), "--server", "local", "--memory",
                   "host", "--memory-limit", "64G", "--max-copies", "200", "--out", str(tmp_path)], loading,
                  "mme capacity")


def test_sigkilled_mme_bench_leaves_no_load_generator(tmp_path):
    with FakeEndpoint(behaviour="slow", delay_s=0.05) as endpoint:
        def generating(procs: list[psutil.Process]) -> bool:
            return endpoint.state.requests > 0 and any("bench.worker" in line for line in _cmdlines(procs))

        _kill_mid_run([sys.executable, "-m", "mme", "bench", "--endpoint", "e", "--endpoint-url", endpoint.url,
                       "--mode", "single", "--shape", "constant", "--users", "4", "--duration", "120", "--workers", "2",
                       "--out", str(tmp_path)], generating, "mme bench")
