"""Run a command inside a private network namespace and hand out sockets made in it.

    unshare --net [--map-root-user] python -I netns_broker.py \
        --listen sagemaker=/tmp/mme-triton-x/sagemaker.sock:8080 [...] -- tritonserver ...

``unshare`` gives this process a network namespace of its own, holding only a loopback
interface, down. This script brings it up and starts the command (tritonserver, which binds its
SageMaker port to 0.0.0.0 whatever it is told: here, reachable from nothing but this namespace).

It is a socket broker, not a relay: each connection to a ``--listen`` Unix socket gets back,
as SCM_RIGHTS ancillary data, a new TCP socket created in this namespace, and the port as the
message. The client connects that socket to ``127.0.0.1:PORT`` itself (a socket stays in the
namespace it was made in), then talks to Triton directly: no byte passes through this process,
and every client connection is one Triton connection (Triton ties a connection to one HTTP
worker thread; the front relies on fresh connections while a load runs). Pathname Unix
sockets are files, shared across network namespaces: only the user who owns the server's
private work directory (mode 0700; sockets 0600) can ask for one.

It exits when the command does, with its status (or its signal); SIGTERM and SIGINT are
passed on to the command. It is also the server's lifeline, isolated or not (``--host-network``
skips the namespace's set-up; every server kind is started through it): with ``--parent PID``
it watches that process (the mme that started it) and, once it is gone however it died
(SIGKILL, the OOM killer), ends its own process group, which it leads: SIGTERM, then SIGKILL
after ``--grace-s``, so tritonserver and its python-backend stubs do not outlive mme. The
command also gets a parent-death signal from this process, in case this one is killed. Started by :mod:`serving.triton.netns`; clients in
:mod:`serving.triton.container`. Standard library only, so ``python -I`` runs it with the server's
environment untouched.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

SIOCGIFFLAGS = 0x8913  # netdevice(7)
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
IFREQ = "16sh22x"  # struct ifreq: the name, then ifr_flags in a 40-byte union
PR_SET_PDEATHSIG = 1  # prctl(2)
WATCH_INTERVAL_S = 0.25


def loopback_up() -> None:
    """Bring ``lo`` up (a new network namespace starts with it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        _, flags = struct.unpack(IFREQ, fcntl.ioctl(sock, SIOCGIFFLAGS, struct.pack(IFREQ, b"lo", 0)))
        if not flags & IFF_UP:
            fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags | IFF_UP))


def parse_listen(text: str) -> tuple[str, Path, int]:
    """``NAME=SOCKET:PORT``."""
    name, _, rest = text.partition("=")
    path, _, port = rest.rpartition(":")
    if not name or not path or not port.isdigit():
        raise argparse.ArgumentTypeError(f"--listen {text!r}: expected NAME=SOCKET:PORT")
    return name, Path(path), int(port)


def listen(path: Path) -> socket.socket:
    path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    os.chmod(path, 0o600)
    server.listen(socket.SOMAXCONN)  # capacity sends 200 callers at once
    return server


def hand_out(server: socket.socket, port: int) -> None:
    """Forever: answer each connection with a new TCP socket of this namespace and ``port``."""
    message = str(port).encode()
    while True:
        try:
            connection, _ = server.accept()
        except OSError:  # closed at exit
            return
        with connection, socket.socket(socket.AF_INET, socket.SOCK_STREAM) as made:
            try:
                socket.send_fds(connection, [message], [made.fileno()])
            except OSError:
                continue  # the client went away


def _die_with_parent() -> None:
    """In the command's process: be killed when this process dies (the command is unreachable then)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def end_group(child: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the command and this process group (when this process leads it), SIGKILL after ``grace_s``."""
    leader = os.getpgrp() == os.getpid()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if sig == signal.SIGKILL:
            deadline = time.monotonic() + grace_s
            while child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        try:
            if leader:  # the command's children (python-backend stubs) are in it too
                os.killpg(os.getpgrp(), sig)
            elif child.poll() is None:
                child.send_signal(sig)
        except (ProcessLookupError, PermissionError):
            pass


def watch_parent(parent: int, child: subprocess.Popen, grace_s: float) -> None:
    """Once ``parent`` is gone (this process re-parented), end the command and its group."""
    while os.getppid() == parent:
        time.sleep(WATCH_INTERVAL_S)
    print(f"netns_broker: mme (pid {parent}) is gone; stopping the server", file=sys.stderr, flush=True)
    end_group(child, grace_s)


def run(listens: list[tuple[str, Path, int]], command: list[str], parent: int | None = None,
        grace_s: float = 5.0) -> int:
    if parent is not None and os.getppid() != parent:
        print(f"netns_broker: mme (pid {parent}) is already gone; not starting the server", file=sys.stderr)
        return 75
    servers = [(listen(path), port) for _, path, port in listens]
    # Started before any thread: preexec_fn runs between fork and exec.
    child = subprocess.Popen(command, preexec_fn=_die_with_parent)

    def pass_on(sig: int, _frame) -> None:
        if child.poll() is None:
            child.send_signal(sig)

    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGINT, pass_on)
    for server, port in servers:
        threading.Thread(target=hand_out, args=(server, port), daemon=True).start()
    if parent is not None:
        threading.Thread(target=watch_parent, args=(parent, child, grace_s), daemon=True).start()
    status = child.wait()
    for (server, _), (_, path, _) in zip(servers, listens):
        server.close()
        path.unlink(missing_ok=True)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=parse_listen, action="append", default=[], metavar="NAME=SOCKET:PORT")
    parser.add_argument("--parent", type=int, default=None, metavar="PID",
                        help="end the server (and this process group) once this process is gone")
    parser.add_argument("--grace-s", type=float, default=5.0,
                        help="after SIGTERM, how long the server has before SIGKILL when the parent is gone")
    parser.add_argument("--host-network", action="store_true",
                        help="not in a namespace of its own: leave the network alone (only a lifeline)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run after --")
    if not args.host_network:
        try:
            loopback_up()
        except OSError as exc:
            print(f"netns_broker: cannot bring up the namespace's loopback: {exc}", file=sys.stderr)
            return 70
    status = run(args.listen, command, args.parent, args.grace_s)
    if status < 0:  # mirror the command's signal, so the parent sees what ended the server
        if -status not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    return status


if __name__ == "__main__":
    sys.exit(main())
