"""SageMaker's control-plane wire format (AWS JSON 1.1), read and written from botocore's own
service model for ``sagemaker``, so an unchanged boto3 client parses every reply as it would
AWS's.

A request is ``POST /`` with ``X-Amz-Target: SageMaker.<Operation>`` and a JSON body; its
parameters are checked as SageMaker checks them before any service code runs: botocore's
``ParamValidator`` (required members, types, lengths, ranges) and then each string member's
``pattern`` and ``enum`` from the model, which the client does not check. A reply is JSON with
timestamps as epoch seconds; an error is HTTP 400 with ``{"__type": <code>, "message": ...}``
(botocore's JSON parser reads the code from ``__type``).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

TARGET_PREFIX = "SageMaker."
AMZ_JSON = "application/x-amz-json-1.1"  # the Content-Type of SageMaker's replies


class ApiError(Exception):
    """An error reply: SageMaker's code (``ValidationException``, ``ResourceLimitExceeded``,
    ``ResourceInUse``, ``ResourceNotFound``...) and its message."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


def validation(message: str) -> ApiError:
    return ApiError("ValidationException", message)


@dataclass(frozen=True)
class ApiRequest:
    operation: str
    params: dict[str, Any]
    region: str


@lru_cache(maxsize=None)
def service_model() -> Any:
    import botocore.session

    return botocore.session.get_session().get_service_model("sagemaker")


_SCOPE = re.compile(r"Credential=[^/,\s]+/\d{8}/([a-z0-9-]+)/")


def region_of(authorization: str | None, default: str = "us-east-1") -> str:
    """The region a SigV4 ``Authorization`` header's credential scope names."""
    match = _SCOPE.search(authorization or "")
    return match[1] if match else default


def parse(target: str, body: bytes, authorization: str | None, operations: frozenset[str]) -> ApiRequest:
    """The operation and its checked parameters, or ApiError as SageMaker answers."""
    operation = target[len(TARGET_PREFIX):] if target.startswith(TARGET_PREFIX) else ""
    if operation not in operations:
        raise ApiError("UnknownOperationException",
                       f"{operation or target!r} is not an operation this local control plane answers "
                       f"(it answers: {', '.join(sorted(operations))})")
    try:
        params = json.loads(body or b"{}")
    except ValueError:
        raise ApiError("SerializationException", "the request body is not JSON") from None
    if not isinstance(params, dict):
        raise ApiError("SerializationException", "the request body is not a JSON object")
    shape = service_model().operation_model(operation).input_shape
    check_params(params, shape)
    return ApiRequest(operation, params, region_of(authorization))


def check_params(params: dict, shape: Any) -> None:
    """botocore's own validator, then the patterns and enums it leaves to the service."""
    from botocore.validate import ParamValidator

    report = ParamValidator().validate(_from_wire(params, shape), shape)
    if report.has_errors():
        lines = [line.strip() for line in report.generate_report().splitlines() if line.strip()]
        raise validation(next((line for line in lines if not line.startswith("Parameter validation failed")),
                              "invalid parameters"))
    _check_strings(params, shape, shape.name)


def _from_wire(value: Any, shape: Any) -> Any:
    """JSON's epoch-second timestamps as datetimes, for botocore's validator."""
    if shape is None:
        return value
    if shape.type_name == "structure" and isinstance(value, dict):
        return {k: _from_wire(v, shape.members.get(k)) for k, v in value.items()}
    if shape.type_name == "list" and isinstance(value, list):
        return [_from_wire(v, shape.member) for v in value]
    if shape.type_name == "map" and isinstance(value, dict):
        return {k: _from_wire(v, shape.value) for k, v in value.items()}
    if shape.type_name == "timestamp" and isinstance(value, (int, float)):
        return dt.datetime.fromtimestamp(value, dt.timezone.utc)
    return value


def _check_strings(value: Any, shape: Any, where: str) -> None:
    if shape is None:
        return
    kind = shape.type_name
    if kind == "structure" and isinstance(value, dict):
        for name, member in value.items():
            _check_strings(member, shape.members.get(name), f"{where}.{name}")
    elif kind == "list" and isinstance(value, list):
        for i, member in enumerate(value):
            _check_strings(member, shape.member, f"{where}[{i}]")
    elif kind == "map" and isinstance(value, dict):
        for key, member in value.items():
            _check_strings(key, shape.key, f"{where} key")
            _check_strings(member, shape.value, f"{where}.{key}")
    elif kind == "string" and isinstance(value, str):
        if shape.enum and value not in shape.enum:
            raise validation(f"Value '{value}' at '{where}' failed to satisfy constraint: Member must satisfy enum "
                             f"value set: [{', '.join(shape.enum)}]")
        pattern = shape.metadata.get("pattern")
        compiled = _compiled(pattern) if pattern else None
        if compiled is not None and compiled.fullmatch(value) is None:
            raise validation(f"Value '{value}' at '{where}' failed to satisfy constraint: Member must satisfy "
                             f"regular expression pattern: {pattern}")


@lru_cache(maxsize=None)
def _compiled(pattern: str) -> re.Pattern | None:
    """The model's pattern as a Python regex; None for the Java-only ones (``\\p{...}`` classes),
    which are left unchecked."""
    try:
        return re.compile(pattern)
    except re.error:
        return None


def to_wire(value: Any) -> Any:
    """A reply's values as AWS JSON 1.1 writes them (datetimes as epoch seconds)."""
    if isinstance(value, dt.datetime):
        return value.timestamp()
    if isinstance(value, dict):
        return {k: to_wire(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [to_wire(v) for v in value]
    return value


def reply_body(result: dict[str, Any]) -> bytes:
    return json.dumps(to_wire(result)).encode()


def error_body(error: ApiError) -> bytes:
    return json.dumps({"__type": error.code, "message": error.message}).encode()
