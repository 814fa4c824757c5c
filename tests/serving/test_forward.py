"""The front's forwarding to the container over real HTTP (an aiohttp server standing in for
Triton's SageMaker port): the invocation timeout, and the second copy sent while a load is in
flight (serving/runtime/forward.py says why: a Triton load holds every request on its HTTP thread)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from serving.models.cache_entries import cache_key
from serving.runtime.reply_headers import TARGET_HEADER
from serving.triton.container import ContainerUnreachable
from serving.runtime.forward import Forwarder, InvocationTimedOut


class Container:
    """Answers /models/<hash>/invoke; the first ``stall`` requests never answer, or fail with ``fail``."""

    def __init__(self, stall: int = 0, fail: int = 0) -> None:
        self.stall, self.fail, self.seen, self.targets = stall, fail, 0, []

    async def invoke(self, request: web.Request) -> web.Response:
        self.seen += 1
        self.targets.append((request.match_info["name"], request.headers.get(TARGET_HEADER)))
        if self.seen <= self.fail:
            raise ConnectionResetError  # the connection drops without an answer
        if self.seen <= self.stall:
            await asyncio.sleep(3)
        return web.json_response({"outputs": [], "n": self.seen})


async def serve(container: Container) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/models/{name}/invoke", container.invoke)
    runner = web.AppRunner(app, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def run(coro):
    return asyncio.run(coro)


def test_the_hash_and_the_target_header_reach_the_container():
    async def main():
        container = Container()
        runner, url = await serve(container)
        forwarder = Forwarder(url, 5.0, loads_in_flight=lambda: 0)
        try:
            status, _, body = await forwarder.invoke("a/b+c.tar.gz", b"{}", "application/json", None)
        finally:
            await forwarder.close()
            await runner.cleanup()
        return status, body, container.targets

    status, body, targets = run(main())
    assert status == 200 and b'"n": 1' in body
    assert targets == [(cache_key("a/b+c.tar.gz"), "a/b+c.tar.gz")]


def test_no_answer_within_the_invocation_timeout_raises_and_sends_no_second_copy():
    async def main():
        container = Container(stall=1)
        runner, url = await serve(container)
        forwarder = Forwarder(url, 0.5, loads_in_flight=lambda: 0)
        try:
            with pytest.raises(InvocationTimedOut):
                await forwarder.invoke("m.tar.gz", b"{}", "application/json", None)
        finally:
            await forwarder.close()
            await runner.cleanup()
        return container.seen, forwarder.hedged

    assert run(main()) == (1, 0)


def test_while_a_load_is_in_flight_a_stalled_request_is_sent_again_and_the_first_answer_wins():
    async def main():
        container = Container(stall=1)
        runner, url = await serve(container)
        forwarder = Forwarder(url, 5.0, loads_in_flight=lambda: 1)
        loop = asyncio.get_running_loop()
        try:
            started = loop.time()
            status, _, body = await forwarder.invoke("m.tar.gz", b"{}", "application/json", None)
            elapsed = loop.time() - started
        finally:
            await forwarder.close()
            await runner.cleanup()
        return status, body, elapsed, forwarder.hedged

    status, body, elapsed, hedged = run(main())
    assert status == 200 and b'"n": 2' in body  # the second copy answered
    assert hedged == 1 and elapsed < 5.0  # the answer did not wait for the stalled copy's 5 s timeout


def test_when_every_copy_fails_the_failure_is_raised():
    async def main():
        container = Container(stall=1, fail=0)
        runner, url = await serve(container)
        await runner.cleanup()  # nothing listens any more: every copy fails to connect
        forwarder = Forwarder(url, 5.0, loads_in_flight=lambda: 1)
        try:
            with pytest.raises(ContainerUnreachable, match="cannot connect to the container at 127.0.0.1:"):
                await forwarder.invoke("m.tar.gz", b"{}", "application/json", None)
        finally:
            await forwarder.close()

    run(main())


def test_the_slower_copy_runs_to_its_answer_and_keeps_the_target_outstanding():
    """Triton runs the slower copy anyway, and an UNLOAD sent while it runs never completes
    (Triton 2.51): the copy is not cancelled, the target counts as outstanding until it answers,
    and on_idle fires then."""
    async def main():
        container = Container(stall=1)  # the first copy answers after 3 s, the second at once
        runner, url = await serve(container)
        idle: list[tuple[str, float]] = []
        loop = asyncio.get_running_loop()
        forwarder = Forwarder(url, 10.0, loads_in_flight=lambda: 1, on_idle=lambda t: idle.append((t, loop.time())))
        try:
            started = loop.time()
            status, _, body = await forwarder.invoke("m.tar.gz", b"{}", "application/json", None)
            answered = loop.time() - started
            outstanding_after_answer = forwarder.outstanding("m.tar.gz")
            while forwarder.outstanding("m.tar.gz"):
                assert loop.time() - started < 8, "the slower copy never finished"
                await asyncio.sleep(0.05)
        finally:
            await forwarder.close()
            await runner.cleanup()
        return status, body, answered, outstanding_after_answer, [(t, at - started) for t, at in idle], container.seen

    status, body, answered, outstanding, idle, seen = run(main())
    assert status == 200 and b'"n": 2' in body and answered < 3.0  # not the stalled copy's 3 s
    assert outstanding == 1  # the first copy still runs in the container
    assert seen == 2 and len(idle) == 1 and idle[0][0] == "m.tar.gz" and idle[0][1] >= 2.5
