"""serving/triton/invoke_http.py, the invocations' HTTP/1.1 client, against real servers: an aiohttp
server standing in for Triton's SageMaker port, and raw asyncio servers for what a server may
do to a connection (close it while idle, answer chunked, answer garbage)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from serving.triton.invoke_http import KeepAlivePool


async def _aiohttp_server(handler) -> tuple[web.AppRunner, str, list]:
    peers: list = []

    async def wrapped(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        return await handler(request)

    app = web.Application()
    app.router.add_post("/{tail:.*}", wrapped)
    runner = web.AppRunner(app, shutdown_timeout=0.2)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}", peers


def test_requests_reuse_one_kept_alive_connection_and_carry_path_headers_and_body():
    async def main():
        async def echo(request: web.Request) -> web.Response:
            body = await request.read()
            return web.Response(body=body[::-1], headers={"Content-Type": "application/x-test",
                                                         "X-Path": request.path, "X-Target": request.headers["X-T"]})

        runner, url, peers = await _aiohttp_server(echo)
        pool = KeepAlivePool(url)
        try:
            replies = [await pool.post(f"/models/m{i}/invoke", {"X-T": f"t{i}"}, b"abc" * (i + 1)) for i in range(5)]
            big = await pool.post("/big", {"X-T": "big"}, b"x" * 300_000 + b"y")  # written without a copy
        finally:
            pool.close()
            await runner.cleanup()
        return replies, big, peers

    replies, big, peers = asyncio.run(main())
    for i, (status, headers, body) in enumerate(replies):
        assert status == 200 and body == (b"abc" * (i + 1))[::-1]
        assert headers["content-type"] == "application/x-test" and headers["X-Path"] == f"/models/m{i}/invoke"
        assert headers["X-Target"] == f"t{i}"
    assert big[2] == b"y" + b"x" * 300_000
    assert len(set(peers)) == 1, peers  # one connection, kept alive


def test_a_cancelled_request_closes_its_connection_so_its_late_answer_is_never_read_as_another():
    async def main():
        async def slow_then_fast(request: web.Request) -> web.Response:
            body = await request.read()
            if body == b"slow":
                await asyncio.sleep(0.5)
            return web.Response(body=body)

        runner, url, peers = await _aiohttp_server(slow_then_fast)
        pool = KeepAlivePool(url)
        try:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.1):
                    await pool.post("/x", {}, b"slow")
            answer = await pool.post("/x", {}, b"fast")
            await asyncio.sleep(0.6)  # the slow answer arrives on the closed connection, read by nobody
            again = await pool.post("/x", {}, b"again")
        finally:
            pool.close()
            await runner.cleanup()
        return answer, again, peers

    answer, again, peers = asyncio.run(main())
    assert answer[2] == b"fast" and again[2] == b"again"
    assert len(set(peers)) == 2  # the cancelled request's connection was not reused


async def _raw_server(answer) -> tuple[asyncio.Server, str, list]:
    """A server whose ``answer(request_bytes, writer, n)`` writes what it likes for the n-th request."""
    connections: list = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        n = 0
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
            await reader.readexactly(length)
            n += 1
            if not await answer(head, writer, n):
                writer.close()
                return

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", connections


def test_chunked_answers_and_a_connection_the_server_closes_after_answering():
    async def main():
        async def answer(head: bytes, writer: asyncio.StreamWriter, n: int) -> bool:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
                         b"3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n")
            await writer.drain()
            return False  # and close: the next request needs a new connection

        server, url, connections = await _raw_server(answer)
        pool = KeepAlivePool(url)
        try:
            first = await pool.post("/x", {}, b"1")
            await asyncio.sleep(0.05)  # the close reaches the client
            second = await pool.post("/x", {}, b"2")
        finally:
            pool.close()
            server.close()
        return first, second, connections

    first, second, connections = asyncio.run(main())
    assert first[0] == second[0] == 200 and first[2] == second[2] == b'{"a":1}'
    assert len(connections) == 2


def test_garbage_for_an_answer_is_a_connection_error_not_a_reply():
    async def main():
        async def answer(head: bytes, writer: asyncio.StreamWriter, n: int) -> bool:
            writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
            await writer.drain()
            return True

        server, url, _ = await _raw_server(answer)
        pool = KeepAlivePool(url)
        try:
            with pytest.raises(ConnectionError, match="not valid HTTP"):
                await pool.post("/x", {}, b"1")
        finally:
            pool.close()
            server.close()

    asyncio.run(main())


def test_a_kept_alive_connection_the_server_dropped_is_replaced_without_failing_the_request():
    async def main():
        async def answer(head: bytes, writer: asyncio.StreamWriter, n: int) -> bool:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            return True

        server, url, connections = await _raw_server(answer)
        pool = KeepAlivePool(url)
        try:
            await pool.post("/x", {}, b"1")
            connections[0].transport.abort()  # the server drops the idle connection
            await asyncio.sleep(0.05)
            reply = await pool.post("/x", {}, b"2")
        finally:
            pool.close()
            server.close()
        return reply, connections

    reply, connections = asyncio.run(main())
    assert reply[2] == b"ok" and len(connections) == 2


def test_nothing_listening_is_a_one_line_connection_refused():
    async def main():
        server, url, _ = await _raw_server(lambda *a: None)
        server.close()
        await server.wait_closed()
        with pytest.raises(ConnectionRefusedError, match=r"cannot connect to the container at 127\.0\.0\.1:\d+"):
            await KeepAlivePool(url).post("/x", {}, b"1")

    asyncio.run(main())
