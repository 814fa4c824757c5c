"""Sessions, clients, S3 URIs and error wording shared by the cloud commands.

Credentials come from botocore's usual chain (environment, profile, instance role); they
are checked for presence and never printed or written. Service-model facts (instance types,
name and ARN patterns, regions) are read from the installed botocore, so they follow the
SDK version without a hand-kept copy.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from mme.aws.errors import AwsError, CredentialsError, S3Error

RETRIES = {"mode": "standard", "max_attempts": 5}
TAGS = ({"Key": "created-by", "Value": "mme-toolkit"},)  # on every resource the cloud steps create
BUCKET_NAME = re.compile(r"\A[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")  # S3's rule: 3-63 lowercase letters, digits, '.', '-'


@dataclass(frozen=True)
class S3Uri:
    """``s3://bucket/prefix/`` (prefix is empty or ends with ``/``) or, with ``key``, one object."""

    bucket: str
    prefix: str = ""

    @classmethod
    def parse(cls, text: str, option: str = "--s3") -> "S3Uri":
        if not isinstance(text, str) or not text.startswith("s3://"):
            raise S3Error(f"{option} {text!r} is not an S3 URI; write it as s3://bucket/prefix")
        bucket, _, rest = text[len("s3://"):].partition("/")
        if not BUCKET_NAME.match(bucket):
            raise S3Error(f"{option}: {bucket!r} is not a valid S3 bucket name; use 3-63 lowercase letters, digits, '.' and '-'")
        rest = rest.strip("/")
        if rest and any(part in ("", ".", "..") for part in rest.split("/")):
            raise S3Error(f"{option} {text!r} has an empty, '.' or '..' path segment; write s3://bucket/dir/subdir")
        return cls(bucket, rest + "/" if rest else "")

    def key(self, name: str) -> str:
        return self.prefix + name

    def url(self, key: str | None = None) -> str:
        return f"s3://{self.bucket}/{self.prefix if key is None else key}"

    def __str__(self) -> str:
        return self.url()


def boto3_session(region: str | None = None) -> Any:
    import boto3
    from botocore.exceptions import BotoCoreError

    try:
        return boto3.session.Session(region_name=region)
    except BotoCoreError as exc:  # e.g. ProfileNotFound for a bad AWS_PROFILE
        raise CredentialsError(f"cannot set up an AWS session: {exc}; fix AWS_PROFILE or the AWS config file") from None


def require_region(session: Any, option: str = "--region") -> str:
    region = session.region_name
    if not region:
        raise CredentialsError(f"no AWS region configured; pass {option} (e.g. us-east-1) or set AWS_REGION")
    known = set()
    for partition in session.get_available_partitions():
        known.update(session.get_available_regions("sagemaker", partition_name=partition))
    if known and region not in known:
        close = difflib.get_close_matches(region, sorted(known), n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; SageMaker regions: {', '.join(sorted(known))}"
        raise CredentialsError(f"{option} {region!r} is not a region where SageMaker runs{hint}")
    return region


def require_credentials(session: Any) -> None:
    """Raise a clear error when botocore finds no credentials (their values are never read out)."""
    from botocore.exceptions import BotoCoreError

    try:
        credentials = session.get_credentials()
    except BotoCoreError as exc:
        raise CredentialsError(f"cannot load AWS credentials ({type(exc).__name__}); fix the profile or credential source") from None
    if credentials is None:
        raise CredentialsError(
            "no AWS credentials found; set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or run on a host with an IAM role"
        )


def client(session: Any, service: str, endpoint_url: str | None = None) -> Any:
    from botocore.config import Config

    config = Config(retries=dict(RETRIES), max_pool_connections=16)
    return session.client(service, endpoint_url=endpoint_url, config=config)


@dataclass(frozen=True)
class AwsSession:
    """A checked boto3 session: its region ("" only when none was needed and none is
    configured) and clients with the toolkit's retry settings."""

    session: Any
    region: str

    def client(self, service: str, endpoint_url: str | None = None) -> Any:
        return client(self.session, service, endpoint_url)


def connect(region: str | None = None, *, need_region: bool = True, need_credentials: bool = True,
            local_endpoint_url: str | None = None) -> AwsSession:
    """The one preamble of every cloud command: a session for ``region`` (default: botocore's
    chain), the region checked to be one where SageMaker runs, credentials present.

    With ``local_endpoint_url`` (a local stand-in for the endpoint) no region is required: one
    is only needed to sign, and us-east-1 serves when none is configured.
    """
    session = boto3_session(region)
    if local_endpoint_url is not None:
        if session.region_name is None:
            session = boto3_session("us-east-1")  # a local endpoint: any region signs
    elif need_region:
        require_region(session)
    if need_credentials:
        require_credentials(session)
    return AwsSession(session, session.region_name or "")


# --- botocore's service model ---------------------------------------------------------


@lru_cache(maxsize=None)
def _service_model(service: str) -> Any:
    import botocore.session

    return botocore.session.get_session().get_service_model(service)


def enum_values(shape: str, service: str = "sagemaker") -> tuple[str, ...]:
    return tuple(_service_model(service).shape_for(shape).enum)


def shape_pattern(shape: str, service: str = "sagemaker") -> tuple[str, int, int]:
    meta = _service_model(service).shape_for(shape).metadata
    return meta.get("pattern", ".*"), int(meta.get("min", 0)), int(meta.get("max", 1 << 20))


def matches_shape(value: str, shape: str, service: str = "sagemaker") -> bool:
    pattern, low, high = shape_pattern(shape, service)
    return low <= len(value) <= high and re.fullmatch(pattern, value) is not None


def check_instance_type(instance_type: str, shape: str, option: str, use: str) -> str:
    known = enum_values(shape)
    if instance_type in known:
        return instance_type
    close = difflib.get_close_matches(instance_type, known, n=3)
    hint = f"did you mean {' or '.join(close)}?" if close else "use a type like ml.g5.2xlarge"
    raise AwsError(
        f"{option} {instance_type!r} is not an instance type SageMaker knows for {use}; {hint}"
    )


def check_role_arn(role: str, option: str = "--role") -> str:
    if not matches_shape(role, "RoleArn"):
        raise AwsError(
            f"{option} {role!r} is not an IAM role ARN; pass the SageMaker execution role as arn:aws:iam::<12-digit account>:role/<name>"
        )
    return role


# --- errors ---------------------------------------------------------------------------


def error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def error_message(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Message", "")) or str(exc)


def is_not_found(exc: BaseException) -> bool:
    """SageMaker says 'Could not find ...' (ValidationException); S3 says 404 / NoSuchKey."""
    code = error_code(exc)
    if code in ("404", "NoSuchKey", "NotFound", "NoSuchBucket", "ResourceNotFound", "NoSuchUpload"):
        return True
    message = error_message(exc).lower()
    return code in ("ValidationException", "ValidationError") and ("could not find" in message or "not found" in message)


def aws_errors() -> tuple[type[BaseException], ...]:
    from botocore.exceptions import BotoCoreError, ClientError

    return (BotoCoreError, ClientError)


def explain(exc: BaseException, action: str, what: str, permission: str) -> str:
    """One line for a failed AWS call: what was being done, why it failed, how to fix it."""
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError, NoRegionError

    if isinstance(exc, NoCredentialsError):
        return f"no AWS credentials to {action} {what}; set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
    if isinstance(exc, NoRegionError):
        return f"no AWS region to {action} {what}; pass --region or set AWS_REGION"
    if isinstance(exc, EndpointConnectionError):
        return f"cannot reach AWS to {action} {what} ({exc}); check the network or the endpoint URL"
    if isinstance(exc, ClientError):
        code = error_code(exc)
        if code in ("403", "AccessDenied", "AccessDeniedException", "Forbidden"):
            return f"access denied to {action} {what}; grant {permission} to these credentials"
        if code in ("ExpiredToken", "ExpiredTokenException", "InvalidClientTokenId", "SignatureDoesNotMatch", "UnrecognizedClientException"):
            return f"AWS rejected the credentials ({code}) trying to {action} {what}; refresh them (e.g. aws sso login) and retry"
        return f"AWS {code} trying to {action} {what}: {error_message(exc)}"
    return f"AWS request failed trying to {action} {what}: {type(exc).__name__}: {exc}"


def s3_fail(exc: BaseException, action: str, uri: str, permission: str) -> S3Error:
    return S3Error(explain(exc, action, uri, permission))


def check_bucket(s3: Any, bucket: str, region: str | None = None) -> None:
    """The bucket exists and these credentials may use it; in ``region`` when one is given."""
    try:
        reply = s3.head_bucket(Bucket=bucket)
    except aws_errors() as exc:
        code = error_code(exc)
        if code in ("404", "NoSuchBucket", "NotFound"):
            raise S3Error(f"bucket {bucket} does not exist; create it (aws s3 mb s3://{bucket}) or fix the s3:// URI") from None
        if code in ("403", "AccessDenied", "Forbidden"):
            raise S3Error(
                f"bucket {bucket} exists but these credentials cannot use it (403): it belongs to another account "
                "or lacks s3:ListBucket for you; use a bucket of your own account"
            ) from None
        raise s3_fail(exc, "read", f"s3://{bucket}", "s3:ListBucket") from None
    bucket_region = reply.get("BucketRegion") or reply.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("x-amz-bucket-region")
    if region and bucket_region and bucket_region != region:
        raise S3Error(
            f"bucket {bucket} is in {bucket_region} but the endpoint region is {region}; SageMaker reads model data "
            f"from its own region: pass --region {bucket_region} or use a bucket in {region}"
        )
