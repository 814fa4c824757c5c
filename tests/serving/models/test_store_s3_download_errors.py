"""A target whose S3 object cannot be downloaded answers as SageMaker does: ValidationError (400),
"Failed to download model data(bucket: B, key: K). Please ensure ...", parsed by a real boto3
client as client.exceptions.ValidationError. Credentials and reachability stay
InternalDependencyException (530) with how to fix them locally.

Against real moto S3 servers: the session's shared one, and one of this module's own with IAM
authorisation switched on (moto's /moto-api/reset-auth) for a genuine AccessDenied.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from serving.runtime import errors_sagemaker as sm
from serving.models.cache import ModelCache
from serving.models.store import (
    DOWNLOAD_FAILED_MESSAGE,
    BucketNotFound,
    ModelDataDownloadFailed,
    S3Source,
    SourceUnavailable,
    TargetAccessDenied,
    TargetNotFound,
)
from mme.errors import with_retry_advice
from tests.conftest import running_moto_server
from tests.serving.models.store_helpers import free_port, invoke_with_reply

BUCKET = "mme-download-errors"


def _expect_validation_error(exc: ModelDataDownloadFailed, bucket: str, key: str) -> None:
    """SageMaker's wording first (with bucket and key), then the local hint; a boto3 ValidationError."""
    message = str(exc)
    assert message.startswith(DOWNLOAD_FAILED_MESSAGE.format(bucket=bucket, key=key) + " (local: "), message
    assert message.startswith(f"Failed to download model data(bucket: {bucket}, key: {key}). Please ensure that "
                              "there is an object located at the URL and that the role passed to CreateModel has "
                              "permissions to download the")
    assert "\n" not in message and message.endswith(")")
    reply = sm.reply_for_exception(exc)
    assert reply.status == 400 and reply.header("x-amzn-ErrorType").split(":")[0] == "ValidationError"
    client, error = invoke_with_reply(reply)
    assert isinstance(error, client.exceptions.ValidationError), error
    assert error.response["Error"]["Code"] == "ValidationError"
    assert error.response["Error"]["Message"] == message[:-1] + "; retrying will not help until this is fixed)"
    assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 400


def _expect_internal_dependency(exc: SourceUnavailable) -> None:
    reply = sm.reply_for_exception(exc)
    assert reply.status == 530
    client, error = invoke_with_reply(reply)
    assert isinstance(error, client.exceptions.InternalDependencyException), error
    assert error.response["Error"]["Message"] == with_retry_advice(exc)
    assert error.response["Error"]["Message"].startswith(str(exc))


@pytest.fixture
def s3(moto_server, aws_env):
    import boto3

    client = boto3.client("s3", endpoint_url=moto_server.endpoint_url)
    if BUCKET not in [b["Name"] for b in client.list_buckets().get("Buckets", [])]:
        client.create_bucket(Bucket=BUCKET)
    yield client
    for obj in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=obj["Key"])


def test_missing_object(s3, moto_server, tmp_path: Path, tiny_tarball: Path) -> None:
    s3.put_object(Bucket=BUCKET, Key="mme/tiny.tar.gz", Body=tiny_tarball.read_bytes())
    source = S3Source(BUCKET, "mme", endpoint_url=moto_server.endpoint_url)
    for call in (lambda: source.stat("nope.tar.gz"), lambda: source.download("nope.tar.gz", tmp_path / "dl")):
        with pytest.raises(TargetNotFound) as info:
            call()
        _expect_validation_error(info.value, BUCKET, "mme/nope.tar.gz")
        assert "(local: no object s3://mme-download-errors/mme/nope.tar.gz; upload it" in str(info.value)
    # through the cache, with and without a disk limit (which asks the object's size first)
    for limit in (None, 1 << 30):
        cache = ModelCache(tmp_path / f"cache-{limit}", source, disk_limit_bytes=limit)
        with pytest.raises(TargetNotFound, match=r"^Failed to download model data\(bucket: mme-download-errors, "):
            cache.fetch("sub/nope.tar.gz")
        assert cache.entries() == () and list(cache.root.iterdir()) == [] and cache.stats.failures == 1
        assert cache.fetch("tiny.tar.gz").model_dir.is_dir()


def test_missing_bucket(moto_server, aws_env, tmp_path: Path) -> None:
    source = S3Source("no-such-bucket-mme", "prod/models", endpoint_url=moto_server.endpoint_url)
    # HeadObject's 404 has no body: the cache asks again with a one-byte GetObject to tell the bucket is missing
    for call in (lambda: source.stat("a.tar.gz"), lambda: source.download("a.tar.gz", tmp_path / "dl")):
        with pytest.raises(BucketNotFound) as info:
            call()
        _expect_validation_error(info.value, "no-such-bucket-mme", "prod/models/a.tar.gz")
        assert "(local: bucket no-such-bucket-mme does not exist; create it or fix the s3:// URI)" in str(info.value)
    # listing is not about one target: unchanged
    with pytest.raises(SourceUnavailable, match="bucket no-such-bucket-mme does not exist") as listed:
        source.list_targets()
    _expect_internal_dependency(listed.value)


def test_missing_credentials_stay_internal_dependency(moto_server, aws_env, monkeypatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    source = S3Source(BUCKET, "mme", endpoint_url=moto_server.endpoint_url)
    expected = r"^no AWS credentials to read s3://mme-download-errors/mme/a\.tar\.gz; set AWS_PROFILE"
    with pytest.raises(SourceUnavailable, match=expected) as info:
        source.stat("a.tar.gz")
    _expect_internal_dependency(info.value)


def test_unreachable_endpoint_stays_internal_dependency(aws_env) -> None:
    source = S3Source(BUCKET, "mme", endpoint_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(SourceUnavailable, match="cannot reach S3") as info:
        source.stat("a.tar.gz")
    _expect_internal_dependency(info.value)


# -- a moto server that checks IAM policies --------------------------------------------------


@dataclass(frozen=True)
class LockedS3:
    endpoint_url: str
    reader_key: tuple[str, str]  # may list the bucket, may not read objects


def _post(url: str, body: bytes) -> None:
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "text/plain"})
    urllib.request.urlopen(request, timeout=10).close()


@pytest.fixture(scope="module")
def locked_s3() -> Iterator[LockedS3]:
    """Its own moto server (auth is server-wide): a bucket with one object, an IAM user allowed only
    s3:ListBucket, then authorisation switched on for every later request."""
    import boto3

    with running_moto_server() as url:
        admin = {"endpoint_url": url, "region_name": "us-east-1", "aws_access_key_id": "admin", "aws_secret_access_key": "admin"}
        s3 = boto3.client("s3", **admin)
        s3.create_bucket(Bucket="locked-models")
        s3.put_object(Bucket="locked-models", Key="mme/secret.tar.gz", Body=b"\x1f\x8b not really")
        iam = boto3.client("iam", **admin)
        iam.create_user(UserName="reader")
        iam.put_user_policy(UserName="reader", PolicyName="list-only", PolicyDocument=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::locked-models"}],
        }))
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        _post(f"{url}/moto-api/reset-auth", b"0")  # from now on every request is authorised against IAM
        yield LockedS3(url, (key["AccessKeyId"], key["SecretAccessKey"]))


def _locked_source(locked_s3: LockedS3, key_id: str, secret: str) -> S3Source:
    import boto3

    client = boto3.client("s3", endpoint_url=locked_s3.endpoint_url, region_name="us-east-1",
                          aws_access_key_id=key_id, aws_secret_access_key=secret)
    return S3Source("locked-models", "mme", client=client)


def test_access_denied(locked_s3: LockedS3, tmp_path: Path) -> None:
    source = _locked_source(locked_s3, *locked_s3.reader_key)
    # the credentials are good (listing works); reading the object is not allowed
    assert [o.target for o in source.list_targets()] == ["secret.tar.gz"]
    for call in (lambda: source.stat("secret.tar.gz"), lambda: source.download("secret.tar.gz", tmp_path / "dl")):
        with pytest.raises(TargetAccessDenied) as info:
            call()
        _expect_validation_error(info.value, "locked-models", "mme/secret.tar.gz")
        hint = "(local: access denied to s3://locked-models/mme/secret.tar.gz; grant the credentials in use s3:GetObject"
        assert hint in str(info.value)
    cache = ModelCache(tmp_path / "cache", source)
    with pytest.raises(TargetAccessDenied):
        cache.fetch("secret.tar.gz")
    assert list(cache.root.iterdir()) == []


def test_refused_credentials_stay_internal_dependency(locked_s3: LockedS3) -> None:
    source = _locked_source(locked_s3, "AKIAUNKNOWNKEY000000", "not-a-secret")
    with pytest.raises(SourceUnavailable, match=r"S3 refused the AWS credentials in use \(InvalidAccessKeyId\)") as info:
        source.stat("secret.tar.gz")  # a bodyless 403 to HeadObject: asked again with GetObject to tell why
    _expect_internal_dependency(info.value)


# -- an S3 whose object's body ends early --------------------------------------------------------


class _ShortBodyHandler(BaseHTTPRequestHandler):
    """Answers every GET with the whole tarball's Content-Length and ETag, then half its bytes,
    and closes the connection: a download cut off mid-object."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        data: bytes = self.server.data  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", '"0123456789abcdef"')
        self.send_header("Content-Type", "application/x-gzip")
        self.end_headers()
        self.wfile.write(data[: len(data) // 2])
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_download_cut_off_mid_object_is_retryable_and_leaves_nothing(aws_env, tmp_path: Path, tiny_tarball: Path) -> None:
    """The object streams into the extraction as it arrives: a body that ends early is a
    retryable SourceUnavailable (InternalDependencyException), not a corrupt model, and the
    cache keeps nothing of it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ShortBodyHandler)
    server.data = tiny_tarball.read_bytes()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        source = S3Source(BUCKET, "mme", endpoint_url=f"http://127.0.0.1:{server.server_address[1]}")
        cache = ModelCache(tmp_path / "cache", source, revalidate=False)
        with pytest.raises(SourceUnavailable, match=r"download of s3://mme-download-errors/mme/tiny\.tar\.gz") as info:
            cache.fetch("tiny.tar.gz")
    finally:
        server.shutdown()
        server.server_close()
    assert info.value.retryable is True
    _expect_internal_dependency(info.value)
    assert cache.entries() == () and list((tmp_path / "cache").iterdir()) == []
