"""The HTTP front: the SageMaker runtime API as boto3 calls it, on aiohttp.

``POST /endpoints/{name}/invocations`` with ``X-Amzn-SageMaker-Target-Model``, answered as
SageMaker Runtime answers: a request without a SigV4 signature gets 403 (unless the endpoint
allows unsigned requests); signatures are verified only when the front is given credentials
(``mme serve --require-signature``, serving/runtime/sigv4_verify.py), else any signature passes; another endpoint name a
ValidationError, another ``X-Amzn-SageMaker-Target-Variant`` a ValidationError, a body over
6 MiB a 413 before it is read. Also ``GET /ping``,
``GET /metrics`` (Prometheus text), ``GET /metrics.json`` (the snapshot the bench reads)
``GET /models`` (what is loaded) and ``GET /targets`` (every TargetModel it answers for; none on a
real-time endpoint, serving/runtime/realtime.py, whose invocations name no TargetModel). aiohttp keeps connections alive and sets
TCP_NODELAY on its sockets, so no request waits on Nagle's algorithm.

The endpoint answers each invocation with a typed outcome (serving/runtime/outcomes.py);
:func:`sagemaker_reply` here is the one place that turns outcomes into SageMaker's replies,
and the invocation metrics are counted here, by the status each client sees.
"""

from __future__ import annotations

import asyncio
import json
import time

from aiohttp import web

from mme.errors import with_retry_advice
from serving.runtime import errors_sagemaker as sm
from serving.runtime import outcomes as out
from serving.runtime import sigv4_verify as sigv4
from serving.runtime.endpoint import EndpointConfig, MultiModelEndpoint
from serving.runtime.realtime import RealTimeEndpoint
from serving.runtime.reply_headers import TARGET_HEADER, cold_headers
from serving.runtime.startup_checks import tarball_targets

VARIANT_HEADER = "X-Amzn-SageMaker-Target-Variant"
ENDPOINT_KEY: web.AppKey[MultiModelEndpoint | RealTimeEndpoint] = web.AppKey("endpoint")
CREDENTIALS_KEY = web.AppKey("credentials", sigv4.Credentials)  # present: signatures are verified
AUTHORIZATION = web.RequestKey("sigv4_authorization", sigv4.Authorization)  # per request: its parsed header, checked once


def _response(reply: sm.HttpReply) -> web.Response:
    return web.Response(status=reply.status, body=reply.body, headers=dict(reply.headers))


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


def _signed(request: web.Request) -> bool:
    """A SigV4 signature in the Authorization header or the query string (presigned)."""
    return (request.headers.get("Authorization", "").startswith("AWS4-")
            or "X-Amz-Signature" in request.rel_url.query)


def _rejected(rejection: sigv4.Rejection | None) -> sm.HttpReply | None:
    if isinstance(rejection, sigv4.Rejection):
        return sm.authentication_failure(rejection.code, rejection.message)
    return None


def _refusal(request: web.Request, endpoint: MultiModelEndpoint | RealTimeEndpoint) -> sm.HttpReply | None:
    """SageMaker Runtime's answer for a request that never reaches the endpoint's models."""
    config = endpoint.config
    if not config.allow_unsigned and not _signed(request):
        return sm.missing_authentication_token()
    credentials = request.app.get(CREDENTIALS_KEY)
    if credentials is not None:  # the key, the form and the time; the signature once the body is read
        auth = sigv4.check_header(request.headers.get("Authorization", ""), request.headers.get("X-Amz-Date"),
                                  request.rel_url.query, credentials)
        if isinstance(auth, sigv4.Rejection):
            return _rejected(auth)
        request[AUTHORIZATION] = auth
    name = request.match_info["name"]
    if name != config.endpoint_name:
        return sm.endpoint_not_found(name, config.account)
    variant = request.headers.get(VARIANT_HEADER)
    if variant is not None and variant != config.variant_name:
        return sm.validation_error(f"Target variant {variant} does not exist for endpoint {name}.")
    if (request.content_length or 0) > config.max_payload_bytes:
        return sm.payload_too_large(config.max_payload_bytes)
    return None


async def invocations(request: web.Request) -> web.Response:
    endpoint = request.app[ENDPOINT_KEY]
    refusal = _refusal(request, endpoint)
    if refusal is not None:
        if refusal.status != 403 and request.match_info["name"] == endpoint.config.endpoint_name:
            # this endpoint's own 4XX (variant, size); unsigned requests and other endpoints' are not its invocations
            endpoint.metrics.request(request.headers.get(TARGET_HEADER) or "", refusal.status,
                                     model_us=0.0, total_us=0.0, wait_us=0.0, hit=None)
        return _response(refusal)
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:  # chunked body past the limit
        return _response(sm.payload_too_large(endpoint.config.max_payload_bytes))
    credentials = request.app.get(CREDENTIALS_KEY)
    if credentials is not None:
        refused = _verify(request, body, credentials)
        if refused is not None:
            return _response(refused)
    target = request.headers.get(TARGET_HEADER)
    start = time.perf_counter()
    outcome = await endpoint.invoke(target, body, request.headers.get("Content-Type", "application/json"),
                                    request.headers.get("Accept"))
    reply = sagemaker_reply(outcome, endpoint.config)
    endpoint.metrics.request(target or "", reply.status, model_us=outcome.model_s * 1e6,
                             total_us=(time.perf_counter() - start) * 1e6,
                             wait_us=outcome.wait_s * 1e6, hit=outcome.hit)
    response = _response(reply)
    response.headers.update(cold_headers(outcome.hit, outcome.wait_s))  # ours, not SageMaker's: cold or warm
    return response


def _verify(request: web.Request, body: bytes, credentials: sigv4.Credentials) -> sm.HttpReply | None:
    """The signature over the request as received (its header was checked, and parsed, by :func:`_refusal`)."""
    return _rejected(sigv4.check_signature(request[AUTHORIZATION], credentials, method=request.method,
                                           raw_path=request.raw_path, headers=request.headers.items(), body=body,
                                           amz_date=request.headers["X-Amz-Date"]))


async def ping(request: web.Request) -> web.Response:
    return web.Response(text="")


async def metrics(request: web.Request) -> web.Response:
    endpoint = request.app[ENDPOINT_KEY]
    endpoint.snapshot()  # refresh the memory gauges
    return web.Response(body=endpoint.metrics.prometheus_text(), content_type="text/plain")


async def metrics_json(request: web.Request) -> web.Response:
    return web.json_response(request.app[ENDPOINT_KEY].snapshot(), dumps=lambda o: json.dumps(o, indent=2))


async def models(request: web.Request) -> web.Response:
    return web.json_response({"models": request.app[ENDPOINT_KEY].loaded_models()})


async def targets(request: web.Request) -> web.Response:
    """Every TargetModel the endpoint answers for (its source's .tar.gz objects, copies included), so a
    client can check its names before it sends anything."""

    endpoint = request.app[ENDPOINT_KEY]
    if isinstance(endpoint, RealTimeEndpoint):  # one model, named by no TargetModel
        return web.json_response({"targets": [], "mode": "single", "model": endpoint.default_model})
    listed = await asyncio.to_thread(tarball_targets, endpoint.cache.source)
    return web.json_response({"targets": list(listed), "mode": "multi"})


def build_app(endpoint: MultiModelEndpoint | RealTimeEndpoint, credentials: sigv4.Credentials | None = None) -> web.Application:
    """The front; with ``credentials`` only invocations signed with that key pair are answered."""
    app = web.Application(client_max_size=endpoint.config.max_payload_bytes + 1)
    app[ENDPOINT_KEY] = endpoint
    if credentials is not None:
        app[CREDENTIALS_KEY] = credentials
    app.router.add_post("/endpoints/{name}/invocations", invocations)
    app.router.add_get("/ping", ping)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/metrics.json", metrics_json)
    app.router.add_get("/models", models)
    app.router.add_get("/targets", targets)
    return app
