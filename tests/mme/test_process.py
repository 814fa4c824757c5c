"""mme.process: the one child-process environment, and stopping a child that ignores SIGTERM."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from mme.process import ROOT, child_env, stop_process


def test_child_env_puts_this_checkout_first_and_keeps_the_rest(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv("MME_PROCESS_TEST", "kept")
    env = child_env({"EXTRA": "1"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/elsewhere"]
    assert env["MME_PROCESS_TEST"] == "kept" and env["EXTRA"] == "1"
    assert (ROOT / "mme" / "process.py").is_file()
    other = child_env(root=tmp_path)
    assert other["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path.resolve())
    monkeypatch.delenv("PYTHONPATH")
    assert child_env()["PYTHONPATH"] == str(ROOT)


def test_a_child_started_with_it_imports_this_checkout_from_anywhere(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import mme.process; print(mme.process.__file__)"], cwd=tmp_path,
                          env=child_env(), capture_output=True, text=True, timeout=60, check=True)
    assert Path(done.stdout.strip()).resolve() == ROOT / "mme" / "process.py"


def test_stop_process_kills_a_child_that_ignores_sigterm():
    code = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    start = time.monotonic()
    assert stop_process(child, timeout_s=0.5) == -9  # SIGKILL after the grace period
    assert time.monotonic() - start < 10
    child.stdout.close()


def test_stop_process_of_a_child_that_already_exited_returns_its_code():
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    child.wait()
    assert stop_process(child) == 3
