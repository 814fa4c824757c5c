"""The invocations' HTTP/1.1 client to the container: keep-alive connections whose answers
httptools parses (llhttp, the parser of Node.js; uvicorn's), a request written in one piece.

Why not aiohttp's client, which this replaced: a forwarded invocation is the front's hot path,
and its client was most of the front's own cost. Measured on the 2-core machines, one request at
a time to a local aiohttp server answering 140 bytes: aiohttp's ClientSession 129-155 us of CPU
and 235-270 us of wall time per request, this client 33-39 us and 135-139 us
(benchmarks/bench_front.py measures the whole front). It speaks only what Triton's SageMaker
port needs: ``POST`` with a body, answers with a Content-Length or chunked, keep-alive.

Connections: the pool keeps idle ones (last used first) for :data:`KEEPALIVE_S`; ``fresh=True``
sends on a new connection closed after its answer (serving/runtime/forward.py does so while a
load runs). A request cancelled mid-way (a timeout) closes its connection: its answer may still
come and must not be read as the next request's. A kept-alive connection the container closed
as the request went out (no byte of an answer) is retried once on a new one. Failures to get an
answer raise :class:`OSError` (ConnectionError when the connection broke), as sockets do.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Mapping
from urllib.parse import urlsplit

import httptools
from multidict import CIMultiDict

from serving.triton.container_transport import netns_address, netns_socket

KEEPALIVE_S = 60.0  # idle connections older than this are closed, not reused
CONNECT_TIMEOUT_S = 10.0

Reply = tuple[int, Mapping[str, str], bytes]


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: one request at a time, its answer parsed as it arrives."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[Reply] | None = None
        self._headers: CIMultiDict[str] = CIMultiDict()
        self._body: list[bytes] = []
        self.closed = False
        self.answered = False  # a byte of the current request's answer arrived
        self.keep_alive = True
        self.idle_since = 0.0

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionResetError(f"the container closed the connection{f' ({exc})' if exc else ''}"))

    def data_received(self, data: bytes) -> None:
        self.answered = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"the container's answer is not valid HTTP ({exc})"))
            self.close()

    # -- httptools callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._headers, self._body = CIMultiDict(), []

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.add(name.decode("latin-1"), value.decode("latin-1"))

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.keep_alive = self._parser.should_keep_alive()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result((self._parser.get_status_code(), self._headers, b"".join(self._body)))

    # -- use -------------------------------------------------------------------------------
    async def request(self, head: bytes, body: bytes) -> Reply:
        assert self._transport is not None  # connected before it is handed out
        if self.closed:
            raise ConnectionResetError("the container closed the connection")
        self._waiter = asyncio.get_running_loop().create_future()
        self.answered = False
        if len(body) < 65536:
            self._transport.write(head + body)  # one segment for the usual small request
        else:
            self._transport.writelines((head, body))  # no copy of a large body
        try:
            return await self._waiter
        finally:
            self._waiter = None

    def _fail(self, exc: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()


class KeepAlivePool:
    """HTTP/1.1 ``POST`` to one container (``http://host:port`` or an ``http+netns://`` URL)."""

    def __init__(self, base_url: str, *, limit: int = 256) -> None:
        netns = netns_address(base_url)
        if netns is not None:
            self._broker: str | None = netns[0]
            self._address = ("127.0.0.1", netns[1])
        else:
            parts = urlsplit(base_url)
            self._broker = None
            self._address = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._host = f"Host: {self._address[0]}:{self._address[1]}\r\n".encode()
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._slots = asyncio.Semaphore(limit)  # kept-alive connections in use at once

    def head(self, path: str, headers: Mapping[str, str]) -> bytes:
        """The start of a ``POST path`` with ``headers``: what :meth:`post` sends before the body's
        length (callers that send the same head again keep it, serving/runtime/forward.py)."""
        lines = [f"POST {path} HTTP/1.1\r\n".encode(), self._host]
        lines += [f"{name}: {value}\r\n".encode("utf-8", "surrogateescape") for name, value in headers.items()]
        return b"".join(lines)

    async def post(self, path: str, headers: Mapping[str, str], body: bytes, *, fresh: bool = False) -> Reply:
        return await self.post_head(self.head(path, headers), body, fresh=fresh)

    async def post_head(self, start: bytes, body: bytes, *, fresh: bool = False) -> Reply:
        """``POST`` with the head :meth:`head` made, on a kept-alive connection, or on a new one
        closed after its answer (``fresh``)."""
        head = start + (b"Content-Length: %d\r\nConnection: close\r\n\r\n" if fresh
                        else b"Content-Length: %d\r\n\r\n") % len(body)
        if fresh:
            return await self._send(await self._connect(), head, body, keep=False)
        async with self._slots:
            connection = self._take_idle()
            if connection is None:
                return await self._send(await self._connect(), head, body, keep=True)
            try:
                return await self._send(connection, head, body, keep=True)
            except ConnectionError:
                if connection.answered:
                    raise
                # closed by the container as the request went out: nothing of it was answered
                return await self._send(await self._connect(), head, body, keep=True)

    async def _send(self, connection: _Connection, head: bytes, body: bytes, *, keep: bool) -> Reply:
        try:
            reply = await connection.request(head, body)
        except BaseException:  # failed, or cancelled before its answer: the connection is unusable
            self._discard(connection)
            raise
        if keep and connection.keep_alive and not connection.closed:
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
        else:
            self._discard(connection)
        return reply

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and now - connection.idle_since < KEEPALIVE_S:
                return connection
            self._discard(connection)
        return None

    async def _connect(self) -> _Connection:
        try:
            return await self._open_connection()
        except TimeoutError:
            raise
        except OSError as exc:
            where = f"{self._address[0]}:{self._address[1]}" + (f" (namespace of {self._broker})" if self._broker else "")
            raise ConnectionRefusedError(f"cannot connect to the container at {where}: {exc}") from exc

    async def _open_connection(self) -> _Connection:
        loop = asyncio.get_running_loop()
        if self._broker is None:
            _, connection = await loop.create_connection(_Connection, *self._address)
        else:  # a socket made inside Triton's network namespace
            # off the loop: a broker whose backlog is full is tried again until the timeout
            sock = await loop.run_in_executor(None, netns_socket, self._broker, CONNECT_TIMEOUT_S)
            try:
                sock.setblocking(False)
                await asyncio.wait_for(loop.sock_connect(sock, self._address), CONNECT_TIMEOUT_S)
                _, connection = await loop.create_connection(_Connection, sock=sock)
            except BaseException:
                sock.close()
                raise
        raw = connection._transport.get_extra_info("socket") if connection._transport else None
        if raw is not None:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._open.add(connection)
        return connection

    def _discard(self, connection: _Connection) -> None:
        connection.close()
        self._open.discard(connection)

    def close(self) -> None:
        for connection in list(self._open):
            self._discard(connection)
        self._idle.clear()
