"""The fast client's requests are SigV4-signed exactly as botocore signs them: checked by
re-signing with an unmodified botocore SigV4Auth, in process and on what reached the server."""

from __future__ import annotations

import pytest

import datetime
import re
from unittest import mock

import botocore.auth
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from bench.client import CachedSigV4Auth, reply_error_code
from tests.bench.fake_endpoint import FakeEndpoint
from tests.bench.helpers import ACCESS_KEY, SECRET_KEY, run_bench, saved_run

AUTH = re.compile(r"^AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<day>\d{8})/(?P<region>[a-z0-9-]+)/sagemaker/aws4_request, "
                  r"SignedHeaders=(?P<signed>[a-z0-9;-]+), Signature=(?P<sig>[0-9a-f]{64})$")
NOW = datetime.datetime(2026, 12, 2, 13, 5, 1, tzinfo=datetime.timezone.utc)

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def botocore_authorization(url: str, headers: dict, body: bytes, credentials, region: str, when) -> str:
    request = AWSRequest(method="POST", url=url, data=body, headers=headers)
    with mock.patch.object(botocore.auth, "get_current_datetime", return_value=when):
        SigV4Auth(credentials, "sagemaker", region).add_auth(request)
    return request.headers["Authorization"]


def test_cached_signer_equals_botocore_for_repeated_requests():
    credentials = Credentials("AKIDEXAMPLE", "secret", token="session-token")
    signer = CachedSigV4Auth(credentials, "sagemaker", "eu-west-1")
    url = "http://127.0.0.1:8080/endpoints/my-mme/invocations"
    body = b'{"inputs": []}'
    for target in ("resnet50-v1.tar.gz", "resnet50-v7.tar.gz", "resnet50-v1.tar.gz"):  # cached paths on repeats
        headers = {"Content-Type": "application/json", "Accept": "*/*", "X-Amzn-SageMaker-Target-Model": target}
        want = botocore_authorization(url, dict(headers), body, credentials, "eu-west-1", NOW)
        with mock.patch.object(botocore.auth, "get_current_datetime", return_value=NOW):
            signer.sign("POST", url, headers, body)
        assert headers["Authorization"] == want
        assert headers["X-Amz-Date"] == "20261202T130501Z"
        assert headers["X-Amz-Security-Token"] == "session-token"
        assert "x-amzn-sagemaker-target-model" in AUTH.match(want)["signed"].split(";")


def test_requests_on_the_wire_carry_a_valid_signature(tmp_path):
    with FakeEndpoint() as endpoint:
        run = saved_run(run_bench("--endpoint", "my-mme", "--endpoint-url", endpoint.url, "--region", "eu-west-1",
                                  "--mode", "single", "--shape", "constant", "--users", "2", "--duration", "1.5",
                                  "--out", str(tmp_path)))
        seen = list(endpoint.state.headers)
    assert run.info.client == "fast" and len(run.requests) > 3 and len(seen) >= len(run.requests)
    credentials = Credentials(ACCESS_KEY, SECRET_KEY)
    for headers in seen[:5]:
        lower = {k.lower(): v for k, v in headers.items()}
        match = AUTH.match(lower["authorization"])
        assert match, lower["authorization"]
        assert match["key"] == ACCESS_KEY and match["region"] == "eu-west-1"
        assert re.fullmatch(r"\d{8}T\d{6}Z", lower["x-amz-date"]) and match["day"] == lower["x-amz-date"][:8]
        signed = match["signed"].split(";")
        assert {"content-type", "host", "x-amz-date"} <= set(signed)
        assert "x-amzn-sagemaker-target-model" not in lower  # single-model: no TargetModel
        when = datetime.datetime.strptime(lower["x-amz-date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)
        url = f"{endpoint.url}/endpoints/my-mme/invocations"
        resigned = botocore_authorization(url, {name: lower[name] for name in signed}, b'{"inputs": "I am super happy right now."}',
                                          credentials, "eu-west-1", when)
        assert resigned == lower["authorization"]


def test_error_codes_are_read_like_botocore():
    assert reply_error_code(424, {"x-amzn-ErrorType": "ModelError:http://internal.amazon.com/coral/"}.get, b"") == "ModelError"
    assert reply_error_code(400, {}.get, b'{"__type": "com.amazon#ValidationError", "message": "x"}') == "ValidationError"
    assert reply_error_code(502, {}.get, b"<html>bad gateway</html>") == "502"
