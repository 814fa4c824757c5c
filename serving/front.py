"""The HTTP front: the SageMaker runtime API as boto3 calls it, on aiohttp.

``POST /endpoints/{name}/invocations`` with ``X-Amzn-SageMaker-Target-Model``, answered as
SageMaker Runtime answers: a request without a SigV4 signature gets 403 (unless the endpoint
allows unsigned requests; signatures themselves are not verified), another endpoint name a
ValidationError, another ``X-Amzn-SageMaker-Target-Variant`` a ValidationError, a body over
6 MiB a 413 before it is read. Also ``GET /ping``,
``GET /metrics`` (Prometheus text), ``GET /metrics.json`` (the snapshot the bench reads)
and ``GET /models`` (what is loaded). aiohttp keeps connections alive and sets
TCP_NODELAY on its sockets, so no request waits on Nagle's algorithm.
"""

from __future__ import annotations

import json

from aiohttp import web

from serving import errors_sagemaker as sm
from serving.endpoint import MultiModelEndpoint

TARGET_HEADER = "X-Amzn-SageMaker-Target-Model"
VARIANT_HEADER = "X-Amzn-SageMaker-Target-Variant"
ENDPOINT_KEY = web.AppKey("endpoint", MultiModelEndpoint)


def _response(reply: sm.HttpReply) -> web.Response:
    return web.Response(status=reply.status, body=reply.body, headers=dict(reply.headers))


def _signed(request: web.Request) -> bool:
    """A SigV4 signature in the Authorization header or the query string (presigned)."""
    return (request.headers.get("Authorization", "").startswith("AWS4-")
            or "X-Amz-Signature" in request.rel_url.query)


def _refusal(request: web.Request, endpoint: MultiModelEndpoint) -> sm.HttpReply | None:
    """SageMaker Runtime's answer for a request that never reaches the endpoint's models."""
    config = endpoint.config
    if not config.allow_unsigned and not _signed(request):
        return sm.missing_authentication_token()
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
    reply = await endpoint.invoke(
        request.headers.get(TARGET_HEADER), body,
        request.headers.get("Content-Type", "application/json"), request.headers.get("Accept"),
    )
    return _response(reply)


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


def build_app(endpoint: MultiModelEndpoint) -> web.Application:
    app = web.Application(client_max_size=endpoint.config.max_payload_bytes + 1)
    app[ENDPOINT_KEY] = endpoint
    app.router.add_post("/endpoints/{name}/invocations", invocations)
    app.router.add_get("/ping", ping)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/metrics.json", metrics_json)
    app.router.add_get("/models", models)
    return app
