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


# A parent that starts one child with a lifeline, prints the child's pid once the child says it
# watches (nothing if it does not), then waits to be killed.
_PARENT = """
import subprocess, sys, time
from mme.process import child_env
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env=child_env(lifeline=True), process_group=0,
                         stdout=subprocess.PIPE, text=True)
if child.stdout.readline().strip() == "watching":
    print(child.pid, flush=True)
else:
    child.kill()
    print("the child does not watch", flush=True)
time.sleep(600)
"""
_WATCHING_CHILD = """
import signal, time
from functools import partial
from mme.process import die_with_parent, end_own_group
if {ignore_term}:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("watching" if die_with_parent(partial(end_own_group, 0.5), interval_s=0.05) else "not watching", flush=True)
time.sleep(600)
"""


def _orphan_of_a_killed_parent(ignore_term: bool) -> int:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, _WATCHING_CHILD.format(ignore_term=ignore_term)],
                              env=child_env(), stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()
        assert line.strip().isdigit(), line
        child = int(line)
    finally:
        parent.kill()
        parent.wait(timeout=30)
    return child


def _gone_within(pid: int, timeout_s: float) -> bool:
    import psutil

    try:
        process = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return True
    gone, _ = psutil.wait_procs([process], timeout=timeout_s)
    if not gone:
        process.kill()
    return bool(gone)


def test_a_child_with_a_lifeline_ends_once_its_parent_is_sigkilled():
    assert _gone_within(_orphan_of_a_killed_parent(ignore_term=False), timeout_s=10)


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period():
    assert _gone_within(_orphan_of_a_killed_parent(ignore_term=True), timeout_s=10)


def test_without_a_named_parent_nothing_is_watched(monkeypatch):
    from mme.process import PARENT_ENV, die_with_parent

    monkeypatch.delenv(PARENT_ENV, raising=False)
    assert die_with_parent(lambda: None) is False
    monkeypatch.setenv(PARENT_ENV, str(os.getpid()))
    assert PARENT_ENV not in child_env()  # ours is never passed on as the child's
    assert child_env(lifeline=True)[PARENT_ENV] == str(os.getpid())
