"""A client for the SageMaker multi-model container contract (what SageMaker's front end
calls on the container; Triton implements it with ``--allow-sagemaker=true``):

    GET    /ping                      200 when healthy
    POST   /models                    {"model_name", "url"}: 200 loaded, 409 already loaded,
                                      507 out of memory, 400 other errors
    GET    /models                    {"models": [{"modelName", "modelUrl"}]}
    GET    /models/NAME               {"modelName", "modelUrl"}; 404 when not loaded
    POST   /models/NAME/invoke        KServe v2 inference (JSON or binary+json)
    DELETE /models/NAME               200 unloaded; 404 when not loaded

SageMaker names each loaded model by a hash (``model_name``, also the directory
``/opt/ml/models/<hash>/model``) and sends the target's object name in the
``X-Amzn-SageMaker-Target-Model`` header on every call about it; Triton 2.38+ registers the
model under that header's value and keys its list by the hash, so ``/models/<hash>/invoke``
reaches targets whose names hold ``/``, ``+`` or spaces (Triton does not URL-decode paths).
Every call here takes ``target=`` for that header.

Non-2xx answers of the model-management calls become the exceptions below: they are
outcomes of the protocol that callers act on (SageMaker unloads a model and retries on
507), not user errors. ``invoke`` returns every answer as an :class:`ContainerReply`. No
answer at all (connection refused or dropped, a timeout) is :class:`ContainerUnreachable`
(:class:`ContainerTimedOut`), whichever HTTP library asked.

This module is the one place that knows the wire protocol: the paths, the target header,
Triton's error bodies. How a connection reaches the server (plain TCP, or a socket from the
broker of Triton's private network namespace: ``http+netns://`` URLs) is
serving/triton/container_transport.py's. :class:`ContainerClient` makes the management calls (blocking, on
``requests``; :class:`ContainerControl` runs them off an event loop, each on its own
connection); serving/runtime/forward.py sends the invocations (on serving/triton/invoke_http.py's
keep-alive client) through :func:`invoke_path`, :func:`invoke_headers` and :func:`unreachable`.

Triton resolves a load's ``url`` as a directory holding one model directory (the tarball
extracted, as SageMaker does under ``/opt/ml/models/<hash>/model``); a ``config.pbtxt`` at
the root of ``url`` is accepted only under ``/opt/ml/models/<hash>/model``. Each loaded
copy needs its own directory: a directory already registered answers 409.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, TypeVar
from urllib.parse import quote

import requests
from requests.structures import CaseInsensitiveDict

from serving.runtime.reply_headers import TARGET_HEADER
from serving.triton.container_transport import http_session

DEFAULT_TIMEOUT_S = 60.0
LOAD_TIMEOUT_S = 600.0  # SageMaker allows a model load several minutes


T = TypeVar("T")


class ContainerUnreachable(Exception):
    """The container gave no answer: the connection was refused or dropped."""

    retryable = True


class ContainerTimedOut(ContainerUnreachable):
    """The container did not answer within the call's timeout."""


def unreachable(exc: BaseException) -> ContainerUnreachable:
    """``exc``, an HTTP library's failure to get an answer, as this module's exception (same message)."""
    timed_out = isinstance(exc, (TimeoutError, requests.Timeout))
    return (ContainerTimedOut if timed_out else ContainerUnreachable)(str(exc))


INVOCATIONS_PATH = "/invocations"  # a single-model (real-time) container's one invocation path


def model_path(name: str) -> str:
    """``/models/NAME``, the name quoted whole (hashes need no quoting; other names hold ``/``)."""
    return f"/models/{quote(name, safe='')}"


def invoke_path(name: str) -> str:
    return model_path(name) + "/invoke"


def target_headers(target: str | None) -> dict[str, str]:
    return {TARGET_HEADER: target} if target else {}


def invoke_headers(content_type: str, accept: str | None, target: str | None) -> dict[str, str]:
    """The headers of ``POST /models/NAME/invoke``, as SageMaker's front end sends them."""
    headers = {"Content-Type": content_type, **target_headers(target)}
    if accept:
        headers["Accept"] = accept
    return headers


@contextmanager
def _answers() -> Iterator[None]:
    """``requests``' failures to get an answer, as :class:`ContainerUnreachable`."""
    try:
        yield
    except requests.RequestException as exc:
        raise unreachable(exc) from exc


class ContainerError(Exception):
    """The container answered a model-management call with an error status."""

    def __init__(self, status: int, message: str, model_name: str | None = None, *, body: str = "") -> None:
        self.status = status
        self.message = message
        self.model_name = model_name
        self.body = body or message  # the raw response body (what SageMaker quotes as OriginalMessage)
        where = f" for model {model_name!r}" if model_name else ""
        super().__init__(f"HTTP {status}{where}: {message or '(no message)'}")


class ModelAlreadyLoaded(ContainerError):
    """409: the name (or the model directory) is already loaded."""


class ContainerOutOfMemory(ContainerError):
    """507: no room for another model; SageMaker would unload the least recently used one."""


class ModelLoadFailed(ContainerError):
    """400 or any other failure of POST /models."""


class ModelNotLoaded(ContainerError):
    """404 from GET or DELETE /models/NAME."""


@dataclass(frozen=True)
class LoadedModelInfo:
    name: str
    url: str


@dataclass(frozen=True)
class ContainerReply:
    status: int
    headers: Mapping[str, str]  # case-insensitive
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "")

    def json(self):
        """The body as JSON (whole body for application/json, the header of binary+json)."""
        marker = "json-header-size="
        if marker in self.content_type:
            size = int(self.content_type.split(marker, 1)[1].split(";", 1)[0])
            return json.loads(self.body[:size])
        return json.loads(self.body)


def _error_text(response: requests.Response) -> str:
    """Triton's ``{"error": "..."}`` text, else the raw body (or the reason phrase)."""
    text = response.text.strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text or response.reason or ""
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        return data["error"]
    return text


def ping_status(url: str, timeout_s: float = 2.0) -> int | None:
    """HTTP status of ``GET url/ping``, or None when nothing answers (Triton starting, or gone)."""
    try:
        with http_session() as session:
            return session.get(f"{url.rstrip('/')}/ping", timeout=timeout_s).status_code
    except requests.RequestException:
        return None


class ContainerClient:
    """Calls one container's MME contract over a keep-alive HTTP session."""

    def __init__(
        self, base_url: str, timeout_s: float = DEFAULT_TIMEOUT_S, load_timeout_s: float = LOAD_TIMEOUT_S
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.load_timeout_s = load_timeout_s
        self.session = http_session()

    def _url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    def _send(self, method: str, path: str, timeout_s: float, **kwargs) -> requests.Response:
        with _answers():
            return self.session.request(method, self._url(path), timeout=timeout_s, **kwargs)

    def ping(self) -> bool:
        """True when ``GET /ping`` answers 200; False on any other answer or no answer."""
        try:
            return self._send("GET", "/ping", self.timeout_s).status_code == 200
        except ContainerUnreachable:
            return False

    def load(self, model_name: str, url: str, *, target: str | None = None) -> None:
        """``POST /models``: load the model directory ``url`` under ``model_name`` (the hash),
        for the object ``target`` (sent as SageMaker sends it, in the target header)."""
        response = self._send("POST", "/models", self.load_timeout_s, json={"model_name": model_name, "url": str(url)},
                              headers=target_headers(target))
        if response.status_code == 200:
            return
        message = _error_text(response)
        if response.status_code == 409:
            raise ModelAlreadyLoaded(409, message, model_name, body=response.text)
        if response.status_code == 507:
            raise ContainerOutOfMemory(507, message, model_name, body=response.text)
        raise ModelLoadFailed(response.status_code, message, model_name, body=response.text)

    def list_models(self) -> list[LoadedModelInfo]:
        response = self._send("GET", "/models", self.timeout_s)
        if response.status_code != 200:
            raise ContainerError(response.status_code, _error_text(response))
        # Triton lists a model that is not ready yet as an empty object.
        return [
            LoadedModelInfo(entry["modelName"], entry.get("modelUrl", ""))
            for entry in response.json().get("models", [])
            if "modelName" in entry
        ]

    def get_model(self, name: str, *, target: str | None = None) -> LoadedModelInfo:
        response = self._send("GET", model_path(name), self.timeout_s, headers=target_headers(target))
        if response.status_code == 404:
            raise ModelNotLoaded(404, "model is not loaded", name)
        if response.status_code != 200:
            raise ContainerError(response.status_code, _error_text(response), name)
        data = response.json()
        return LoadedModelInfo(data["modelName"], data.get("modelUrl", ""))

    def unload(self, name: str, *, target: str | None = None) -> None:
        """``DELETE /models/NAME``. Triton unloads the model registered under the target
        header's value (the hash when absent), so pass the ``target`` it was loaded with."""
        response = self._send("DELETE", model_path(name), self.load_timeout_s, headers=target_headers(target))
        if response.status_code == 200:
            return
        if response.status_code == 404:
            raise ModelNotLoaded(404, "model is not loaded", name)
        raise ContainerError(response.status_code, _error_text(response), name)

    def invoke(self, name: str, body: bytes, content_type: str, accept: str | None = None, *,
               target: str | None = None) -> ContainerReply:
        """``POST /models/NAME/invoke``; every HTTP answer comes back, errors included."""
        response = self._send("POST", invoke_path(name), self.timeout_s, data=body,
                              headers=invoke_headers(content_type, accept, target))
        return ContainerReply(
            status=response.status_code, headers=CaseInsensitiveDict(response.headers), body=response.content
        )

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> "ContainerClient":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class ContainerControl:
    """The management calls an event loop makes: each in a thread, on its own connection
    (Triton runs a load on the HTTP thread of the connection that asked, holding every other
    request on that thread), against ``base_url()`` as it is at the call (a restarted server)."""

    def __init__(self, base_url: Callable[[], str], load_timeout_s: float = LOAD_TIMEOUT_S) -> None:
        self._base_url = base_url
        self.load_timeout_s = load_timeout_s

    async def _call(self, timeout_s: float, call: Callable[[ContainerClient], T]) -> T:
        def run() -> T:
            with ContainerClient(self._base_url(), load_timeout_s=timeout_s) as client:
                return call(client)

        return await asyncio.to_thread(run)

    async def load(self, name: str, url: str, *, target: str) -> None:
        """``POST /models``; raises as :meth:`ContainerClient.load` does."""
        await self._call(self.load_timeout_s, lambda client: client.load(name, url, target=target))

    async def unload(self, name: str, *, target: str, timeout_s: float | None = None) -> None:
        """``DELETE /models/NAME`` (within ``timeout_s``, else the client's default); a model
        already gone counts as unloaded."""

        def unload(client: ContainerClient) -> None:
            try:
                client.unload(name, target=target)
            except ModelNotLoaded:
                return

        await self._call(LOAD_TIMEOUT_S if timeout_s is None else timeout_s, unload)
