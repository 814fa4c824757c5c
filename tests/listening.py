"""What a running process tree listens on, as ``ss -ltnp`` would show it, and which of its
processes live in a network namespace of their own (issue 13's socket tests).

psutil reads a process's sockets through this process's ``/proc/net``: sockets of a process in
another network namespace never appear, so each process's namespace is read first
(``/proc/<pid>/ns/net``) and reported apart."""

from __future__ import annotations

import ipaddress
import os
import time
from dataclasses import dataclass, field
from typing import Callable

import psutil


@dataclass(frozen=True)
class Socket:
    pid: int
    process: str  # its name, e.g. tritonserver
    ip: str
    port: int

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.ip.split("%", 1)[0]).is_loopback


@dataclass
class Watch:
    """Everything seen of one process tree over one or more looks."""

    listening: set[Socket] = field(default_factory=set)  # in this machine's network namespace
    private: dict[int, str] = field(default_factory=dict)  # pid -> name of processes in another namespace
    names: set[str] = field(default_factory=set)
    most_processes: int = 0

    @property
    def exposed(self) -> set[Socket]:
        return {s for s in self.listening if not s.loopback}

    def look(self, root_pid: int) -> bool:
        """One look at ``root_pid`` and its descendants; False when the root is gone."""
        try:
            root = psutil.Process(root_pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return False
        self.most_processes = max(self.most_processes, len(tree))
        ours = os.readlink("/proc/self/ns/net")
        for process in tree:
            try:
                name = process.name()
                namespace = os.readlink(f"/proc/{process.pid}/ns/net")
                connections = process.net_connections(kind="inet")
            except (psutil.NoSuchProcess, psutil.ZombieProcess, FileNotFoundError, ProcessLookupError):
                continue
            self.names.add(name)
            if namespace != ours:
                self.private[process.pid] = name
                continue
            for c in connections:
                if c.status == psutil.CONN_LISTEN or (c.type == 2 and not c.raddr):  # 2: SOCK_DGRAM
                    self.listening.add(Socket(process.pid, name, c.laddr.ip, c.laddr.port))
        return True

    def follow(self, root_pid: int, until: Callable[[], bool], timeout_s: float = 120.0) -> None:
        """Look every 0.1 s until ``until()`` or the root exits."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not until():
            if not self.look(root_pid):
                return
            time.sleep(0.1)
