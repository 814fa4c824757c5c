"""Child processes of mme: the environment they start with, and stopping one.

Work that runs in a fresh interpreter (``mme bench``'s load generator and its Locust
workers, the test suite's and benchmarks' ``python -m mme ...``) starts with
``child_env()``: this process's environment with the repository root first on PYTHONPATH,
so the child imports this checkout's packages whatever its working directory.
``stop_process`` ends a child: SIGTERM, a grace period, then SIGKILL.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Mapping

ROOT = Path(__file__).resolve().parent.parent  # the checkout holding mme/, packager/, serving/, bench/


def child_env(extra: Mapping[str, str] | None = None, *, root: Path | None = None) -> dict[str, str]:
    """This environment, ``root`` (default: this checkout) first on PYTHONPATH, then ``extra``."""
    first = str(Path(root).resolve()) if root is not None else str(ROOT)
    path = os.pathsep.join(p for p in (first, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, **(extra or {})}


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
