"""The local endpoint's front when others can reach it: the warning for a non-loopback address,
``--require-signature`` (SigV4 verified against the key pair given to ``mme serve``, real boto3
clients against a real Triton), and the warning for python-backend models from S3.
All traffic goes to loopback; no test binds another address."""

from __future__ import annotations

import datetime as dt
import io
import shutil
from pathlib import Path

import boto3
import pytest
import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials as BotoCredentials
from botocore.exceptions import ClientError
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from mme.cli import build_parser
from mme.errors import UsageError
from mme.network import is_loopback
from mme.progress import Reporter
from serving.runtime import sigv4_verify as sigv4
from serving.runtime.exposure import open_front_warning, python_backend_models, python_backend_warning
from serving.runtime.local_endpoint import LocalEndpoint, LocalEndpointOptions
from tests.serving.python_models import echo_request, write_echo_model, write_echo_tarball

KEY, SECRET = "AKIDMMESERVETEST", "team-secret/with+chars"
NESTED = "team-a/echo.tar.gz"  # a '/' in TargetModel, a signed header


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "LOCALHOST", "::1", "[::1]"])
def test_loopback_addresses_are_loopback(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "10.0.0.5", "fe80::1", "myhost.example", ""])
def test_other_addresses_are_not_loopback(host):
    assert not is_loopback(host)


def test_open_front_warning_names_the_address_the_risk_and_the_remedies():
    text = open_front_warning("0.0.0.0", 8080)
    assert "0.0.0.0:8080" in text
    assert "anyone who can reach" in text and "invoke" in text and "evict" in text
    assert "--require-signature" in text and "--access-key-id" in text and "--host 127.0.0.1" in text


def _quiet_options(tmp_path: Path, **kwargs) -> LocalEndpointOptions:
    (tmp_path / "m.tar.gz").touch()  # something to serve: mme serve refuses an empty directory
    return LocalEndpointOptions(models=str(tmp_path), port=0, server_kind="local", **kwargs)


def test_a_non_loopback_endpoint_warns_once_when_made_and_a_loopback_one_does_not(tmp_path):
    """The endpoint is only constructed (nothing binds): the warning comes before anything starts."""
    stream = io.StringIO()
    LocalEndpoint(_quiet_options(tmp_path, host="0.0.0.0"), Reporter(stream=stream, quiet=True))
    assert stream.getvalue().count("WARNING: the endpoint listens on 0.0.0.0") == 1
    for host in ("127.0.0.2", "localhost"):
        quiet = io.StringIO()
        LocalEndpoint(_quiet_options(tmp_path, host=host), Reporter(stream=quiet, quiet=True))
        assert "listens on" not in quiet.getvalue()
    signed = io.StringIO()
    LocalEndpoint(_quiet_options(tmp_path, host="0.0.0.0", require_signature=True, access_key_id=KEY,
                                 secret_access_key=SECRET), Reporter(stream=signed, quiet=True))
    assert "listens on" not in signed.getvalue()


def test_require_signature_needs_both_keys_and_excludes_allow_unsigned(tmp_path):
    with pytest.raises(UsageError, match="--access-key-id and --secret-access-key"):
        _quiet_options(tmp_path, require_signature=True, access_key_id=KEY).check()
    with pytest.raises(UsageError, match="contradict"):
        _quiet_options(tmp_path, require_signature=True, access_key_id=KEY, secret_access_key=SECRET,
                       allow_unsigned=True).check()
    assert SECRET not in repr(_quiet_options(tmp_path, require_signature=True, access_key_id=KEY,
                                             secret_access_key=SECRET))


def test_serve_reads_the_key_pair_from_the_environment(monkeypatch):
    monkeypatch.setenv("MME_SERVE_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("MME_SERVE_SECRET_ACCESS_KEY", SECRET)
    args = build_parser().parse_args(["serve", "--models", "m", "--require-signature"])
    assert (args.require_signature, args.access_key_id, args.secret_access_key) == (True, KEY, SECRET)


def test_signature_time_window_is_fifteen_minutes_as_aws():
    creds = sigv4.Credentials(KEY, SECRET)
    header = f"AWS4-HMAC-SHA256 Credential={KEY}/20260101/us-east-1/sagemaker/aws4_request, " \
             "SignedHeaders=host;x-amz-date, Signature=abc"
    now = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
    assert isinstance(sigv4.check_header(header, "20260101T114600Z", {}, creds, now), sigv4.Authorization)
    expired = sigv4.check_header(header, "20260101T114400Z", {}, creds, now)
    assert expired == sigv4.Rejection("InvalidSignatureException", "Signature expired: 20260101T114400Z is now "
                                      "earlier than 20260101T114500Z (20260101T120000Z - 15 min.)")
    ahead = sigv4.check_header(header, "20260101T121600Z", {}, creds, now)
    assert isinstance(ahead, sigv4.Rejection) and ahead.message.startswith("Signature not yet current")
    malformed = sigv4.check_header("AWS4-HMAC-SHA256 SignedHeaders=host, Signature=abc", "20260101T120000Z", {},
                                   creds, now)
    assert isinstance(malformed, sigv4.Rejection) and malformed.code == "IncompleteSignatureException"


@pytest.fixture(scope="module")
def signed_endpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("signed-models")
    write_echo_tarball(root, "echo.tar.gz")
    (root / NESTED).parent.mkdir()
    shutil.copyfile(root / "echo.tar.gz", root / NESTED)
    options = LocalEndpointOptions(models=str(root), port=0, server_kind="local", require_signature=True,
                                   access_key_id=KEY, secret_access_key=SECRET)
    with LocalEndpoint(options, Reporter(stream=io.StringIO(), quiet=True)) as endpoint:
        yield endpoint


def runtime(url: str, key: str = KEY, secret: str = SECRET):
    return boto3.client("sagemaker-runtime", endpoint_url=url, region_name="eu-west-1", aws_access_key_id=key,
                        aws_secret_access_key=secret, config=Config(retries={"total_max_attempts": 1}))


def _invoke(client, target: str = "echo.tar.gz"):
    return client.invoke_endpoint(EndpointName="local", TargetModel=target, ContentType="application/json",
                                  Body=echo_request())


@pytest.mark.integration
def test_requests_signed_with_the_configured_key_are_answered(signed_endpoint):
    client = runtime(signed_endpoint.url)
    for target in ("echo.tar.gz", NESTED):
        reply = _invoke(client, target)
        assert reply["ResponseMetadata"]["HTTPStatusCode"] == 200
        assert b"OUTPUT0" in reply["Body"].read()
    # a signed header with runs of spaces (SigV4 trims them) passes the check: the answer is the endpoint's own
    with pytest.raises(client.exceptions.ValidationError, match="no  such"):
        _invoke(client, "no  such model.tar.gz")
    assert requests.get(f"{signed_endpoint.url}/ping", timeout=10).status_code == 200
    # python-backend models from the user's own directory are not warned about
    assert "python-backend" not in signed_endpoint.reporter.stream.getvalue()


@pytest.mark.integration
def test_a_request_signed_with_another_key_is_refused_as_aws_refuses_it(signed_endpoint):
    with pytest.raises(ClientError) as info:
        _invoke(runtime(signed_endpoint.url, key="AKIDSOMEONEELSE", secret=SECRET))
    error = info.value.response
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert error["Error"] == {"Code": "UnrecognizedClientException", "Message": sigv4.INVALID_TOKEN}


@pytest.mark.integration
def test_the_right_key_with_a_wrong_secret_is_an_invalid_signature(signed_endpoint):
    with pytest.raises(ClientError) as info:
        _invoke(runtime(signed_endpoint.url, secret="not-the-secret"))
    error = info.value.response
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert error["Error"] == {"Code": "InvalidSignatureException", "Message": sigv4.SIGNATURE_MISMATCH}


@pytest.mark.integration
def test_unsigned_requests_still_get_missing_authentication_token(signed_endpoint):
    reply = requests.post(f"{signed_endpoint.url}/endpoints/local/invocations", data=echo_request(), timeout=30,
                          headers={"Content-Type": "application/json", "X-Amzn-SageMaker-Target-Model": "echo.tar.gz"})
    assert reply.status_code == 403
    assert reply.json() == {"message": "Missing Authentication Token"}


def _signed_headers(url: str, body: bytes) -> dict[str, str]:
    request = AWSRequest(method="POST", url=url, data=body, headers={
        "Content-Type": "application/json", "X-Amzn-SageMaker-Target-Model": "echo.tar.gz"})
    SigV4Auth(BotoCredentials(KEY, SECRET), "sagemaker", "eu-west-1").add_auth(request)
    return dict(request.headers.items())


@pytest.mark.integration
def test_the_signature_covers_the_body_and_presigned_urls_are_refused(signed_endpoint):
    url = f"{signed_endpoint.url}/endpoints/local/invocations"
    headers = _signed_headers(url, echo_request())
    assert requests.post(url, data=echo_request(), headers=headers, timeout=30).status_code == 200
    tampered = requests.post(url, data=echo_request((5.0, 6.0)), headers=headers, timeout=30)
    assert tampered.status_code == 403
    assert tampered.headers["x-amzn-ErrorType"].split(":")[0] == "InvalidSignatureException"
    presigned = requests.post(f"{url}?X-Amz-Signature=abc", data=echo_request(), headers=headers, timeout=30)
    assert presigned.status_code == 403 and "presigned" in presigned.json()["message"]


def test_python_backend_models_are_found_in_an_extracted_target(tmp_path):
    write_echo_model(tmp_path / "py", "echo")
    assert python_backend_models(tmp_path / "py") == ("echo",)
    onnx = write_echo_model(tmp_path / "onnx", "net")
    (onnx / "config.pbtxt").write_text(text_format.MessageToString(mc.ModelConfig(backend="onnxruntime")))
    shutil.rmtree(onnx / "1")
    assert python_backend_models(tmp_path / "onnx") == ()


def test_a_python_backend_model_from_s3_is_named_in_a_warning_before_it_first_loads(moto_server, aws_env, tmp_path):
    write_echo_tarball(tmp_path, "echo.tar.gz")
    s3 = boto3.client("s3", endpoint_url=moto_server.endpoint_url, region_name="us-east-1")
    s3.create_bucket(Bucket="team-models")
    s3.upload_file(str(tmp_path / "echo.tar.gz"), "team-models", "shared/echo.tar.gz")
    stream = io.StringIO()
    options = LocalEndpointOptions(models="s3://team-models/shared", port=0, server_kind="local",
                                   s3_endpoint_url=moto_server.endpoint_url, allow_unsigned=True)
    with LocalEndpoint(options, Reporter(stream=stream, quiet=True)) as endpoint:
        client = runtime(endpoint.url)
        for _ in range(2):
            assert _invoke(client)["ResponseMetadata"]["HTTPStatusCode"] == 200
    expected = "WARNING: " + python_backend_warning("echo.tar.gz", "s3://team-models/shared")
    assert stream.getvalue().count(expected) == 1
    assert "its model.py runs as you" in expected and "docker" in expected
