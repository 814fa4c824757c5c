"""serving.runtime.errors_sagemaker: each InvokeEndpoint reply parsed by a real boto3 sagemaker-runtime client."""

from __future__ import annotations

import json
from typing import Iterator

import pytest

from serving.runtime import errors_sagemaker as sm
from mme.archive import CorruptArtifact
from serving.models.store import SourceUnavailable, TargetNotFound
from tests.serving.models.store_helpers import ReplyServer


@pytest.fixture(scope="module")
def server() -> Iterator[ReplyServer]:
    with ReplyServer() as srv:
        yield srv


def _client(server: ReplyServer, retries: int = 1, mode: str = "standard"):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "sagemaker-runtime", endpoint_url=server.url, region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing",
        config=Config(retries={"mode": mode, "total_max_attempts": retries}),
    )


def _invoke(client):
    return client.invoke_endpoint(EndpointName="mme-local", TargetModel="resnet50-v3.tar.gz",
                                  ContentType="application/json", Body=b'{"inputs": []}')


def test_error_codes_come_from_botocores_service_model() -> None:
    assert {code: shape.status for code, shape in sm.invoke_endpoint_errors().items()} == {
        "ValidationError": 400, "ModelError": 424, "ModelNotReadyException": 429,
        "InternalFailure": 500, "ServiceUnavailable": 503, "InternalDependencyException": 530,
    }
    assert set(sm.invoke_endpoint_errors()["ModelError"].members) == {"Message", "OriginalStatusCode", "OriginalMessage", "LogStreamArn"}
    with pytest.raises(ValueError, match="not an InvokeEndpoint error"):
        sm.error_reply("NoSuchThing", "x")
    with pytest.raises(ValueError, match="has no member"):
        sm.error_reply("ValidationError", "x", OriginalStatusCode=400)


@pytest.mark.parametrize("code, build", [
    ("ValidationError", lambda: sm.validation_error("Endpoint mme-local of account 000000000000 not found.")),
    ("ModelNotReadyException", lambda: sm.model_not_ready("Model resnet50-v3.tar.gz is loading; retry shortly.")),
    ("InternalFailure", lambda: sm.internal_failure("An internal failure occurred.")),
    ("ServiceUnavailable", lambda: sm.service_unavailable("The service is unavailable.")),
    ("InternalDependencyException", lambda: sm.internal_dependency("An internal dependency failed.")),
])
def test_boto3_raises_the_modeled_exception(server: ReplyServer, code: str, build) -> None:
    server.reply = reply = build()
    client = _client(server)
    with pytest.raises(getattr(client.exceptions, code)) as info:
        _invoke(client)
    error = info.value.response
    assert error["Error"]["Code"] == code
    assert error["Error"]["Message"] == json.loads(reply.body)["Message"]
    assert error["ResponseMetadata"]["HTTPStatusCode"] == reply.status == sm.invoke_endpoint_errors()[code].status
    assert error["ResponseMetadata"]["RequestId"] == reply.header("x-amzn-RequestId")
    path, headers, _ = server.requests[-1]
    assert path == "/endpoints/mme-local/invocations"
    assert headers["X-Amzn-SageMaker-Target-Model"] == "resnet50-v3.tar.gz"
    assert headers["Authorization"].startswith("AWS4-HMAC-SHA256") and "/sagemaker/aws4_request" in headers["Authorization"]


def test_model_error_carries_the_containers_status_and_message(server: ReplyServer) -> None:
    server.reply = sm.model_error(400, '{"error":"unexpected input shape"}', endpoint_name="mme-local", account="123456789012")
    client = _client(server)
    with pytest.raises(client.exceptions.ModelError) as info:
        _invoke(client)
    response = info.value.response
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 424
    assert response["OriginalStatusCode"] == 400
    assert response["OriginalMessage"] == '{"error":"unexpected input shape"}'
    assert response["LogStreamArn"] == "arn:aws:logs:us-east-1:123456789012:log-group:/aws/sagemaker/Endpoints/mme-local"
    assert response["Error"]["Message"].startswith('Received client error (400) from primary with message "{"error"')
    assert json.loads(server.reply.body)["ErrorCode"] == "CLIENT_ERROR_FROM_MODEL"
    server.reply = sm.model_error(500, "boom", endpoint_name="mme-local")
    with pytest.raises(client.exceptions.ModelError, match=r"Received server error \(500\)") as info:
        _invoke(client)
    assert info.value.response["OriginalStatusCode"] == 500


def test_success_shape(server: ReplyServer) -> None:
    payload = b'{"model_name":"resnet50-v3.tar.gz","outputs":[]}'
    server.reply = sm.invocation_reply(payload, "application/json", custom_attributes="trace=1")
    response = _invoke(_client(server))
    assert response["Body"].read() == payload
    assert response["ContentType"] == "application/json"
    assert response["InvokedProductionVariant"] == "AllTraffic"
    assert response["CustomAttributes"] == "trace=1"
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 200
    binary = "application/vnd.sagemaker-triton.binary+json;json-header-size=42"
    server.reply = sm.invocation_reply(b"\x00" * 100, binary, variant="Variant-2")
    response = _invoke(_client(server))
    assert response["ContentType"] == binary and response["InvokedProductionVariant"] == "Variant-2"
    assert response["Body"].read() == b"\x00" * 100


def test_serving_errors_map_to_their_replies() -> None:
    def code_of(exc: BaseException) -> str:
        return sm.reply_for_exception(exc).header("x-amzn-ErrorType").split(":")[0]

    assert code_of(TargetNotFound("x")) == "ValidationError"
    assert code_of(CorruptArtifact("x")) == "ValidationError"
    assert code_of(SourceUnavailable("x")) == "InternalDependencyException"
    assert code_of(RuntimeError("x")) == "InternalFailure"


@pytest.mark.parametrize("mode, retried", [
    ("standard", {"InternalFailure", "ServiceUnavailable"}),
    ("legacy", {"InternalFailure", "ServiceUnavailable", "ModelNotReadyException"}),  # boto3's default mode
])
def test_boto3_retries_some_errors_by_itself(server: ReplyServer, mode: str, retried: set[str]) -> None:
    """What a load test must know: the client retries these, so the server sees more requests than calls."""
    client = _client(server, retries=2, mode=mode)
    seen = {}
    for code, build in [("ValidationError", sm.validation_error), ("ModelNotReadyException", sm.model_not_ready),
                        ("InternalFailure", sm.internal_failure), ("ServiceUnavailable", sm.service_unavailable),
                        ("InternalDependencyException", sm.internal_dependency)]:
        server.reply = build("x")
        before = len(server.requests)
        with pytest.raises(getattr(client.exceptions, code)):
            _invoke(client)
        seen[code] = len(server.requests) - before
    assert seen == {code: 2 if code in retried else 1 for code in seen}
