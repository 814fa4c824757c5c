"""``mme cloud``: SageMaker hosting, its runtime, S3 and CloudWatch on one local address, so the
first article's whole loop (push, deploy, invoke, bench, metrics, delete) runs unchanged
against this machine with only boto3's standard endpoint variables set.

One process, loopback by default. Requests are told apart as AWS tells them apart:

* ``POST /`` with ``X-Amz-Target: SageMaker.*``: the hosting API (``serving.cloud.control_plane``),
  SigV4-signed or refused as AWS refuses it (403 MissingAuthenticationTokenException; the key
  is not checked, as the runtime's front does not check it unless told to);
* ``POST /endpoints/<name>/invocations``: InvokeEndpoint, passed to that endpoint's local
  runtime unchanged (its own front checks the signature, body and TargetModel exactly as
  ``mme serve`` does); an endpoint that is not InService answers SageMaker's ValidationError;
* everything else (S3, CloudWatch, STS...): moto's server, the S3 test server's project,
  running in this process (``ThreadedMotoServer``), which also holds what the metrics feed
  publishes (``serving.cloud.cloudwatch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import urllib.request
from typing import Any

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

from mme.network import is_loopback
from mme.progress import Reporter
from serving.cloud import api
from serving.cloud.cloudwatch import MetricsFeed
from serving.cloud.control_plane import OPERATIONS, ControlPlane
from serving.cloud.hosting import CloudOptions, Hosting
from serving.runtime import errors_sagemaker as sm
from serving.runtime.fleet_router import HOP_HEADERS
from serving.runtime.local_endpoint import start_loop_thread, stop_loop_thread

NOT_PASSED_ON = HOP_HEADERS - {"host"}  # what is not passed on: S3 (moto) tells buckets apart by Host
MAX_BODY = 5 << 30  # S3 PutObject's limit; bodies are read whole before they are passed on
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_SAGEMAKER", "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", "AWS_ENDPOINT_URL_CLOUDWATCH",
                      "AWS_ENDPOINT_URL_S3")


class LocalCloud:
    """The control plane, the runtime router, moto and the metrics feed, started and stopped together."""

    def __init__(self, options: CloudOptions | None = None, reporter: Reporter | None = None) -> None:
        self.options = options or CloudOptions()
        self.reporter = reporter or Reporter(quiet=True)
        self.port: int | None = None
        self._moto: Any = None
        self.moto_url = ""
        self.hosting: Hosting | None = None
        self.control_plane: ControlPlane | None = None
        self.feed: MetricsFeed | None = None
        self._session: ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.options.host}:{self.port}"

    def environment(self, region: str = "us-east-1") -> dict[str, str]:
        """What points an unchanged boto3 (and every mme command) here."""
        env = {name: self.url for name in ENDPOINT_VARIABLES}
        env.setdefault("AWS_DEFAULT_REGION", region)
        return env

    def start(self) -> "LocalCloud":
        from moto.server import ThreadedMotoServer

        if not is_loopback(self.options.host):
            self.reporter.warn(f"mme cloud listens on {self.options.host}: anyone who reaches it can create endpoints "
                               "and read what S3 holds here (nothing checks who signs)")
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request otherwise
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._moto.start()
        host, port = self._moto.get_host_and_port()
        self.moto_url = f"http://{host}:{port}"
        # moto keeps its state per process, not per server: each local cloud starts empty (one at a time per process)
        urllib.request.urlopen(urllib.request.Request(f"{self.moto_url}/moto-api/reset", method="POST"), timeout=30).close()
        self.hosting = Hosting(self.options, self.moto_url, self.reporter)
        self.control_plane = ControlPlane(self.options, self.hosting)
        try:
            self._loop, self._thread = start_loop_thread(self._start_async, "mme-cloud")
        except BaseException:
            self._moto.stop()
            raise
        self.feed = MetricsFeed(self.control_plane, self.hosting, self.options.metrics_interval_s)
        self.feed.start()
        return self

    async def _start_async(self) -> None:
        self._session = ClientSession(connector=TCPConnector(limit=0), auto_decompress=False,
                                      timeout=ClientTimeout(total=None, sock_connect=10))
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post("/endpoints/{name}/invocations", self._invoke)
        app.router.add_route("*", "/{tail:.*}", self._other)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.options.host, self.options.port, backlog=1024).start()
        self.port = self._runner.addresses[0][1]

    async def _stop_async(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def stop(self) -> None:
        try:
            if self.feed is not None:
                self.feed.stop()
            stop_loop_thread(self._loop, self._thread, self._stop_async)
        finally:
            try:
                if self.hosting is not None:
                    self.hosting.close()
            finally:
                if self._moto is not None:
                    self._moto.stop()

    start_in_thread = start  # as LocalEndpoint's, for mme.cli.serve's run loop

    def __enter__(self) -> "LocalCloud":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- requests ---------------------------------------------------------------------------

    async def _other(self, request: web.Request) -> web.StreamResponse:
        target = request.headers.get("X-Amz-Target", "")
        if request.method == "POST" and target.startswith(api.TARGET_PREFIX):
            return await self._sagemaker(request, target)
        return await self._forward(request, self.moto_url)

    async def _sagemaker(self, request: web.Request, target: str) -> web.Response:
        if not request.headers.get("Authorization", "").startswith("AWS4-HMAC-SHA256 "):  # as the runtime's front
            error = api.ApiError("MissingAuthenticationTokenException", "Missing Authentication Token", 403)
            return web.Response(status=403, body=api.error_body(error), content_type=api.AMZ_JSON)
        body = await request.read()
        assert self.control_plane is not None
        plane = self.control_plane

        def answer() -> tuple[int, bytes]:
            try:
                parsed = api.parse(target, body, request.headers.get("Authorization"), OPERATIONS)
                return 200, api.reply_body(plane.handle(parsed))
            except api.ApiError as error:
                return error.status, api.error_body(error)
            except Exception as exc:  # a fault of ours: SageMaker's 500, with what went wrong
                return 500, api.error_body(api.ApiError("InternalFailure", f"{type(exc).__name__}: {exc}", 500))

        status, payload = await asyncio.get_running_loop().run_in_executor(None, answer)
        return web.Response(status=status, body=payload, content_type=api.AMZ_JSON)

    async def _invoke(self, request: web.Request) -> web.StreamResponse:
        assert self.hosting is not None and self.control_plane is not None
        name = request.match_info["name"]
        region = api.region_of(request.headers.get("Authorization"))
        url = self.hosting.url_of(region, name)
        if url is None or self.control_plane.endpoint_status(region, name) not in ("InService", "Updating"):
            reply = sm.endpoint_not_found(name, self.options.account)
            return web.Response(status=reply.status, body=reply.body, headers=dict(reply.headers))
        return await self._forward(request, url)

    async def _forward(self, request: web.Request, base: str) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in NOT_PASSED_ON}
        try:
            async with self._session.request(request.method, f"{base}{request.rel_url}", data=body,
                                             headers=headers, allow_redirects=False) as reply:
                payload = await reply.read()
                status, reply_headers = reply.status, reply.headers
        except Exception as exc:
            error = sm.service_unavailable(f"the local server behind {request.path} did not answer "
                                           f"({type(exc).__name__}); retry the request")
            return web.Response(status=error.status, body=error.body, headers=dict(error.headers))
        out = {k: v for k, v in reply_headers.items() if k.lower() not in NOT_PASSED_ON}
        if request.method == "HEAD":  # the object's size is the reply's Content-Length, with no body
            head = web.StreamResponse(status=status, headers=out)
            if "Content-Length" in reply_headers:
                head.content_length = int(reply_headers["Content-Length"])
            await head.prepare(request)
            return head
        return web.Response(status=status, body=payload, headers=out)


@contextlib.contextmanager
def running_cloud(options: CloudOptions | None = None, reporter: Reporter | None = None):
    """A started LocalCloud, stopped on exit."""
    cloud = LocalCloud(options, reporter).start()
    try:
        yield cloud
    finally:
        cloud.stop()
