"""InvokeEndpoint replies exactly as SageMaker Runtime sends them (AWS rest-json protocol).

The error codes, their HTTP statuses, their members and the success headers are read from
botocore's own service model for ``sagemaker-runtime``, so a real boto3 client parses each
reply into ``client.exceptions.<Code>`` (or a normal response) as it would against AWS.

How botocore finds the code (``RestJSONParser``): the ``x-amzn-ErrorType`` header, up to
the first ``:``; the message from the body's ``Message``/``message``; modeled members
(``OriginalStatusCode``...) from the body by name. Without the header the code would be
the bare status ("424") and boto3 would raise a plain ClientError.

Retries (measured with botocore 1.44.8): boto3 retries InternalFailure (500) and
ServiceUnavailable (503) by itself in both retry modes, and ModelNotReadyException (429)
in the legacy mode, the default when no retry mode is configured (up to 5 attempts). A load
test that counts client calls sees fewer calls than the server saw requests.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from mme.errors import with_retry_advice

SERVICE = "sagemaker-runtime"
OPERATION = "InvokeEndpoint"
# The namespace AWS puts after the code in x-amzn-ErrorType; botocore keeps only the code.
ERROR_TYPE_SUFFIX = ":http://internal.amazon.com/coral/com.amazon.sagemaker/"
# Errors raised before the request reaches SageMaker's service code carry Coral's namespace.
CORAL_SERVICE_SUFFIX = ":http://internal.amazon.com/coral/com.amazon.coral.service/"
MAX_PAYLOAD_BYTES = 6_291_456  # InvokeEndpoint's body limit (a real-time request)
DEFAULT_VARIANT = "AllTraffic"
DEFAULT_ENDPOINT_NAME = "local"
DEFAULT_ACCOUNT = "000000000000"
PRIMARY_CONTAINER = "primary"
# What SageMaker says when the container has not answered within 60 s (OriginalStatusCode 0).
INVOCATION_TIMEOUT_MESSAGE = (
    "Your invocation timed out while waiting for a response from container {container}. Review the latency "
    "metrics for each container in Amazon CloudWatch, resolve the issue, and try again."
)


@dataclass(frozen=True)
class ErrorShape:
    code: str
    status: int
    members: tuple[str, ...]  # body fields, as named in the service model


@dataclass(frozen=True)
class HttpReply:
    """What to send: status, headers (Content-Length left to the server) and body."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None


@lru_cache(maxsize=1)
def _operation() -> Any:
    import botocore.session

    return botocore.session.get_session().get_service_model(SERVICE).operation_model(OPERATION)


@lru_cache(maxsize=1)
def invoke_endpoint_errors() -> dict[str, ErrorShape]:
    """InvokeEndpoint's modeled errors by code, from botocore's service model."""
    shapes = {}
    for shape in _operation().error_shapes:
        status = int(shape.metadata["error"]["httpStatusCode"])
        shapes[shape.error_code or shape.name] = ErrorShape(shape.error_code or shape.name, status, tuple(shape.members))
    return shapes


@lru_cache(maxsize=1)
def _output_header_names() -> dict[str, str]:
    members = _operation().output_shape.members
    return {name: m.serialization["name"] for name, m in members.items() if m.serialization.get("location") == "header"}


def _request_id(request_id: str | None) -> str:
    """A new random (version 4) UUID, as SageMaker's x-amzn-RequestId, unless one is given. Made from
    16 random bytes directly: on every reply, and uuid.uuid4() costs several times more."""
    if request_id:
        return request_id
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT_NIBBLE[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


_VARIANT_NIBBLE = "89ab"  # RFC 9562: the variant bits 10xx


def error_reply(code: str, message: str, *, request_id: str | None = None, **fields: Any) -> HttpReply:
    """The reply for modeled error ``code`` with ``message`` and any of its other members."""
    shapes = invoke_endpoint_errors()
    if code not in shapes:
        raise ValueError(f"{code!r} is not an InvokeEndpoint error; use one of {', '.join(sorted(shapes))}")
    shape = shapes[code]
    unknown = sorted(set(fields) - set(shape.members))
    if unknown:
        raise ValueError(f"{code} has no member(s) {', '.join(unknown)}; its members are {', '.join(shape.members)}")
    body = {"Message": message, **{k: v for k, v in fields.items() if v is not None}}
    headers = (
        ("Content-Type", "application/json"),
        ("x-amzn-RequestId", _request_id(request_id)),
        ("x-amzn-ErrorType", code + ERROR_TYPE_SUFFIX),
    )
    return HttpReply(shape.status, headers, json.dumps(body).encode())


def validation_error(message: str, *, request_id: str | None = None) -> HttpReply:
    """400: bad request, unknown endpoint, or a target model that cannot be downloaded or unpacked."""
    return error_reply("ValidationError", message, request_id=request_id)


def model_not_ready(message: str, *, request_id: str | None = None) -> HttpReply:
    """429: the MME is still downloading or loading the target model."""
    return error_reply("ModelNotReadyException", message, request_id=request_id)


def internal_failure(message: str, *, request_id: str | None = None) -> HttpReply:
    return error_reply("InternalFailure", message, request_id=request_id)


def service_unavailable(message: str, *, request_id: str | None = None) -> HttpReply:
    return error_reply("ServiceUnavailable", message, request_id=request_id)


def internal_dependency(message: str, *, request_id: str | None = None) -> HttpReply:
    return error_reply("InternalDependencyException", message, request_id=request_id)


def payload_too_large(limit: int, *, request_id: str | None = None) -> HttpReply:
    """413 for a body over the limit: not a modeled error, so botocore raises a plain ClientError
    with code "413" (seen against AWS: "An error occurred (413) when calling the InvokeEndpoint
    operation: HTTP content length exceeded 5246976 bytes.", aws/sagemaker-python-sdk#171, when the
    limit was 5 MiB)."""
    body = {"message": f"HTTP content length exceeded {limit} bytes."}
    headers = (("Content-Type", "application/json"), ("x-amzn-RequestId", _request_id(request_id)))
    return HttpReply(413, headers, json.dumps(body).encode())


def missing_authentication_token(*, request_id: str | None = None) -> HttpReply:
    """403 for a request without a SigV4 signature, byte for byte as SageMaker Runtime sends it
    (captured in aws/amazon-sagemaker-examples#290)."""
    headers = (("Content-Type", "application/json"), ("x-amzn-RequestId", _request_id(request_id)),
               ("x-amzn-ErrorType", "MissingAuthenticationTokenException" + CORAL_SERVICE_SUFFIX))
    return HttpReply(403, headers, json.dumps({"message": "Missing Authentication Token"}).encode())


def authentication_failure(code: str, message: str, *, request_id: str | None = None) -> HttpReply:
    """403 for a signed request AWS's front refuses before SageMaker sees it: a key it does not
    know (UnrecognizedClientException), a signature that does not match or has expired
    (InvalidSignatureException), a malformed one (IncompleteSignatureException). Shaped as
    :func:`missing_authentication_token` (Coral's namespace, lowercase ``message``); botocore
    raises a ClientError with that code."""
    headers = (("Content-Type", "application/json"), ("x-amzn-RequestId", _request_id(request_id)),
               ("x-amzn-ErrorType", code + CORAL_SERVICE_SUFFIX))
    return HttpReply(403, headers, json.dumps({"message": message}).encode())


def endpoint_not_found(name: str, account: str, *, request_id: str | None = None) -> HttpReply:
    """400 ValidationError for an endpoint name this account does not have."""
    return validation_error(f"Endpoint {name} of account {account} not found.", request_id=request_id)


def log_stream_arn(endpoint_name: str, region: str, account: str) -> str:
    return f"arn:aws:logs:{region}:{account}:log-group:/aws/sagemaker/Endpoints/{endpoint_name}"


def model_error(
    original_status_code: int,
    original_message: str,
    *,
    endpoint_name: str,
    region: str = "us-east-1",
    account: str = DEFAULT_ACCOUNT,
    container: str = PRIMARY_CONTAINER,
    request_id: str | None = None,
) -> HttpReply:
    """424: the container answered ``original_status_code`` with ``original_message``, its
    raw response body (Triton's ``{"error": "..."}``), which AWS passes on as OriginalMessage and
    quotes in Message; worded as AWS words it."""
    kind = "client" if 400 <= original_status_code < 500 else "server"
    group = f"/aws/sagemaker/Endpoints/{endpoint_name}"
    message = (
        f'Received {kind} error ({original_status_code}) from {container} with message "{original_message}". '
        f"See https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#logEventViewer:group={group} "
        f"in account {account} for more information."
    )
    reply = error_reply(
        "ModelError", message, request_id=request_id, OriginalStatusCode=int(original_status_code),
        OriginalMessage=original_message, LogStreamArn=log_stream_arn(endpoint_name, region, account),
    )
    # AWS also sends ErrorCode (not in the service model; botocore ignores it).
    body = {"ErrorCode": "CLIENT_ERROR_FROM_MODEL" if kind == "client" else "INTERNAL_FAILURE_FROM_MODEL", **json.loads(reply.body)}
    return HttpReply(reply.status, reply.headers, json.dumps(body).encode())


def invocation_timed_out(*, endpoint_name: str, region: str = "us-east-1", account: str = DEFAULT_ACCOUNT,
                         container: str = PRIMARY_CONTAINER, request_id: str | None = None) -> HttpReply:
    """424 ModelError with OriginalStatusCode 0: the container did not answer in time (boto3
    does not retry it)."""
    return model_error(0, INVOCATION_TIMEOUT_MESSAGE.format(container=container), endpoint_name=endpoint_name,
                       region=region, account=account, container=container, request_id=request_id)


def reply_for_exception(exc: BaseException, *, request_id: str | None = None) -> HttpReply:
    """Map a serving error (its ``sagemaker_error`` attribute) to its reply; anything else is
    InternalFailure. The message ends by saying whether retrying can help (``retryable``)."""
    code = getattr(exc, "sagemaker_error", "InternalFailure")
    if code not in invoke_endpoint_errors() or code == "ModelError":
        code = "InternalFailure"
    return error_reply(code, with_retry_advice(exc), request_id=request_id)


def invocation_reply(
    body: bytes,
    content_type: str,
    *,
    variant: str = DEFAULT_VARIANT,
    custom_attributes: str | None = None,
    request_id: str | None = None,
) -> HttpReply:
    """200 with the container's body and content type, as InvokeEndpoint returns it."""
    names = _output_header_names()
    headers = [
        (names["ContentType"], content_type),
        (names["InvokedProductionVariant"], variant),
        ("x-amzn-RequestId", _request_id(request_id)),
    ]
    if custom_attributes is not None:
        headers.append((names["CustomAttributes"], custom_attributes))
    return HttpReply(200, tuple(headers), bytes(body))
