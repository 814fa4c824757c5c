"""The container as the endpoint sees it: :class:`Container`, its loads, unloads and
invocations behind one interface. :class:`TritonContainer` is the real one, Triton's SageMaker
API through serving/triton/container.py (the management calls) and serving/runtime/forward.py (the
invocations, hedged while loads run); unit tests pass a fake.

Failures: a load raises serving.triton.container's ModelAlreadyLoaded, ContainerOutOfMemory (507)
or ModelLoadFailed; any call the container does not answer raises ContainerUnreachable
(ContainerTimedOut past its timeout); an invocation past the invocation timeout raises
serving.runtime.forward's InvocationTimedOut.
"""

from __future__ import annotations

from typing import Callable, Protocol

from serving.runtime.forward import Forwarder, Reply
from serving.triton.base import TritonServer
from serving.triton.container import ContainerControl


class Container(Protocol):
    async def load(self, name: str, url: str, *, target: str) -> None: ...

    async def unload(self, name: str, *, target: str, timeout_s: float | None = None) -> None:
        """A model already gone counts as unloaded."""

    async def invoke(self, target: str, body: bytes, content_type: str, accept: str | None) -> Reply:
        """Every HTTP answer comes back as (status, headers, body), errors included."""

    def outstanding(self, target: str) -> int:
        """Requests of ``target`` the container may still be running."""

    async def close(self) -> None: ...


class TritonContainer:
    """The server's SageMaker port (its URL read at each management call: a restart may move it)."""

    def __init__(self, server: TritonServer, *, load_timeout_s: float, invocation_timeout_s: float,
                 loads_in_flight: Callable[[], int], on_idle: Callable[[str], None] | None = None) -> None:
        self._control = ContainerControl(lambda: server.sagemaker_url, load_timeout_s)
        self._forwarder = Forwarder(server.sagemaker_url, invocation_timeout_s, loads_in_flight=loads_in_flight,
                                    on_idle=on_idle, single_model=server.config.single_model)

    async def load(self, name: str, url: str, *, target: str) -> None:
        await self._control.load(name, url, target=target)

    async def unload(self, name: str, *, target: str, timeout_s: float | None = None) -> None:
        await self._control.unload(name, target=target, timeout_s=timeout_s)

    async def invoke(self, target: str, body: bytes, content_type: str, accept: str | None) -> Reply:
        return await self._forwarder.invoke(target, body, content_type, accept)

    def outstanding(self, target: str) -> int:
        return self._forwarder.outstanding(target)

    async def close(self) -> None:
        await self._forwarder.close()
