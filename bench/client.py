"""InvokeEndpoint clients for the load generator.

``FastInvoker``: ``POST {endpoint_url}/endpoints/{name}/invocations`` over geventhttpclient,
signed per request with botocore's ``SigV4Auth`` (service ``sagemaker``). What is the same for
every request (the body's SHA-256, the canonical path, the day's signing key) is computed
once; the signature is botocore's own algorithm, checked against an unmodified ``SigV4Auth``
in the tests. No retries: a failed request is a failed request.

``Boto3Invoker``: the articles' client, boto3 ``sagemaker-runtime`` ``invoke_endpoint`` with
retries off, kept for comparison. It costs several times more CPU per request, so a
generator saturates (and reports its own queueing as latency) much sooner.

Both run inside gevent-patched processes (Locust's); neither prints credentials.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Callable, Protocol

from botocore.auth import SIGNED_HEADERS_BLACKLIST, SigV4Auth, _host_from_url
from geventhttpclient.connectionpool import ConnectionPool, SSLConnectionPool
from geventhttpclient.response import HTTPSocketPoolResponse

from bench.endpoint import SIGNING_SERVICE, EndpointAddress
from serving.runtime.reply_headers import COLD_HEADER, TARGET_HEADER, read_cold

if TYPE_CHECKING:
    from bench.config import BenchConfig
    from bench.payload import Payload

ERROR_TYPE_HEADER = "x-amzn-ErrorType"


@dataclass(frozen=True)
class InvokeResult:
    status: int  # HTTP status; 0 when no response came back
    error: str  # "" on success; the SageMaker error code, the status, or the exception's name
    latency_ms: float  # signing + round trip + reading the body
    response_bytes: int
    message: str = ""  # on failure: the server's message, or the exception's text
    cold: int | None = None  # 1: waited for its model to load; 0: warm; None: the endpoint does not say

    @property
    def ok(self) -> bool:
        return not self.error


class _SignableRequest:
    """The attributes botocore's signer reads from an AWSRequest, with a plain dict of headers."""

    __slots__ = ("method", "url", "headers", "body", "params", "context")

    def __init__(self, method: str, url: str, headers: dict, body: bytes) -> None:
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.params = None
        self.context: dict = {}


class CachedSigV4Auth(SigV4Auth):
    """botocore's SigV4Auth with per-request constants cached and headers kept in a dict."""

    def __init__(self, credentials, service_name: str, region_name: str) -> None:
        super().__init__(credentials, service_name, region_name)
        self._payload_hash: tuple[bytes, str] | None = None
        self._signing_key: tuple[tuple[str, str], bytes] | None = None
        self._queries: dict[str, str] = {}
        self._paths: dict[str, str] = {}

    def sign(self, method: str, url: str, headers: dict, body: bytes) -> dict:
        """Adds X-Amz-Date, Authorization (and X-Amz-Security-Token) to ``headers``."""
        self.add_auth(_SignableRequest(method, url, headers, body))
        return headers

    def headers_to_sign(self, request) -> dict:
        headers = {}
        for name, value in request.headers.items():
            lname = name.lower()
            if lname not in SIGNED_HEADERS_BLACKLIST:
                headers[lname] = value
        if "host" not in headers:
            headers["host"] = _cached_host(request.url)
        return headers

    def canonical_headers(self, headers_to_sign: dict) -> str:
        return "\n".join(f"{key}:{' '.join(str(headers_to_sign[key]).split())}" for key in sorted(headers_to_sign))

    def signed_headers(self, headers_to_sign: dict) -> str:
        return ";".join(sorted(headers_to_sign))

    def canonical_query_string(self, request) -> str:
        if request.params:
            return super().canonical_query_string(request)
        cached = self._queries.get(request.url)
        if cached is None:
            cached = self._queries[request.url] = super().canonical_query_string(request)
        return cached

    def _normalize_url_path(self, path: str) -> str:
        cached = self._paths.get(path)
        if cached is None:
            cached = self._paths[path] = super()._normalize_url_path(path)
        return cached

    def payload(self, request) -> str:
        body = request.body
        cached = self._payload_hash
        if cached is not None and cached[0] is body:
            return cached[1]
        digest = super().payload(request)
        if isinstance(body, bytes):
            self._payload_hash = (body, digest)
        return digest

    def signature(self, string_to_sign: str, request) -> str:
        day = request.context["timestamp"][0:8]
        secret = self.credentials.secret_key
        cached = self._signing_key
        if cached is None or cached[0] != (day, secret):
            k_date = self._sign(f"AWS4{secret}".encode(), day)
            k_region = self._sign(k_date, self._region_name)
            k_service = self._sign(k_region, self._service_name)
            cached = ((day, secret), self._sign(k_service, "aws4_request"))
            self._signing_key = cached
        return self._sign(cached[1], string_to_sign, hex=True)


@lru_cache(maxsize=64)
def _cached_host(url: str) -> str:
    return _host_from_url(url)


MESSAGE_CHARS = 300  # of a failure's message, kept per request


def reply_error_message(body: bytes) -> str:
    """The message of a SageMaker error body (``message``/``Message``), else its first line."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        for key in ("message", "Message", "error", "errorMessage"):
            if isinstance(data.get(key), str) and data[key]:
                return " ".join(data[key].split())[:MESSAGE_CHARS]
    text = body.decode("utf-8", "replace").strip()
    return " ".join(text.splitlines()[:1])[:MESSAGE_CHARS] if text else ""


def exception_message(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:MESSAGE_CHARS] or type(exc).__name__


def reply_error_code(status: int, headers_get, body: bytes) -> str:
    """The error code as botocore reads it: ``x-amzn-ErrorType`` up to its first ``:``, else
    the JSON body's ``__type``/``code``, else the status."""
    value = headers_get(ERROR_TYPE_HEADER)
    if isinstance(value, list):
        value = value[0] if value else None
    if value:
        return value.split(":", 1)[0]
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        for key in ("__type", "code", "Code"):
            if isinstance(data.get(key), str) and data[key]:
                return data[key].rsplit("#", 1)[-1]
    return str(status)


class FastInvoker:
    """One per generator process: keep-alive connections from geventhttpclient's pool (sized to
    the users), its C response parser, and a request head assembled from precomputed parts."""

    def __init__(self, address: EndpointAddress, credentials, body: bytes, content_type: str, accept: str | None,
                 pool_size: int, timeout_s: float) -> None:
        host, port = address.host, address.port
        pool_class = SSLConnectionPool if address.url.startswith("https://") else ConnectionPool
        self._pool = pool_class(host, port, host, port, size=max(1, pool_size), connection_timeout=timeout_s,
                                network_timeout=timeout_s)
        self._url = address.url + address.invocations_path
        self._body = body
        self._signed = {"Content-Type": content_type}
        if accept:
            self._signed["Accept"] = accept
        for value in (content_type, accept or ""):
            if not value.isprintable():
                raise ValueError(f"header value {value!r} is not printable")
        # Host is what SigV4 signs (botocore's rule: no default port); the rest is sent unsigned.
        self._head = (f"POST {address.invocations_path} HTTP/1.1\r\nHost: {_cached_host(self._url)}\r\n"
                      f"User-Agent: mme-bench\r\nContent-Length: {len(body)}\r\n")
        self._signer = CachedSigV4Auth(credentials, SIGNING_SERVICE, address.region)

    def invoke(self, target: str | None) -> InvokeResult:
        start = time.perf_counter()
        headers = dict(self._signed)
        if target:
            headers[TARGET_HEADER] = target
        status, error, size, message, cold = 0, "", 0, "", None
        try:
            self._signer.sign("POST", self._url, headers, self._body)
            head = self._head + "".join(f"{key}: {value}\r\n" for key, value in headers.items()) + "\r\n"
            sock = self._pool.get_socket()
            try:
                sock.sendall(head.encode("latin-1") + self._body)
            except BaseException:
                self._pool.release_socket(sock)
                raise
            response = HTTPSocketPoolResponse(sock, self._pool, method="POST")  # releases the socket on errors
            try:
                data = response.read()
            finally:
                response.release()
            status, size = response.status_code, len(data)
            cold = read_cold(response.get(COLD_HEADER))
            if status != 200:
                error, message = reply_error_code(status, response.get, data), reply_error_message(data)
        except Exception as exc:  # every transport failure is a failed request, named by its type
            error, message = type(exc).__name__, exception_message(exc)
        return InvokeResult(status, error, (time.perf_counter() - start) * 1000.0, size, message, cold)

    def close(self) -> None:
        self._pool.close()


class Boto3Invoker:
    """boto3's invoke_endpoint, as the articles' Locust files call it, retries off."""

    def __init__(self, address: EndpointAddress, credentials, body: bytes, content_type: str, accept: str | None,
                 pool_size: int, timeout_s: float) -> None:
        import boto3  # noqa: PLC0415 - only for --client boto3
        from botocore.config import Config  # noqa: PLC0415 - only for --client boto3

        frozen = credentials.get_frozen_credentials()
        config = Config(retries={"total_max_attempts": 1, "mode": "standard"}, max_pool_connections=max(1, pool_size),
                        connect_timeout=timeout_s, read_timeout=timeout_s)
        self._client = boto3.client(
            "sagemaker-runtime", endpoint_url=address.url if address.custom_url else None, region_name=address.region,
            aws_access_key_id=frozen.access_key, aws_secret_access_key=frozen.secret_key,
            aws_session_token=frozen.token, config=config,
        )
        self._name = address.name
        self._kwargs = {"ContentType": content_type, "Body": body}
        if accept:
            self._kwargs["Accept"] = accept

    def invoke(self, target: str | None) -> InvokeResult:
        from botocore.exceptions import ClientError  # noqa: PLC0415 - only for --client boto3

        start = time.perf_counter()
        kwargs = dict(self._kwargs, EndpointName=self._name)
        if target:
            kwargs["TargetModel"] = target
        status, error, size, message, cold = 0, "", 0, "", None
        try:
            reply = self._client.invoke_endpoint(**kwargs)
            size = len(reply["Body"].read())
            status = reply["ResponseMetadata"]["HTTPStatusCode"]
            cold = read_cold(reply["ResponseMetadata"].get("HTTPHeaders", {}).get(COLD_HEADER.lower()))
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            cold = read_cold(exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get(COLD_HEADER.lower()))
            error = exc.response.get("Error", {}).get("Code") or str(status)
            message = " ".join(str(exc.response.get("Error", {}).get("Message") or "").split())[:MESSAGE_CHARS]
        except Exception as exc:  # connection errors, timeouts: failed requests, named by type
            error, message = type(exc).__name__, exception_message(exc)
        return InvokeResult(status, error, (time.perf_counter() - start) * 1000.0, size, message, cold)

    def close(self) -> None:
        self._client.close()


class Invoker(Protocol):
    """What a load-generating user calls: one invocation, and close at the end."""

    def invoke(self, target: str | None) -> InvokeResult: ...

    def close(self) -> None: ...


CLIENTS: dict[str, Callable[..., Invoker]] = {"fast": FastInvoker, "boto3": Boto3Invoker}


def invoker_for(config: "BenchConfig", credentials, payload: "Payload", pool_size: int) -> Invoker:
    """The configured client (``--client``) sending ``payload`` to the configured endpoint."""
    client = config.client
    return CLIENTS[client.kind](config.endpoint.address, credentials, payload.body, payload.content_type,
                                client.accept, pool_size=pool_size, timeout_s=client.timeout_s)
