"""Triton's ports reachable only from the endpoint that started it.

Triton's SageMaker service has no address option: it binds ``0.0.0.0`` (``sagemaker_address_``
is fixed in ``src/command_line_parser.h``, 2.51 and main alike), so on a host anyone who can
reach the machine could load models from any directory on it, invoke and unload them. The
local and system server kinds therefore start tritonserver in a network namespace of its own
(``unshare --net``; with ``--map-root-user`` when not root, which needs no privilege where
user namespaces are allowed) whose only interface is its loopback, and reach its ports
through sockets made inside it and handed out over Unix-domain sockets in the server's private
work directory (mode 0700) by :mod:`serving.triton.netns_broker`, which runs in the namespace
and starts tritonserver. The docker kind isolates Triton in
its container and publishes ports on 127.0.0.1 only.

``network="private"`` (the default) requires this isolation and refuses to start without it
(:class:`IsolationUnavailable`, saying why and how to get it); ``network="host"`` runs Triton on
the host's network, its SageMaker port open to the network: the user's explicit choice
(``mme serve --triton-network host``, or ``MME_TRITON_NETWORK=host`` for every command).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from serving.triton.config import NETWORK_ENV, TritonServerError
from serving.triton.container_transport import netns_url

BROKER_SCRIPT = Path(__file__).with_name("netns_broker.py")
MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes, the terminating NUL included


class IsolationUnavailable(TritonServerError):
    """Triton cannot be started in a private network namespace on this host."""


@dataclass(frozen=True)
class NamespaceSupport:
    """How this host starts a process in a new network namespace, or why it cannot."""

    prefix: tuple[str, ...] = ()  # e.g. ("unshare", "--net"); empty when unavailable
    problem: str = ""

    @property
    def available(self) -> bool:
        return bool(self.prefix)


def _tries() -> list[tuple[str, ...]]:
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    rootless = (unshare, "--net", "--map-root-user")
    # Root keeps its own user namespace (device files and other users' files stay reachable as
    # they are); without CAP_SYS_ADMIN (a container) a user namespace may still work.
    return [(unshare, "--net"), rootless] if os.geteuid() == 0 else [rootless]


@functools.lru_cache(maxsize=1)
def namespace_support() -> NamespaceSupport:
    """Probe once per process: the first ``unshare`` form that runs ``true``."""
    tries = _tries()
    if not tries:
        return NamespaceSupport(problem="the unshare command (util-linux) is not installed")
    problem = ""
    for prefix in tries:
        try:
            done = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            problem = str(exc)
            continue
        if done.returncode == 0:
            return NamespaceSupport(prefix=prefix)
        problem = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    return NamespaceSupport(problem=f"{' '.join(tries[-1][1:])} failed: {problem}")


def unavailable_message(problem: str) -> str:
    return (f"cannot start Triton in a private network namespace ({problem}); without one its SageMaker port "
            "listens on 0.0.0.0 (Triton has no option to bind it elsewhere) and anyone who can reach this host can "
            "load, run and unload models on it. Allow user namespaces (sysctl user.max_user_namespaces=15000; on "
            "Ubuntu 24.04+ also kernel.apparmor_restrict_unprivileged_userns=0), or use --server docker (ports "
            f"published on 127.0.0.1 only), or accept the exposure with --triton-network host ({NETWORK_ENV}=host)")


def host_network_warning(port: int) -> str:
    return (f"Triton runs on this machine's network (--triton-network host): its SageMaker port {port} listens on "
            "0.0.0.0, and anyone who can reach this machine (or container) can load models from any directory on it, "
            "run and unload them; drop --triton-network host to keep it in a private network namespace")


def supervised(argv: Sequence[str]) -> list[str]:
    """``argv`` on this host's network, started by the broker as its lifeline only: it ends the
    server's process group once this process is gone, however it died."""
    return [sys.executable, "-I", str(BROKER_SCRIPT), "--host-network", f"--parent={os.getpid()}", "--", *argv]


class PrivateNetwork:
    """Triton's ports behind Unix sockets in ``directory``, one per port name."""

    def __init__(self, directory: Path, ports: Mapping[str, int | None]) -> None:
        support = namespace_support()
        if not support.available:
            raise IsolationUnavailable(unavailable_message(support.problem))
        self.prefix = support.prefix
        self.sockets = {name: directory / f"{name}.sock" for name, port in ports.items() if port}
        self.ports = {name: port for name, port in ports.items() if port}
        too_long = [str(p) for p in self.sockets.values() if len(os.fsencode(p)) > MAX_SOCKET_PATH]
        if too_long:
            raise IsolationUnavailable(f"the socket path {too_long[0]} is longer than {MAX_SOCKET_PATH} bytes; "
                                       "set TMPDIR to a shorter directory")

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in a new network namespace, started by its socket broker (its lifeline too)."""
        listens = [f"--listen={name}={self.sockets[name]}:{port}" for name, port in self.ports.items()]
        return [*self.prefix, sys.executable, "-I", str(BROKER_SCRIPT), f"--parent={os.getpid()}", *listens,
                "--", *argv]

    def url(self, name: str) -> str:
        return netns_url(self.sockets[name], self.ports[name])

    def describe(self) -> str:
        return f"in a private network namespace, its sockets handed out by {self.sockets['sagemaker']}"
