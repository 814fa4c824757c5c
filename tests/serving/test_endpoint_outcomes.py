"""The endpoint's outcomes at its seam with the container (serving/runtime/endpoint.py through
serving/container_port.Container): a fake container records every call in order and answers
as Triton's SageMaker API would (507 when told to, a crash when told to), its memory is a number
the test controls, and the fake server it runs in restarts as Triton's would. Each test asserts
the typed outcome (serving/runtime/outcomes.py), the order of the container's calls, and the reply the
front makes of the outcome where the outcome is a refusal."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from serving.runtime import outcomes as out
from serving.models.cache_entries import CachedModel, cache_key
from serving.triton.container import ContainerOutOfMemory, ContainerUnreachable
from serving.runtime.endpoint import EndpointConfig, MultiModelEndpoint
from serving.runtime.front import sagemaker_reply

OK_BODY = b'{"outputs": []}'


class FakeServer:
    """What the endpoint and its recovery ask of a Triton server."""

    sagemaker_url = "http://127.0.0.1:1"  # never called: the fake container answers
    pid = None
    returncode = None

    def __init__(self, container: FakeContainer) -> None:
        self.container = container
        self.running = True

    def is_running(self) -> bool:
        return self.running

    def restart(self, *, grace_s: float | None = None) -> None:
        self.container.calls.append(("restart", ""))
        self.container.loaded.clear()  # a new process: nothing loaded
        self.running = True

    def pids(self) -> list[int]:
        return []

    def model_url(self, model_dir: Path) -> str:
        return str(model_dir)


class FakeCache:
    def fetch(self, target: str) -> CachedModel:
        return CachedModel(target, Path("/models") / cache_key(target) / "model", 1, "0" * 64, 0.0, 0.0, "v1",
                           "model-dir")

    def touch(self, target: str) -> bool:
        return True


class FakeContainer:
    """Triton's SageMaker API as the endpoint sees it, every call recorded in order."""

    def __init__(self, sizes: dict[str, int] | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.sizes = sizes or {}
        self.loaded: dict[str, int] = {}  # target -> bytes it holds
        self.refuse: list[str] = []  # their next load is answered 507
        self.gates: dict[str, asyncio.Event] = {}  # their invocations wait until set
        self.crash_on_invoke: set[str] = set()  # the server dies under their next invocation
        self.running: dict[str, int] = {}  # invocations in the container now
        self.unloaded_while_busy: list[str] = []
        self.unknown: dict[str, int] = {}  # their next invocations are answered "unknown model", this many times
        self.server = FakeServer(self)

    def used(self) -> int:
        return sum(self.loaded.values())

    async def load(self, name: str, url: str, *, target: str) -> None:
        self.calls.append(("load", target))
        assert name == cache_key(target) and url.endswith(f"/{name}/model")
        if target in self.refuse:
            self.refuse.remove(target)
            raise ContainerOutOfMemory(507, "no room", name, body='{"error":"no room"}')
        self.loaded[target] = self.sizes.get(target, 10)

    async def unload(self, name: str, *, target: str, timeout_s: float | None = None) -> None:
        self.calls.append(("unload", target))
        if self.running.get(target):
            self.unloaded_while_busy.append(target)
        self.loaded.pop(target, None)

    async def invoke(self, target: str, body: bytes, content_type: str, accept: str | None):
        self.calls.append(("invoke", target))
        self.running[target] = self.running.get(target, 0) + 1
        try:
            if target in self.gates:
                await self.gates[target].wait()
            if target in self.crash_on_invoke:
                self.crash_on_invoke.discard(target)
                self.server.running = False
                self.loaded.clear()
                raise ContainerUnreachable("Server disconnected")
            if self.unknown.get(target):
                self.unknown[target] -= 1
                self.calls.append(("unknown", target))
                return 400, {"Content-Type": "application/json"}, (
                    b'{"error":"Request for unknown model: \'%s\' is not found"}' % target.encode())
            self.calls.append(("answered", target))
            return 200, {"Content-Type": "application/json"}, OK_BODY
        finally:
            self.running[target] -= 1

    def outstanding(self, target: str) -> int:
        return self.running.get(target, 0)

    async def close(self) -> None:
        return None


async def endpoint_for(container: FakeContainer, limit: int = 1_000_000) -> MultiModelEndpoint:
    config = EndpointConfig(memory_limit_bytes=limit, memory_threshold=0.9, model_wait_timeout_s=5.0)
    endpoint = MultiModelEndpoint(FakeCache(), container.server, config, container.used,  # type: ignore[arg-type]
                                  container=container)
    await endpoint.start()
    return endpoint


async def invoke(endpoint: MultiModelEndpoint, target: str) -> out.Outcome:
    return await endpoint.invoke(target, b"{}", "application/json", None)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0.01)


def run(coro) -> None:
    asyncio.run(asyncio.wait_for(coro, timeout=10))


def test_a_507_evicts_an_idle_model_and_the_load_is_retried():
    async def main():
        container = FakeContainer()
        endpoint = await endpoint_for(container)
        assert isinstance(await invoke(endpoint, "a.tar.gz"), out.Invoked)
        container.refuse.append("b.tar.gz")
        outcome = await invoke(endpoint, "b.tar.gz")
        assert outcome == out.Invoked(OK_BODY, "application/json", model_s=outcome.model_s, wait_s=outcome.wait_s,
                                      hit=False)
        assert container.calls == [("load", "a.tar.gz"), ("invoke", "a.tar.gz"), ("answered", "a.tar.gz"),
                                   ("load", "b.tar.gz"), ("unload", "a.tar.gz"), ("load", "b.tar.gz"),
                                   ("invoke", "b.tar.gz"), ("answered", "b.tar.gz")]
        assert [m["target"] for m in endpoint.loaded_models()] == ["b.tar.gz"]
        assert endpoint.metrics.snapshot()["counts"]["ModelEvictions"] == 1
        assert sagemaker_reply(outcome, endpoint.config).status == 200
        await endpoint.close()

    run(main())


def test_a_507_with_every_model_serving_evicts_nothing_and_the_request_gets_the_507():
    async def main():
        container = FakeContainer()
        endpoint = await endpoint_for(container)
        container.gates["a.tar.gz"] = asyncio.Event()
        busy = asyncio.create_task(invoke(endpoint, "a.tar.gz"))
        await settle()
        container.refuse.append("b.tar.gz")
        outcome = await invoke(endpoint, "b.tar.gz")
        assert isinstance(outcome, out.InsufficientMemory) and outcome.body == '{"error":"no room"}'
        assert container.calls == [("load", "a.tar.gz"), ("invoke", "a.tar.gz"), ("load", "b.tar.gz")]
        container.gates["a.tar.gz"].set()
        assert isinstance(await busy, out.Invoked)
        reply = sagemaker_reply(outcome, endpoint.config)
        body = json.loads(reply.body)
        assert reply.status == 424 and body["OriginalStatusCode"] == 507
        assert body["OriginalMessage"] == '{"error":"no room"}'
        assert [m["target"] for m in endpoint.loaded_models()] == ["a.tar.gz"]
        await endpoint.close()

    run(main())


def test_a_model_with_a_request_in_flight_is_evicted_only_once_it_has_answered():
    async def main():
        container = FakeContainer(sizes={"a.tar.gz": 60, "b.tar.gz": 60})
        endpoint = await endpoint_for(container, limit=100)  # 90 bytes under the threshold: one model fits
        container.gates["a.tar.gz"] = asyncio.Event()
        first = asyncio.create_task(invoke(endpoint, "a.tar.gz"))
        await settle()
        second = asyncio.create_task(invoke(endpoint, "b.tar.gz"))
        await settle()
        # b needs a's room, a is serving: b's load waits, nothing is unloaded.
        assert not second.done() and ("unload", "a.tar.gz") not in container.calls
        assert container.calls == [("load", "a.tar.gz"), ("invoke", "a.tar.gz")]
        container.gates["a.tar.gz"].set()
        assert isinstance(await first, out.Invoked)
        outcome = await second
        assert isinstance(outcome, out.Invoked) and outcome.hit is False
        assert container.calls == [("load", "a.tar.gz"), ("invoke", "a.tar.gz"), ("answered", "a.tar.gz"),
                                   ("unload", "a.tar.gz"), ("load", "b.tar.gz"), ("invoke", "b.tar.gz"),
                                   ("answered", "b.tar.gz")]
        assert container.unloaded_while_busy == [] and container.used() == 60
        await endpoint.close()

    run(main())


def test_a_container_that_dies_under_a_request_is_restarted_and_the_request_answered():
    async def main():
        container = FakeContainer()
        endpoint = await endpoint_for(container)
        container.crash_on_invoke.add("a.tar.gz")
        outcome = await invoke(endpoint, "a.tar.gz")
        assert isinstance(outcome, out.Invoked) and outcome.body == OK_BODY
        assert container.calls == [("load", "a.tar.gz"), ("invoke", "a.tar.gz"), ("restart", ""),
                                   ("load", "a.tar.gz"), ("invoke", "a.tar.gz"), ("answered", "a.tar.gz")]
        assert endpoint.metrics.snapshot()["counts"]["ContainerRestarts"] == 1
        assert [m["target"] for m in endpoint.loaded_models()] == ["a.tar.gz"]
        await endpoint.close()

    run(main())


def test_a_container_that_does_not_answer_but_lives_is_a_503_without_a_restart():
    async def main():
        container = FakeContainer()
        endpoint = await endpoint_for(container)
        await invoke(endpoint, "a.tar.gz")

        async def refuse(*args, **kwargs):
            container.calls.append(("invoke", "a.tar.gz"))
            raise ContainerUnreachable("Connection reset by peer")

        container.invoke = refuse  # type: ignore[method-assign]
        outcome = await invoke(endpoint, "a.tar.gz")
        assert outcome == out.ContainerUnavailable("Connection reset by peer", wait_s=0.0, hit=True)
        assert ("restart", "") not in container.calls and container.calls[-1] == ("invoke", "a.tar.gz")
        reply = sagemaker_reply(outcome, endpoint.config)
        assert reply.status == 503 and json.loads(reply.body)["Message"] == (
            "The serving container did not answer: Connection reset by peer. Retrying can help.")
        await endpoint.close()

    run(main())


def test_an_unknown_model_answer_for_a_loaded_model_is_sent_once_more():
    """Triton answers "unknown model", for one request, for a model it holds while another model's
    repository is registered (seen under thrash): the request goes once more, nothing is reloaded;
    a second such answer is the request's ModelError."""

    async def main():
        container = FakeContainer()
        endpoint = await endpoint_for(container)
        assert isinstance(await invoke(endpoint, "a.tar.gz"), out.Invoked)
        container.unknown["a.tar.gz"] = 1
        outcome = await invoke(endpoint, "a.tar.gz")
        assert isinstance(outcome, out.Invoked) and outcome.hit is True
        assert container.calls[3:] == [("invoke", "a.tar.gz"), ("unknown", "a.tar.gz"), ("invoke", "a.tar.gz"),
                                       ("answered", "a.tar.gz")]
        assert endpoint.metrics.snapshot()["counts"]["UnknownModelResends"] == 1
        container.unknown["a.tar.gz"] = 2
        outcome = await invoke(endpoint, "a.tar.gz")
        assert isinstance(outcome, out.InvokeFailed) and outcome.status == 400
        assert sagemaker_reply(outcome, endpoint.config).status == 424
        assert [c for c in container.calls if c[0] == "load"] == [("load", "a.tar.gz")]
        await endpoint.close()

    run(main())
