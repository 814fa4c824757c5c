"""The processes of a Triton server: who belongs to it, how its whole process group is
stopped, and the tail of the server's log (``GET /ping``, the
other probe a start waits on, is :func:`serving.triton.container.ping_status`: one home for Triton's HTTP).

Every process a :class:`~serving.triton.base.TritonServer` starts carries
:data:`INSTANCE_ENV` (that server object) and :data:`OWNER_ENV` (the mme process that started
it) in its environment, which every child inherits: that is how its python-backend stubs are
found again, even after the server itself was killed. None outlives the mme that started it:
the broker every server is started through (``serving/triton/netns_broker.py``) ends the group
once that mme is gone, however it died.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterable, Sequence

import psutil

INSTANCE_ENV = "MME_TRITON_INSTANCE"  # marks the processes of one TritonServer object
OWNER_ENV = "MME_TRITON_OWNER"  # "<pid>:<create time>" of the process that started them
_ERROR_LINE = re.compile(r"[EF]\d{4} ")  # Triton's error/fatal log lines: E1203 08:11:13.24 ...


def log_tail(path: Path, lines: int = 6, max_chars: int = 1500) -> str:
    """The last non-empty lines of a log as one line (`` | `` between lines), after the last
    two error lines when they come earlier (serve's ``--log-verbose=true`` buries them)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 256 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return "(no log written)"
    # Whitespace collapsed (Triton pads its tables to ~250 columns), table borders dropped.
    squeezed = (" ".join(line.split()) for line in text.splitlines())
    kept = [line for line in squeezed if line and not line.startswith("+-")]
    tail = kept[-lines:]
    errors = [line for line in kept[:-lines] if _ERROR_LINE.match(line)][-2:]
    shown = [*errors, "...", *tail] if errors else tail
    width = max(80, max_chars // max(1, len(shown)))
    return " | ".join(line[:width] for line in shown) or "(log is empty)"


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def process_group_members(pgid: int, instance_id: str) -> list[psutil.Process]:
    """Live processes of process group ``pgid`` that carry ``INSTANCE_ENV=instance_id``
    (children orphaned by a killed server included). The check of the variable, which every
    child inherits, guards against an unrelated group that reused the number."""
    members = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid and alive(proc) and proc.environ().get(INSTANCE_ENV) == instance_id:
                members.append(proc)
    return members


def tree_of(pid: int) -> list[psutil.Process]:
    """Process ``pid`` and all its descendants; empty when it is gone."""
    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    return []


def owner_tag(proc: psutil.Process) -> str:
    """The :data:`OWNER_ENV` value naming ``proc`` (its pid and creation time)."""
    return f"{proc.pid}:{proc.create_time():.3f}"


def terminate_group(server: subprocess.Popen, instance_id: str, known: Iterable[psutil.Process], *,
                    grace_s: float, wait_s: float) -> None:
    """SIGTERM ``server``'s process group (it leads its own: ``start_new_session``), its
    descendants and the ``known`` processes it had; SIGKILL what is left after ``grace_s``;
    then wait up to ``wait_s`` for them to be gone."""
    pgid = server.pid
    procs = {p.pid: p for p in process_group_members(pgid, instance_id)}
    if server.poll() is None:
        procs.update({p.pid: p for p in tree_of(pgid)})
    procs.update({p.pid: p for p in known if alive(p)})
    signal_all(pgid, list(procs.values()), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        server.poll()
        if not any(alive(p) for p in procs.values()):
            break
        time.sleep(0.05)
    else:
        signal_all(pgid, [p for p in procs.values() if alive(p)], signal.SIGKILL)
    server.wait(timeout=wait_s)
    psutil.wait_procs([p for p in procs.values() if p.pid != pgid], timeout=wait_s)


def signal_all(pgid: int, procs: Sequence[psutil.Process], sig: signal.Signals) -> None:
    """``sig`` to process group ``pgid`` and to each of ``procs`` (members that left the group)."""
    if not procs:  # the group is gone: its number may belong to someone else now
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(sig)
