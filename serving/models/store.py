"""Where target models come from: a local directory or an S3 prefix, as a SageMaker MME sees them.

A multi-model endpoint is created with one S3 prefix (``s3://bucket/prefix/``); each request
names a *target model*, the object name under that prefix (``resnet50-v3.tar.gz``). A
:class:`ModelSource` lists those objects, reports each one's size and version (S3 ETag, or
the local file's mtime) and opens one to be read as it arrives (or downloads it to a file).

Target names are checked like SageMaker's ``TargetModel`` header (1 to 1,024 printable ASCII
characters, not starting with whitespace) and, because they become paths here, must also be
relative object names without empty, ``.`` or ``..`` segments.

Errors carry the InvokeEndpoint error SageMaker answers with (``sagemaker_error``): a target whose
object cannot be downloaded (no object, no bucket, access denied) is a ValidationError worded as
SageMaker words it (:data:`DOWNLOAD_FAILED_MESSAGE`) with a ``(local: ...)`` hint after it; a source
that cannot be read at all (credentials missing or refused, S3 unreachable, any listing failure)
is an InternalDependencyException saying how to fix it locally.
"""

from __future__ import annotations

import contextlib
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from mme.aws.session import BUCKET_NAME
from mme.errors import MmeError

TARGET_MAX_CHARS = 1024  # botocore sagemaker-runtime: TargetModelHeader max 1024
TRANSFER_CHUNK = 1 << 20  # download() copies this much at a time
_PRINTABLE = re.compile(r"\A[\x21-\x7e][\x20-\x7e]*\Z")  # TargetModelHeader pattern \A\S[\p{Print}]*\z
# S3 error codes that mean the credentials, not the object, are the problem.
_CREDENTIAL_CODES = frozenset({
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "TokenRefreshRequired",
})


class StoreError(MmeError):
    """A target model cannot be named, found or fetched."""

    sagemaker_error = "ValidationError"  # how SageMaker answers InvokeEndpoint for this
    retryable = False  # a name, an object or a permission must be fixed first


class InvalidTargetName(StoreError):
    """The TargetModel value is not a valid object name."""


class ModelDataDownloadFailed(StoreError):
    """The target's object cannot be downloaded: no such object or bucket, or no permission to read it.

    SageMaker answers such an InvokeEndpoint with a ValidationError (400) worded as
    :func:`download_failed_message` words it.
    """


class TargetNotFound(ModelDataDownloadFailed):
    """No object with this name under the source prefix."""


class BucketNotFound(ModelDataDownloadFailed):
    """The bucket of the endpoint's S3 prefix does not exist (asked for one target)."""


class TargetAccessDenied(ModelDataDownloadFailed):
    """The credentials in use may not read the target's object (S3 403 / AccessDenied)."""


class SourceUnavailable(StoreError):
    """The source itself cannot be read (missing directory or bucket, credentials, network).

    Not retryable by default; an instance says so when the cause can pass by itself (S3
    unreachable, an object changed while it was read)."""

    sagemaker_error = "InternalDependencyException"


class ArtifactChanged(SourceUnavailable):
    """The object changed while it was read (a file still being written): retry once it is complete."""

    retryable = True


# What SageMaker's MME says when a target's artifact cannot be downloaded (InvokeEndpoint,
# ValidationError, HTTP 400). Sources, searched for this change:
# - the "(bucket: ..., key: ...)" form of an invoke-time failure, as a ValidationError
#   ("ValidationError: Failed to download model data (bucket: ..., key: .../adapter-name)"):
#   https://github.com/awslabs/ml-container-creator/blob/main/docs/TROUBLESHOOTING.md
# - the sentence that follows it, verbatim as SageMaker words it for CreateEndpoint
#   ("... Please ensure that there is an object located at the URL and that the role passed
#   to CreateModel has permissions to download the object."):
#   https://github.com/aws-solutions-library-samples/fraud-detection-using-machine-learning/issues/9,
#   https://github.com/mlflow/mlflow/issues/2573, https://github.com/aws-samples/cvat-on-aws-china/issues/3
# No capture of the exact invoke-time text was found; the two are joined here without a space
# before "(" as this module always wrote it.
DOWNLOAD_FAILED_MESSAGE = (
    "Failed to download model data(bucket: {bucket}, key: {key}). Please ensure that there is an object "
    "located at the URL and that the role passed to CreateModel has permissions to download the object."
)


def download_failed_message(bucket: str, key: str, local_hint: str = "") -> str:
    """SageMaker's wording for a target whose object cannot be downloaded, then ``(local: hint)`` if given."""
    message = DOWNLOAD_FAILED_MESSAGE.format(bucket=bucket, key=key)
    return f"{message} (local: {local_hint})" if local_hint else message


@dataclass(frozen=True)
class ObjectInfo:
    """One target-model object as the source reports it."""

    target: str
    size: int
    version: str  # changes when the object changes: S3 ETag, or local mtime in ns
    location: str  # s3://bucket/key or a file path, for messages


class ObjectReader:
    """One object read front to back as it arrives (:meth:`ModelSource.open`). ``read_seconds``: time
    spent waiting on the source, opening included (the download's share of a fetch that unpacks as
    bytes come). At the end, ``at_end(bytes read)`` raises a StoreError if the object ended early or
    changed; an error in ``errors`` raised while reading becomes ``failed(error)``."""

    def __init__(self, info: ObjectInfo, raw: BinaryIO, *, at_end: Callable[[int], None],
                 errors: tuple[type[BaseException], ...] = (), failed: Callable[[BaseException], StoreError] | None = None,
                 opened_s: float = 0.0) -> None:
        self.info, self.read_seconds, self.count, self._ended = info, opened_s, 0, False
        self._raw, self._at_end, self._errors, self._failed = raw, at_end, errors, failed

    def read(self, size: int = -1) -> bytes:
        start = time.perf_counter()
        try:
            data = self._raw.read(size)
        except self._errors as exc:
            raise (self._failed(exc) if self._failed else exc) from None
        finally:
            self.read_seconds += time.perf_counter() - start
        self.count += len(data)
        if not data and size != 0 and not self._ended:
            self._ended = True
            self._at_end(self.count)
        return data

    def readable(self) -> bool:
        return True


def validate_target_name(target: Any) -> str:
    """Return ``target`` if it is a valid TargetModel object name, else raise InvalidTargetName."""
    if not isinstance(target, str) or not target:
        raise InvalidTargetName("TargetModel is empty; pass the object name under the endpoint's prefix, e.g. resnet50-v1.tar.gz")
    if len(target) > TARGET_MAX_CHARS:
        raise InvalidTargetName(f"TargetModel has {len(target)} characters, at most {TARGET_MAX_CHARS} are allowed; use a shorter object name")
    if not _PRINTABLE.match(target):
        raise InvalidTargetName(
            f"TargetModel {target!r} must be printable ASCII not starting with whitespace; rename the object"
        )
    if target.startswith("/"):
        raise InvalidTargetName(f"TargetModel {target!r} starts with '/'; give the object name relative to the endpoint's prefix")
    bad = [part for part in target.split("/") if part in ("", ".", "..")]
    if bad:
        raise InvalidTargetName(
            f"TargetModel {target!r} has an empty, '.' or '..' path segment; give a plain object name like dir/model-v1.tar.gz"
        )
    return target


class ModelSource(ABC):
    """Lists and downloads target-model objects. Implementations are safe to share between threads."""

    uri: str

    @abstractmethod
    def list_targets(self) -> tuple[ObjectInfo, ...]:
        """Every object under the source whose name is a valid target, sorted by name."""

    @abstractmethod
    def stat(self, target: str) -> ObjectInfo:
        """Size and version of one object; TargetNotFound when there is none."""

    @abstractmethod
    def open(self, target: str) -> contextlib.AbstractContextManager[ObjectReader]:
        """The object, to be read once as it arrives (one consistent read; nothing is written to
        disk): a context manager giving an :class:`ObjectReader`. The errors of :meth:`stat` when
        it cannot be opened; a StoreError from the reader when it fails or changes while read."""

    def download(self, target: str, dest: Path) -> ObjectInfo:
        """Write the object's bytes to ``dest`` and return what was downloaded (one consistent read)."""
        with self.open(target) as reader, open(dest, "wb") as fh:
            while block := reader.read(TRANSFER_CHUNK):
                fh.write(block)
        return reader.info


class LocalDirSource(ModelSource):
    """Target models are files under a local directory (``<root>/resnet50-v3.tar.gz``)."""

    def __init__(self, root: Path) -> None:
        root = Path(root).expanduser()
        if not root.is_dir():
            raise SourceUnavailable(f"model source directory {root} does not exist; create it or point at the directory holding the .tar.gz files")
        self.root = root.resolve()
        self.uri = str(self.root)

    def _path(self, target: str) -> Path:
        return self.root / validate_target_name(target)

    def _info(self, target: str, path: Path) -> ObjectInfo:
        try:
            st = path.stat()
        except FileNotFoundError:
            raise TargetNotFound(f"no model {target!r} in {self.root}; list the directory for valid target names") from None
        if not path.is_file():
            raise TargetNotFound(f"{path} is not a file; TargetModel must name a .tar.gz file in {self.root}")
        return ObjectInfo(target, st.st_size, str(st.st_mtime_ns), str(path))

    def list_targets(self) -> tuple[ObjectInfo, ...]:
        found = []
        for path in sorted(p for p in self.root.rglob("*") if p.is_file()):
            target = path.relative_to(self.root).as_posix()
            try:
                validate_target_name(target)
            except InvalidTargetName:
                continue
            found.append(self._info(target, path))
        return tuple(found)

    def stat(self, target: str) -> ObjectInfo:
        return self._info(target, self._path(target))

    @contextlib.contextmanager
    def open(self, target: str) -> Iterator[ObjectReader]:
        path = self._path(target)
        before = self._info(target, path)

        def at_end(count: int) -> None:
            try:
                after = self._info(target, path)
            except TargetNotFound:
                after = None
            if after != before or count != before.size:
                raise ArtifactChanged(f"{path} changed while it was read; retry once the file is completely written")

        with open(path, "rb") as fh:
            yield ObjectReader(before, fh, at_end=at_end)


class S3Source(ModelSource):
    """Target models are objects under ``s3://bucket/prefix/`` (credentials: botocore's usual chain)."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None, client: Any = None) -> None:
        if not BUCKET_NAME.match(bucket):
            raise SourceUnavailable(f"{bucket!r} is not a valid S3 bucket name; use 3-63 lowercase letters, digits, '.' and '-'")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.uri = f"s3://{bucket}/{self.prefix}"
        self.endpoint_url = endpoint_url
        self._client = client if client is not None else self._make_client(endpoint_url)

    @staticmethod
    def _make_client(endpoint_url: str | None) -> Any:
        import boto3
        from botocore.config import Config

        config = Config(retries={"mode": "standard", "max_attempts": 3}, max_pool_connections=32)
        return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)

    def _key(self, target: str) -> str:
        return self.prefix + validate_target_name(target)

    def _fail(self, exc: Exception, target: str | None) -> StoreError:
        """Map a botocore error to a StoreError.

        For one target (stat, download) a missing object or bucket or a refusal is SageMaker's
        ValidationError (:class:`ModelDataDownloadFailed`). Missing or refused credentials and an
        unreachable endpoint cannot happen to SageMaker's own role; they stay SourceUnavailable
        with how to fix them locally, as do all failures of list_targets.
        """
        from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

        where = f"{self.uri}{target or ''}"
        if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
            return SourceUnavailable(f"no AWS credentials to read {where}; set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY")
        if not isinstance(exc, ClientError):
            return SourceUnavailable(f"cannot reach S3 for {where} ({type(exc).__name__}: {exc}); check endpoint_url and the network",
                                     retryable=True)
        code = str(exc.response.get("Error", {}).get("Code", ""))
        key = self.prefix + target if target is not None else None
        if key is not None and code in ("403", "404"):  # HeadObject: a bare status, no body to say why
            code = self._error_code_of_get(key) or code
        if code in _CREDENTIAL_CODES:
            return SourceUnavailable(
                f"S3 refused the AWS credentials in use ({code}) reading {where}; refresh them (aws sso login, "
                "a new session token) or set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
            )
        if key is not None:
            if code == "NoSuchBucket":
                return BucketNotFound(download_failed_message(
                    self.bucket, key, f"bucket {self.bucket} does not exist; create it or fix the s3:// URI"))
            if code in ("404", "NoSuchKey", "NotFound"):
                return TargetNotFound(download_failed_message(
                    self.bucket, key, f"no object s3://{self.bucket}/{key}; upload it or fix the TargetModel name"))
            if code in ("403", "AccessDenied"):
                return TargetAccessDenied(download_failed_message(
                    self.bucket, key,
                    f"access denied to s3://{self.bucket}/{key}; grant the credentials in use s3:GetObject on it, "
                    "and s3:ListBucket on the bucket, without which S3 answers 403 for a missing object too",
                ))
        elif code == "NoSuchBucket":
            return SourceUnavailable(f"bucket {self.bucket} does not exist; create it or fix the s3:// URI")
        elif code in ("403", "AccessDenied"):
            return SourceUnavailable(f"access denied reading {where}; grant s3:GetObject and s3:ListBucket on it")
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        return SourceUnavailable(f"S3 error {code} reading {where}: {exc}", retryable=True if status >= 500 else None)

    def _error_code_of_get(self, key: str) -> str | None:
        """The error code a one-byte GetObject of ``key`` answers (NoSuchKey, NoSuchBucket, AccessDenied,
        InvalidAccessKeyId...), to say why a HeadObject failed; None if it succeeds or cannot tell."""
        from botocore.exceptions import ClientError

        try:
            self._client.get_object(Bucket=self.bucket, Key=key, Range="bytes=0-0")["Body"].close()
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            return code if code and code != "InvalidRange" else None  # InvalidRange: an empty object, readable
        except self._errors():
            return None
        return None

    @staticmethod
    def _errors() -> tuple[type[Exception], ...]:
        from botocore.exceptions import BotoCoreError, ClientError

        return (BotoCoreError, ClientError)

    def list_targets(self) -> tuple[ObjectInfo, ...]:
        found = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
            for page in pages:
                for obj in page.get("Contents", ()):
                    target = obj["Key"][len(self.prefix):]
                    try:
                        validate_target_name(target)
                    except InvalidTargetName:
                        continue
                    found.append(ObjectInfo(target, int(obj["Size"]), obj["ETag"].strip('"'), f"s3://{self.bucket}/{obj['Key']}"))
        except self._errors() as exc:
            raise self._fail(exc, None) from None
        return tuple(sorted(found, key=lambda o: o.target))

    def stat(self, target: str) -> ObjectInfo:
        key = self._key(target)
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=key)
        except self._errors() as exc:
            raise self._fail(exc, target) from None
        return ObjectInfo(target, int(head["ContentLength"]), head["ETag"].strip('"'), f"s3://{self.bucket}/{key}")

    @contextlib.contextmanager
    def open(self, target: str) -> Iterator[ObjectReader]:
        key = self._key(target)
        start = time.perf_counter()
        try:
            reply = self._client.get_object(Bucket=self.bucket, Key=key)
        except self._errors() as exc:
            raise self._fail(exc, target) from None
        info = ObjectInfo(target, int(reply["ContentLength"]), reply["ETag"].strip('"'), f"s3://{self.bucket}/{key}")

        def at_end(count: int) -> None:
            if count != info.size:
                raise SourceUnavailable(f"download of {info.location} ended early ({count:,} of {info.size:,} bytes)"
                                        "; retry", retryable=True)

        def failed(exc: BaseException) -> StoreError:
            return SourceUnavailable(f"download of {info.location} failed ({type(exc).__name__}: {exc})", retryable=True)

        body = reply["Body"]
        try:
            yield ObjectReader(info, body, at_end=at_end, errors=(*self._errors(), OSError), failed=failed,
                               opened_s=time.perf_counter() - start)
        finally:
            body.close()


def source_from_uri(uri: str, endpoint_url: str | None = None) -> ModelSource:
    """``s3://bucket/prefix`` -> S3Source; a directory path (or ``file://`` URI) -> LocalDirSource."""
    if uri.startswith("s3://"):
        bucket, _, prefix = uri[len("s3://"):].partition("/")
        return S3Source(bucket, prefix, endpoint_url=endpoint_url)
    if "://" in uri and not uri.startswith("file://"):
        raise SourceUnavailable(f"unsupported model source {uri!r}; use s3://bucket/prefix or a local directory")
    if endpoint_url:
        raise SourceUnavailable(f"endpoint_url {endpoint_url} only applies to s3:// sources, not {uri}")
    return LocalDirSource(Path(uri.removeprefix("file://")))
