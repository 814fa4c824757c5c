"""The HTTP front: the SageMaker runtime API as boto3 calls it, on aiohttp.

``POST /endpoints/{name}/invocations`` with ``X-Amzn-SageMaker-Target-Model``; SigV4
signatures are accepted as sent (nothing here checks credentials). Also ``GET /ping``,
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
ENDPOINT_KEY = web.AppKey("endpoint", MultiModelEndpoint)


def _response(reply: sm.HttpReply) -> web.Response:
    return web.Response(status=reply.status, body=reply.body, headers=dict(reply.headers))


async def invocations(request: web.Request) -> web.Response:
    endpoint = request.app[ENDPOINT_KEY]
    declared = request.content_length or 0
    if declared > endpoint.config.max_payload_bytes:
        return _response(sm.validation_error(
            f"Received payload size {declared} bytes exceeds the limit of {endpoint.config.max_payload_bytes} bytes."))
    body = await request.read()
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
