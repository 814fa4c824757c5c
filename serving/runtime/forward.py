"""Invocations from the front to the container: ``POST /models/<hash>/invoke`` with the target
in ``X-Amzn-SageMaker-Target-Model`` (a real-time endpoint's container: ``POST /invocations``),
under SageMaker's invocation timeout.

Why there are two connection pools. Triton's SageMaker service runs ``POST /models`` (a
load) synchronously on the HTTP worker thread of the connection that sent it
(``src/sagemaker_server.cc``: ``SageMakerMMELoadModel`` calls ``TRITONSERVER_ServerLoadModel``
and waits), and each connection is served by one worker thread for its lifetime. While a
load runs, every other connection on that thread waits for it: measured with the wheel's
Triton 2.51, warm requests on kept-alive connections stalled for the whole 5.4 s of another
model's load (7 connections of 8), while requests on new connections were not held (one
of about 2,600 was). So while any load is in flight, invocations go out on new connections,
and one that has not answered after a few times its model's usual latency is sent again on
another new connection (the first answer wins; the duplicate's work is wasted, which is
cheaper than a request stuck behind a load). With no load in flight, invocations use kept-alive
connections and are never duplicated.

The slower copy is not cancelled: closing its connection would not stop Triton from running it,
and a model must not be unloaded while Triton still runs a request of it (measured with the
wheel's 2.51: an UNLOAD sent while a python-backend model executes a request never completes).
So the copy runs to its answer in the background, and :meth:`Forwarder.outstanding` counts every
request of a target that the container may still be running; ``on_idle(target)`` is called when
that count drops to zero.

The wire protocol (path, target header) comes from serving/triton/container.py, the HTTP client
from serving/triton/invoke_http.py; a connection that gives no answer raises
:class:`~serving.triton.container.ContainerUnreachable`, as the management calls do.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Callable

from serving.models.cache_entries import cache_key
from serving.triton.container import INVOCATIONS_PATH, invoke_headers, invoke_path, unreachable
from serving.triton.invoke_http import KeepAlivePool, Reply

MIN_HEDGE_S = 0.05  # never send a second copy sooner than this
HEDGE_FACTOR = 4.0  # ... or sooner than this many times the target's usual latency
EWMA_WEIGHT = 0.2


class InvocationTimedOut(Exception):
    """The container did not answer within the invocation timeout."""


class Forwarder:
    def __init__(self, base_url: str, timeout_s: float, *, loads_in_flight: Callable[[], int],
                 on_idle: Callable[[str], None] | None = None, single_model: bool = False) -> None:
        self._pool = KeepAlivePool(base_url, limit=256)
        self.timeout_s = timeout_s
        self._loads_in_flight = loads_in_flight
        self._on_idle = on_idle
        self._outstanding: Counter[str] = Counter()  # requests per target the container may be running
        self._stragglers: set[asyncio.Task] = set()  # slower copies left to finish
        self._latency: dict[str, float] = {}  # EWMA of each target's answered invocations, seconds
        self.hedged = 0  # second copies sent
        self.single_model = single_model  # a real-time endpoint's container: POST /invocations, no target
        self._heads: dict[tuple[str, str, str | None], bytes] = {}  # (target, type, accept) -> request head

    def outstanding(self, target: str) -> int:
        """Requests of ``target`` sent to the container and not answered yet (slower copies included)."""
        return self._outstanding[target]

    async def close(self) -> None:
        for task in list(self._stragglers):
            task.cancel()
        self._pool.close()

    async def invoke(self, target: str, body: bytes, content_type: str, accept: str | None) -> Reply:
        head = self._head(target, content_type, accept)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(self.timeout_s):
                if self._loads_in_flight():
                    reply = await self._hedged(target, head, body)
                else:
                    reply = await self._post(head, body, target)
        except TimeoutError:
            raise InvocationTimedOut(target) from None
        seconds = loop.time() - started
        previous = self._latency.get(target)
        self._latency[target] = seconds if previous is None else previous + EWMA_WEIGHT * (seconds - previous)
        return reply

    def _head(self, target: str, content_type: str, accept: str | None) -> bytes:
        """The request's line and headers up to its length, made once per target, type and accept."""
        key = (target, content_type, accept)
        head = self._heads.get(key)
        if head is None:
            if len(self._heads) > 4096:  # targets are unbounded: keep the cache small
                self._heads.clear()
            if self.single_model:
                headers, path = invoke_headers(content_type, accept, None), INVOCATIONS_PATH
            else:
                headers, path = invoke_headers(content_type, accept, target), invoke_path(cache_key(target))
            head = self._heads[key] = self._pool.head(path, headers)
        return head

    async def _post(self, head: bytes, body: bytes, target: str, fresh: bool = False) -> Reply:
        self._outstanding[target] += 1
        try:
            return await self._pool.post_head(head, body, fresh=fresh)
        except OSError as exc:  # no answer (refused, reset, not HTTP): the container is unreachable
            raise unreachable(exc) from exc
        finally:
            self._outstanding[target] -= 1
            if self._outstanding[target] <= 0:
                del self._outstanding[target]
                if self._on_idle is not None:
                    self._on_idle(target)

    async def _hedged(self, target: str, head: bytes, body: bytes) -> Reply:
        pending = {asyncio.ensure_future(self._post(head, body, target, fresh=True))}
        hedge_after = max(MIN_HEDGE_S, HEDGE_FACTOR * self._latency.get(target, 0.0))
        try:
            done, pending = await asyncio.wait(pending, timeout=hedge_after)
            if not done:
                self.hedged += 1
                pending.add(asyncio.ensure_future(self._post(head, body, target, fresh=True)))
            error: BaseException | None = None
            while True:
                for task in done:
                    if task.exception() is None:
                        return task.result()
                    error = task.exception()
                if not pending:
                    assert error is not None  # every copy is done and none succeeded
                    raise error  # every copy failed: the last failure stands for them
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            for task in pending:  # the invocation timed out or was cancelled: every copy goes
                task.cancel()
            raise
        finally:
            for task in pending:  # an answer won: the slower copy runs on to its own answer
                if not task.done():
                    self._stragglers.add(task)
                    task.add_done_callback(self._straggler_done)

    def _straggler_done(self, task: asyncio.Task) -> None:
        self._stragglers.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a failed slower copy is nobody's error
