"""A child process of ``mme bench`` or ``mme bench-worker`` (the load generator, a worker) run to
its end, Ctrl-C and SIGTERM passed on so it can stop its users and save what it measured."""

from __future__ import annotations

import signal
import subprocess
import threading
from typing import Mapping

from mme.process import child_env
from mme.progress import Reporter

CHILD_GRACE_S = 60.0  # after Ctrl-C and the drain, how long the generator may take to save its results


class _Terminated(Exception):
    """SIGTERM reached the process that started the run."""


def _raise_terminated(signum, frame) -> None:
    raise _Terminated


def run_child(command: list[str], reporter: Reporter, extra_env: Mapping[str, str] | None = None,
              grace_s: float = CHILD_GRACE_S) -> tuple[int, int | None]:
    """Run a generator process (``extra_env`` added to its environment); Ctrl-C and SIGTERM
    are passed on: the first makes the generator drain and save what was measured, the second
    cuts its drain short, a third (or ``grace_s`` without an end) kills it. The child has a
    process group of its own, so a terminal's Ctrl-C reaches it once, through here. Returns its
    exit code and the signal that stopped the run, if any."""
    child = subprocess.Popen(command, env=child_env(extra=extra_env, lifeline=True), process_group=0)
    stopped_by: int | None = None
    signals = 0
    main_thread = threading.current_thread() is threading.main_thread()  # only it may set handlers
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    try:
        while True:
            try:
                return child.wait(timeout=grace_s if stopped_by else None), stopped_by
            except (KeyboardInterrupt, _Terminated) as exc:
                sig = signal.SIGINT if isinstance(exc, KeyboardInterrupt) else signal.SIGTERM
                signals += 1
                stopped_by = stopped_by or sig
                if signals <= 2:
                    if child.poll() is None:
                        child.send_signal(sig)
                    continue
                child.kill()
                return child.wait(), stopped_by
            except subprocess.TimeoutExpired:
                reporter.warn("the load generator did not stop in time; killing it (results may be partial)")
                child.kill()
                return child.wait(), stopped_by
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
