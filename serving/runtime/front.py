"""The HTTP front: the SageMaker runtime API as boto3 calls it, an ASGI application that uvicorn
serves on the endpoint's loop (serving/runtime/http_server.py says why uvicorn, with figures).

``POST /endpoints/{name}/invocations`` with ``X-Amzn-SageMaker-Target-Model``, answered as
SageMaker Runtime answers: a request without a SigV4 signature gets 403 (unless the endpoint
allows unsigned requests); signatures are verified only when the front is given credentials
(``mme serve --require-signature``, serving/runtime/sigv4_verify.py), else any signature passes; another endpoint name a
ValidationError, another ``X-Amzn-SageMaker-Target-Variant`` a ValidationError, a body over
6 MiB a 413 before it is read (a chunked one as soon as it passes the limit; the server drops the
rest). Also ``GET /ping``,
``GET /metrics`` (Prometheus text), ``GET /metrics.json`` (the snapshot the bench reads)
``GET /models`` (what is loaded) and ``GET /targets`` (every TargetModel it answers for; none on a
real-time endpoint, serving/runtime/realtime.py, whose invocations name no TargetModel).

The endpoint answers each invocation with a typed outcome (serving/runtime/outcomes.py);
:func:`sagemaker_reply` here is the one place that turns outcomes into SageMaker's replies,
and the invocation metrics are counted here, by the status each client sees.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Mapping
from urllib.parse import parse_qsl

from mme.errors import with_retry_advice
from serving.runtime import errors_sagemaker as sm
from serving.runtime import outcomes as out
from serving.runtime import sigv4_verify as sigv4
from serving.runtime.endpoint import EndpointConfig, MultiModelEndpoint
from serving.runtime.http_server import Receive, Scope, Send
from serving.runtime.realtime import RealTimeEndpoint
from serving.runtime.reply_headers import TARGET_HEADER, cold_headers
from serving.runtime.startup_checks import tarball_targets

VARIANT_HEADER = "X-Amzn-SageMaker-Target-Variant"
INVOCATIONS_PREFIX, INVOCATIONS_SUFFIX = "/endpoints/", "/invocations"
JSON_UTF8 = "application/json; charset=utf-8"
TEXT_PLAIN = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class InvocationRequest:
    """What the front reads of one ``POST /endpoints/{name}/invocations`` before its body.

    Headers stay as the server parsed them (lower-case names, bytes): a request reads a few by
    name (:meth:`header`), and only a signature check needs them all (:meth:`header_items`)."""

    name: str  # the EndpointName in the path
    method: str
    raw_path: str  # path and query exactly as sent: what a SigV4 signature covers
    query: Mapping[str, str]
    raw_headers: list[tuple[bytes, bytes]]
    _by_name: dict[bytes, bytes]  # the last value of each name

    @classmethod
    def from_scope(cls, scope: Scope, name: str) -> InvocationRequest:
        raw = scope.get("raw_path") or scope["path"].encode()
        query_string: bytes = scope.get("query_string", b"")
        raw_path = raw.decode("latin-1") + ("?" + query_string.decode("latin-1") if query_string else "")
        query = dict(parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)) if query_string else {}
        headers = scope["headers"]
        return cls(name, scope["method"], raw_path, query, headers, dict(headers))

    def header(self, name: bytes) -> str | None:
        """The value of header ``name`` (lower-case bytes, e.g. ``b"content-type"``)."""
        value = self._by_name.get(name)
        return None if value is None else value.decode("utf-8", "surrogateescape")

    def header_items(self) -> list[tuple[str, str]]:
        return [(key.decode("latin-1"), value.decode("utf-8", "surrogateescape")) for key, value in self.raw_headers]

    @property
    def content_length(self) -> int | None:
        value = self._by_name.get(b"content-length")
        return int(value) if value is not None and value.isdigit() else None


AUTHORIZATION, AMZ_DATE = b"authorization", b"x-amz-date"
TARGET, VARIANT = TARGET_HEADER.lower().encode(), VARIANT_HEADER.lower().encode()
CONTENT_TYPE, ACCEPT = b"content-type", b"accept"


def plain_reply(status: int, text: str, content_type: str = TEXT_PLAIN) -> sm.HttpReply:
    return sm.HttpReply(status, (("Content-Type", content_type),), text.encode())


def json_reply(data: object, *, indent: int | None = None) -> sm.HttpReply:
    return sm.HttpReply(200, (("Content-Type", JSON_UTF8),), json.dumps(data, indent=indent).encode())


NOT_FOUND = plain_reply(404, "404: Not Found")


def not_allowed(allowed: str) -> sm.HttpReply:
    return sm.HttpReply(405, (("Content-Type", TEXT_PLAIN), ("Allow", allowed)), b"405: Method Not Allowed")


async def send_reply(send: Send, reply: sm.HttpReply, extra: Mapping[str, str] | None = None) -> None:
    """``reply`` as an HTTP response (its Content-Length set here, so nothing is sent chunked)."""
    headers = [(name.encode("latin-1"), value.encode("utf-8")) for name, value in reply.headers]
    if extra:
        headers += [(name.encode("latin-1"), value.encode("utf-8")) for name, value in extra.items()]
    headers.append((b"content-length", b"%d" % len(reply.body)))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body})


class _TooLarge(Exception):
    """A chunked body went past the limit."""


class _Disconnected(Exception):
    """The client went away before its body was read."""


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body; :class:`_TooLarge` as soon as it passes ``limit`` bytes."""
    message = await receive()
    chunks: list[bytes] = []
    size = 0
    while True:
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        if not message.get("more_body", False):
            if not chunks:
                return chunk  # the usual case: one piece, no copy
            chunks.append(chunk)
            return b"".join(chunks)
        chunks.append(chunk)
        message = await receive()


def sagemaker_reply(outcome: out.Outcome, config: EndpointConfig) -> sm.HttpReply:
    """SageMaker Runtime's reply for what an invocation came to."""
    where = {"endpoint_name": config.endpoint_name, "region": config.region, "account": config.account}
    match outcome:
        case out.Invoked(body=body, content_type=content_type):
            return sm.invocation_reply(body, content_type, variant=config.variant_name)
        case out.MissingTarget():
            return sm.validation_error("This is a multi-model endpoint: set TargetModel (X-Amzn-SageMaker-Target-Model).")
        case out.TargetOnRealTime():
            return sm.validation_error(f"Endpoint {config.endpoint_name} is not a multi-model endpoint and does not "
                                       "support target model header.")
        case out.InvalidTarget(error=error):
            return sm.validation_error(with_retry_advice(error))
        case out.PayloadTooLarge(limit=limit):
            return sm.payload_too_large(limit)
        case out.ModelStillLoading(target=target, wait_timeout_s=timeout_s):
            return sm.model_not_ready(f"Model {target} is not ready: it has been downloading or loading for more than "
                                      f"{timeout_s:g} s and is still loading. Retry the request.")
        case out.ModelEvicted(target=target):
            return sm.model_not_ready(f"Model {target} was unloaded to make room before it could serve; retry the request.")
        case out.ShuttingDown(target=target):
            return sm.service_unavailable(f"The endpoint is shutting down; {target} was still loading. Retry.")
        case out.ContainerUnavailable(detail=detail):
            return sm.service_unavailable(f"The serving container did not answer: {detail}. Retrying can help.")
        case out.InsufficientMemory(status=status, body=body) | out.LoadRefused(status=status, body=body) \
                | out.InvokeFailed(status=status, body=body):
            return sm.model_error(status, body, **where)
        case out.ModelTimedOut():
            return sm.invocation_timed_out(**where)
        case out.LoadError(error=error):
            return sm.reply_for_exception(error)
    raise TypeError(f"no SageMaker reply for {outcome!r}")


def _signed(request: InvocationRequest) -> bool:
    """A SigV4 signature in the Authorization header or the query string (presigned)."""
    return (request.header(AUTHORIZATION) or "").startswith("AWS4-") or "X-Amz-Signature" in request.query


def _rejected(rejection: sigv4.Rejection | None) -> sm.HttpReply | None:
    if isinstance(rejection, sigv4.Rejection):
        return sm.authentication_failure(rejection.code, rejection.message)
    return None


Handler = Callable[[], Awaitable[sm.HttpReply]]


class Front:
    """The front of one endpoint as an ASGI application; with ``credentials`` only invocations
    signed with that key pair are answered."""

    def __init__(self, endpoint: MultiModelEndpoint | RealTimeEndpoint,
                 credentials: sigv4.Credentials | None = None) -> None:
        self.endpoint = endpoint
        self.credentials = credentials
        self._gets: dict[str, Handler] = {"/ping": self.ping, "/metrics": self.metrics,
                                          "/metrics.json": self.metrics_json, "/models": self.models,
                                          "/targets": self.targets}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # no lifespan, no websockets
            return
        path: str = scope["path"]
        if path.startswith(INVOCATIONS_PREFIX) and path.endswith(INVOCATIONS_SUFFIX):
            name = path[len(INVOCATIONS_PREFIX):-len(INVOCATIONS_SUFFIX)]
            if name and "/" not in name:
                if scope["method"] == "POST":
                    await self.invocations(InvocationRequest.from_scope(scope, name), receive, send)
                else:
                    await send_reply(send, not_allowed("POST"))
                return
        handler = self._gets.get(path)
        if handler is None:
            await send_reply(send, NOT_FOUND)
        elif scope["method"] not in ("GET", "HEAD"):
            await send_reply(send, not_allowed("GET, HEAD"))
        else:
            await send_reply(send, await handler())

    # -- invocations ----------------------------------------------------------------------------
    def _refusal(self, request: InvocationRequest) -> sm.HttpReply | sigv4.Authorization | None:
        """SageMaker Runtime's answer for a request that never reaches the endpoint's models; else the
        request's parsed Authorization header when signatures are verified (its key, form and time
        checked here, the signature itself once the body is read), else None."""
        config = self.endpoint.config
        if not config.allow_unsigned and not _signed(request):
            return sm.missing_authentication_token()
        auth: sigv4.Authorization | None = None
        if self.credentials is not None:
            checked = sigv4.check_header(request.header(AUTHORIZATION) or "", request.header(AMZ_DATE),
                                         request.query, self.credentials)
            if isinstance(checked, sigv4.Rejection):
                return sm.authentication_failure(checked.code, checked.message)
            auth = checked
        if request.name != config.endpoint_name:
            return sm.endpoint_not_found(request.name, config.account)
        variant = request.header(VARIANT)
        if variant is not None and variant != config.variant_name:
            return sm.validation_error(f"Target variant {variant} does not exist for endpoint {request.name}.")
        if (request.content_length or 0) > config.max_payload_bytes:
            return sm.payload_too_large(config.max_payload_bytes)
        return auth

    async def invocations(self, request: InvocationRequest, receive: Receive, send: Send) -> None:
        endpoint = self.endpoint
        config = endpoint.config
        refusal = self._refusal(request)
        if isinstance(refusal, sm.HttpReply):
            if refusal.status != 403 and request.name == config.endpoint_name:
                # this endpoint's own 4XX (variant, size); unsigned requests and other endpoints' are not its invocations
                endpoint.metrics.request(request.header(TARGET) or "", refusal.status,
                                         model_us=0.0, total_us=0.0, wait_us=0.0, hit=None)
            await send_reply(send, refusal)  # the body, unread, is dropped by the server
            return
        try:
            body = await read_body(receive, config.max_payload_bytes)
        except _TooLarge:  # chunked body past the limit
            await send_reply(send, sm.payload_too_large(config.max_payload_bytes))
            return
        except _Disconnected:
            return
        if refusal is not None and self.credentials is not None:  # the signature over the request as received
            refused = _rejected(sigv4.check_signature(refusal, self.credentials, method=request.method,
                                                      raw_path=request.raw_path, headers=request.header_items(),
                                                      body=body, amz_date=request.header(AMZ_DATE) or ""))
            if refused is not None:
                await send_reply(send, refused)
                return
        target = request.header(TARGET)
        start = time.perf_counter()
        outcome = await endpoint.invoke(target, body, request.header(CONTENT_TYPE) or "application/json",
                                        request.header(ACCEPT))
        reply = sagemaker_reply(outcome, config)
        endpoint.metrics.request(target or "", reply.status, model_us=outcome.model_s * 1e6,
                                 total_us=(time.perf_counter() - start) * 1e6,
                                 wait_us=outcome.wait_s * 1e6, hit=outcome.hit)
        await send_reply(send, reply, cold_headers(outcome.hit, outcome.wait_s))  # ours, not SageMaker's: cold or warm

    # -- the other routes -----------------------------------------------------------------------
    async def ping(self) -> sm.HttpReply:
        return plain_reply(200, "")

    async def metrics(self) -> sm.HttpReply:
        self.endpoint.snapshot()  # refresh the memory gauges
        return sm.HttpReply(200, (("Content-Type", "text/plain; version=0.0.4; charset=utf-8"),),
                            self.endpoint.metrics.prometheus_text())

    async def metrics_json(self) -> sm.HttpReply:
        return json_reply(self.endpoint.snapshot(), indent=2)

    async def models(self) -> sm.HttpReply:
        return json_reply({"models": self.endpoint.loaded_models()})

    async def targets(self) -> sm.HttpReply:
        """Every TargetModel the endpoint answers for (its source's .tar.gz objects, copies included), so a
        client can check its names before it sends anything."""
        endpoint = self.endpoint
        if isinstance(endpoint, RealTimeEndpoint):  # one model, named by no TargetModel
            return json_reply({"targets": [], "mode": "single", "model": endpoint.default_model})
        listed = await asyncio.to_thread(tarball_targets, endpoint.cache.source)
        return json_reply({"targets": list(listed), "mode": "multi"})
