"""How the toolkit's HTTP clients reach a Triton server: plain TCP for ``http://`` base URLs,
or, for ``http+netns://<broker socket>:<port>`` ones (Triton in a network namespace of its own,
serving/triton/netns.py), a TCP socket made inside that namespace by its broker
(serving/triton/netns_broker.py), handed over the broker's Unix socket and then connected to
``127.0.0.1:<port>`` there: the client talks to Triton directly, nothing relays its bytes.
:func:`http_session` for ``requests`` (serving/triton/container.py); the invocations' client
(serving/triton/invoke_http.py) takes its sockets from :func:`netns_socket`."""

from __future__ import annotations

import os
import socket
import time
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection
from urllib3.connectionpool import HTTPConnectionPool
from urllib3.exceptions import NewConnectionError

NETNS_SCHEME = "http+netns"  # http+netns://<percent-encoded broker socket>:<port>/path


def netns_url(broker: str | os.PathLike, port: int) -> str:
    """The base URL of a server on ``127.0.0.1:port`` inside a network namespace, whose sockets
    come from the broker listening on the Unix socket ``broker`` (serving/triton/netns_broker.py)."""
    return f"{NETNS_SCHEME}://{quote(os.fspath(broker), safe='')}:{port}"


def netns_address(base_url: str) -> tuple[str, int] | None:
    """(broker socket, port) of an ``http+netns://`` URL; None for any other URL."""
    parts = urlsplit(base_url)
    if parts.scheme != NETNS_SCHEME:
        return None
    broker, _, port = parts.netloc.rpartition(":")
    return unquote(broker), int(port)


BACKLOG_RETRY_MAX_S = 0.05  # the longest pause between tries while the broker's backlog is full


def _broker_connection(broker: str, timeout_s: float | None) -> socket.socket:
    """A Unix connection to the broker. With a timeout the socket is non-blocking, and Linux
    answers a connect to a listener whose backlog is full with EAGAIN at once (a blocking connect
    would wait for room): many callers at once on a slow host (capacity's 200) fill it faster than
    the broker accepts. Such a connect is tried again, on a new socket, until ``timeout_s``."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pause = 0.001
    while True:
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.settimeout(timeout_s)
        try:
            unix.connect(broker)
            return unix
        except BlockingIOError:
            unix.close()
            if deadline is not None and time.monotonic() + pause > deadline:
                raise TimeoutError(f"the socket broker {broker} accepted no connection in {timeout_s:g} s "
                                   "(its backlog stayed full)") from None
            time.sleep(pause)
            pause = min(2 * pause, BACKLOG_RETRY_MAX_S)
        except BaseException:
            unix.close()
            raise


def netns_socket(broker: str, timeout_s: float | None = None) -> socket.socket:
    """A new, unconnected TCP socket made inside the namespace, from its broker (connect it to
    ``127.0.0.1:<port>``: it reaches that namespace's loopback). OSError when the broker is gone."""
    with _broker_connection(broker, timeout_s) as unix:
        _, fds, _, _ = socket.recv_fds(unix, 16, 1)
    if not fds:
        raise ConnectionResetError(f"the socket broker {broker} sent no socket")
    return socket.socket(fileno=fds[0])


class NamespaceConnection(HTTPConnection):
    """urllib3's HTTP connection over a socket from the namespace's broker."""

    def __init__(self, host: str, port: int | None = None, *, broker: str, **options: Any) -> None:
        super().__init__(host, port, **options)
        self.broker = broker

    def _new_conn(self) -> socket.socket:
        timeout = self.timeout if isinstance(self.timeout, (int, float)) else None
        try:
            sock = netns_socket(self.broker, timeout)
            for option in self.socket_options or ():  # TCP_NODELAY, as urllib3 sets it on its own sockets
                sock.setsockopt(*option)
            sock.settimeout(timeout)
            sock.connect(("127.0.0.1", self.port or 80))
        except OSError as exc:
            raise NewConnectionError(self, f"cannot connect to 127.0.0.1:{self.port} through {self.broker}: "
                                           f"{exc}") from exc
        return sock


class NamespacePool(HTTPConnectionPool):
    ConnectionCls = NamespaceConnection


class NamespaceAdapter(HTTPAdapter):
    """``requests`` transport for ``http+netns://`` URLs: one connection pool per broker and port."""

    def __init__(self) -> None:
        super().__init__()
        self._namespace_pools: dict[tuple[str, int], NamespacePool] = {}

    def get_connection_with_tls_context(self, request, verify, proxies=None, cert=None) -> NamespacePool:
        address = netns_address(request.url)
        if address is None:
            raise requests.exceptions.InvalidURL(f"not an {NETNS_SCHEME} URL: {request.url}")
        pool = self._namespace_pools.get(address)
        if pool is None:
            broker, port = address
            pool = self._namespace_pools.setdefault(address, NamespacePool("localhost", port, broker=broker,
                                                                            maxsize=self._pool_maxsize))
        return pool

    def request_url(self, request, proxies) -> str:
        return request.path_url

    def close(self) -> None:
        for pool in self._namespace_pools.values():
            pool.close()
        self._namespace_pools.clear()
        super().close()


def http_session() -> requests.Session:
    """A ``requests`` session that reaches ``http://`` and ``http+netns://`` URLs alike."""
    session = requests.Session()
    session.mount(f"{NETNS_SCHEME}://", NamespaceAdapter())
    return session


