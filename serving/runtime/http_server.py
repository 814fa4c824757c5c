"""The local front's HTTP server: uvicorn's httptools protocol (llhttp, the parser of Node.js)
serving an ASGI application on the endpoint's own uvloop loop, on a socket bound before
anything else starts (so a port in use is said at once, not after Triton has started).

Why uvicorn and not aiohttp's server, which this replaced: the front's own cost per request is
what the endpoint adds to every latency a user measures. Measured on the 2-core machines, one
client at a time posting 140 bytes to a handler that answers 140 bytes (server thread CPU per
request, median of 3 rounds, all four in one run): aiohttp's Application 171 us, aiohttp's
low-level Server 149 us, uvicorn's httptools protocol 115 us, a bare httptools protocol
82 us. uvicorn keeps what a hand-written server would have to get right (pipelining, flow
control, ``Expect: 100-continue``, header limits, keep-alive timeouts, graceful shutdown).

Settings: no lifespan, no proxy headers (the front is what clients talk to), no ``Server``
header (SageMaker sends none), uvicorn's loggers at WARNING (our reporter says what the
endpoint does), connections kept alive for :data:`IDLE_KEEPALIVE_S` idle seconds (aiohttp's 75,
which the front had), and :data:`GRACE_S` for in-flight requests to finish at shutdown.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from typing import Any, Awaitable, Callable, MutableMapping

import uvicorn

from mme.errors import UsageError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

IDLE_KEEPALIVE_S = 75  # idle seconds before a kept-alive connection is closed
GRACE_S = 60  # seconds in-flight requests get to finish when the front stops
BACKLOG = 1024


def bind_listener(host: str, port: int, *, backlog: int = BACKLOG, option: str = "--port") -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: any free port); a user's mistake (the port in
    use, an address not of this machine) is a :class:`UsageError` that says the fix."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise UsageError(f"cannot listen on {host!r} ({exc.strerror}): pass --host an address of this machine "
                         "(127.0.0.1, or 0.0.0.0 for every interface)") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(f"port {port} on {host} is already in use: pass {option} with a free port "
                             f"({option} 0 picks one), or stop what listens there") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise UsageError(f"{host} is not an address of this machine: pass --host one of its addresses "
                             "(127.0.0.1, or 0.0.0.0 for every interface)") from None
        if exc.errno == errno.EACCES:
            raise UsageError(f"port {port} needs privileges this user lacks: pass {option} 1024 or above") from None
        raise
    return sock


class HttpServer:
    """``app`` served on ``sock`` from :meth:`start` to :meth:`stop`, on the running loop."""

    def __init__(self, app: App, sock: socket.socket) -> None:
        self.app = app
        self.sock = sock
        self.port: int = sock.getsockname()[1]
        self._server: Any = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        config = uvicorn.Config(self.app, interface="asgi3", loop="none", http="httptools", ws="none",
                                lifespan="off", log_config=None, log_level="warning", access_log=False,
                                proxy_headers=False, server_header=False, backlog=BACKLOG,
                                timeout_keep_alive=IDLE_KEEPALIVE_S, timeout_graceful_shutdown=GRACE_S)
        self._server = uvicorn.Server(config)
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[self.sock]),
                                                            name="http front")
        while not self._server.started:
            if self._task.done():  # it raised (the exception says why), or stopped before serving
                self._task.result()
                raise RuntimeError("the HTTP front stopped before it served")
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        """Stop accepting; let in-flight requests finish (up to GRACE_S); close every connection."""
        if self._server is None or self._task is None:
            self.sock.close()
            return
        self._server.should_exit = True
        await self._task
