"""Child processes of mme: the environment they start with, and stopping one.

Work that runs in a fresh interpreter (``mme bench``'s load generator and its Locust
workers, the test suite's and benchmarks' ``python -m mme ...``) starts with
``child_env()``: this process's environment with the repository root first on PYTHONPATH,
so the child imports this checkout's packages whatever its working directory.
``stop_process`` ends a child: SIGTERM, a grace period, then SIGKILL.

Nothing mme starts outlives it, however it dies (SIGKILL and the OOM killer included): a child
started with ``child_env(lifeline=True)`` learns its parent's pid from :data:`PARENT_ENV`, and
``die_with_parent`` (called first thing in the child) watches for the parent to be gone (the
child re-parented) and then ends the child's process group: SIGTERM, so it can save what it
measured, then SIGKILL after a grace period. A parent-death signal (``PR_SET_PDEATHSIG``) would
fire when the *thread* that started the child ends, which in mme is often not the process.
The Triton server's supervisor (``serving/triton/netns_broker.py``, standard library only) does
the same for tritonserver and its python-backend stubs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Mapping

ROOT = Path(__file__).resolve().parent.parent  # the checkout holding mme/, packager/, serving/, bench/
PARENT_ENV = "MME_PARENT_PID"  # the pid of the mme process a child must not outlive
LIFELINE_INTERVAL_S = 0.25  # how often a child looks for its parent
LIFELINE_GRACE_S = 5.0  # after SIGTERM, how long an orphaned child's group has before SIGKILL


def child_env(extra: Mapping[str, str] | None = None, *, root: Path | None = None,
              lifeline: bool = False) -> dict[str, str]:
    """This environment, ``root`` (default: this checkout) first on PYTHONPATH, then ``extra``;
    with ``lifeline``, :data:`PARENT_ENV` naming this process, for the child's ``die_with_parent``."""
    first = str(Path(root).resolve()) if root is not None else str(ROOT)
    path = os.pathsep.join(p for p in (first, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, **(extra or {})}
    if lifeline:
        env[PARENT_ENV] = str(os.getpid())
    else:
        env.pop(PARENT_ENV, None)  # ours, inherited from our own parent: not this child's
    return env


def end_own_group(grace_s: float = LIFELINE_GRACE_S) -> None:
    """SIGTERM this process's group (only if this process leads it; else this process alone),
    then SIGKILL it after ``grace_s`` if still here."""
    leader = os.getpgrp() == os.getpid()

    def send(sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if leader:
                os.killpg(os.getpgrp(), sig)
            else:
                os.kill(os.getpid(), sig)

    send(signal.SIGTERM)
    time.sleep(grace_s)
    send(signal.SIGKILL)


def die_with_parent(on_lost: Callable[[], None] = end_own_group, *, parent: int | None = None,
                    interval_s: float = LIFELINE_INTERVAL_S) -> bool:
    """In a child of mme: call ``on_lost`` (default: end this process group) once the parent
    named by ``parent`` or :data:`PARENT_ENV` is gone. Watches from a daemon thread (a
    greenlet where gevent patched threading); returns False when no parent was named (a
    process a person started), True when watching. A parent already gone calls ``on_lost`` at once."""
    if parent is None:
        named = os.environ.get(PARENT_ENV, "")
        if not named.isdigit():
            return False
        parent = int(named)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        on_lost()

    threading.Thread(target=watch, name="mme-lifeline", daemon=True).start()
    return True


def stop_process(process: subprocess.Popen, timeout_s: float = 30.0) -> int:
    """SIGTERM ``process`` (if still running), wait up to ``timeout_s`` seconds, then SIGKILL
    it; its exit code."""
    if process.poll() is None:
        process.terminate()
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()
