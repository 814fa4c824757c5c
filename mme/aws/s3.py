"""S3 object transfers shared by the cloud steps (``mme push``, ``mme compile --on sagemaker``,
``mme capacity --endpoint``): HEAD and match by size + sha256 metadata, upload (multipart
above a threshold, with a progress line), server-side copy, verify after write.

A multipart upload that fails or is interrupted is aborted: S3 shows an object only once
its upload completes, so nothing half-written is ever visible and no pending parts are
left to pay for.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from mme.aws.errors import S3Error, VerificationError
from mme.aws.session import aws_errors, error_code, s3_fail
from mme.progress import Reporter

SHA_KEY = "sha256"  # S3 user metadata: x-amz-meta-sha256
CONTENT_TYPE = "application/gzip"
MIB = 1 << 20


@dataclass(frozen=True)
class TransferSettings:
    multipart_threshold: int = 64 * MIB
    multipart_chunksize: int = 64 * MIB
    max_concurrency: int = 4

    def config(self) -> Any:
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(
            multipart_threshold=self.multipart_threshold,
            multipart_chunksize=self.multipart_chunksize,
            max_concurrency=self.max_concurrency,
            use_threads=True,
            preferred_transfer_client="classic",
        )


@dataclass(frozen=True)
class TransferHooks:
    """Test seams: ``on_progress(key, bytes_so_far)`` runs in transfer threads (raising there
    fails the upload); ``after_write(key)`` runs after each write, before it is verified."""

    on_progress: Callable[[str, int], None] | None = None
    after_write: Callable[[str], None] | None = None


def head(s3: Any, bucket: str, key: str) -> dict | None:
    """HEAD an object; None when there is none."""
    try:
        return s3.head_object(Bucket=bucket, Key=key)
    except aws_errors() as exc:
        if error_code(exc) in ("404", "NoSuchKey", "NotFound"):
            return None
        if error_code(exc) in ("403", "AccessDenied"):
            raise S3Error(
                f"access denied reading s3://{bucket}/{key}; grant s3:GetObject and s3:ListBucket on the prefix "
                "(without ListBucket S3 answers 403 for objects that do not exist)"
            ) from None
        raise s3_fail(exc, "read", f"s3://{bucket}/{key}", "s3:GetObject") from None


def matches(reply: dict | None, sha256: str, size: int) -> bool:
    if reply is None:
        return False
    return int(reply.get("ContentLength", -1)) == size and reply.get("Metadata", {}).get(SHA_KEY) == sha256


class _Progress:
    """Progress line for large uploads (every 10% or 5 s), plus the test hook."""

    def __init__(self, key: str, total: int, reporter: Reporter, show: bool, hook: Callable[[str, int], None] | None) -> None:
        self.key, self.total, self.reporter, self.show, self.hook = key, total, reporter, show, hook
        self.done = 0
        self.start = time.monotonic()
        self.last_print = self.start
        self.next_fraction = 0.1
        self.lock = threading.Lock()

    def __call__(self, amount: int) -> None:
        with self.lock:
            self.done += amount
            done = self.done
            now = time.monotonic()
            due = self.show and (done >= self.next_fraction * self.total or now - self.last_print >= 5) and done < self.total
            if due:
                while self.next_fraction * self.total <= done:
                    self.next_fraction += 0.1
                self.last_print = now
        if due:
            rate = done / max(now - self.start, 1e-6) / MIB
            self.reporter.info(
                f"  uploading {self.key}: {100 * done / self.total:.0f}% ({done / MIB:.1f} of {self.total / MIB:.1f} MiB, {rate:.1f} MiB/s)"
            )
        if self.hook is not None:
            self.hook(self.key, done)


def _abort_pending(s3: Any, bucket: str, key: str, since: float) -> int:
    """Abort multipart uploads of ``key`` started by this push (belt and braces after s3transfer's own abort)."""
    aborted = 0
    try:
        reply = s3.list_multipart_uploads(Bucket=bucket, Prefix=key)
        for upload in reply.get("Uploads", ()):
            initiated = upload.get("Initiated")
            if upload.get("Key") != key or (initiated is not None and initiated.timestamp() < since - 300):
                continue
            s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload["UploadId"])
            aborted += 1
    except aws_errors():
        return aborted  # the lifecycle rule AbortIncompleteMultipartUpload is the last resort; the error that got us here matters more
    return aborted


def upload_file(s3: Any, path: Path, bucket: str, key: str, metadata: dict[str, str], settings: TransferSettings,
                reporter: Reporter, hooks: TransferHooks = TransferHooks()) -> None:
    """Upload ``path`` to ``bucket/key``; on any failure or Ctrl-C no object and no pending upload remain."""
    from boto3.s3.transfer import create_transfer_manager

    size = path.stat().st_size
    progress = _Progress(key, size, reporter, size >= settings.multipart_threshold, hooks.on_progress)
    started = time.time()
    try:
        from s3transfer.subscribers import BaseSubscriber

        class _Subscriber(BaseSubscriber):
            def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
                progress(bytes_transferred)

        with create_transfer_manager(s3, settings.config()) as manager:
            future = manager.upload(
                str(path), bucket, key, extra_args={"Metadata": metadata, "ContentType": CONTENT_TYPE},
                subscribers=[_Subscriber()],
            )
            future.result()
    except BaseException as exc:
        _abort_pending(s3, bucket, key, started)
        if isinstance(exc, aws_errors()):
            raise s3_fail(exc, "upload to", f"s3://{bucket}/{key}", "s3:PutObject") from None
        if isinstance(exc, Exception) and type(exc).__module__.startswith(("s3transfer", "boto3")):
            raise S3Error(f"upload to s3://{bucket}/{key} failed ({exc}); nothing was left behind: retry the command") from None
        raise


def copy_object(s3: Any, bucket: str, source_key: str, key: str, source_etag: str | None, metadata: dict[str, str],
                settings: TransferSettings) -> None:
    """Server-side copy (CopyObject, or UploadPartCopy above the multipart threshold): no bytes pass through here."""
    from boto3.s3.transfer import create_transfer_manager

    extra = {"Metadata": metadata, "MetadataDirective": "REPLACE", "ContentType": CONTENT_TYPE}
    if source_etag:
        extra["CopySourceIfMatch"] = source_etag  # copy exactly the object that was verified
    started = time.time()
    try:
        with create_transfer_manager(s3, settings.config()) as manager:
            manager.copy({"Bucket": bucket, "Key": source_key}, bucket, key, extra_args=extra).result()
    except BaseException as exc:
        _abort_pending(s3, bucket, key, started)
        if isinstance(exc, aws_errors()):
            if error_code(exc) in ("PreconditionFailed", "412"):
                raise VerificationError(
                    f"s3://{bucket}/{source_key} changed while its copies were made; something else writes to this prefix: re-run 'mme push'"
                ) from None
            raise s3_fail(exc, "copy to", f"s3://{bucket}/{key}", "s3:GetObject and s3:PutObject") from None
        raise


def verify(s3: Any, bucket: str, key: str, sha256: str, size: int) -> dict:
    reply = head(s3, bucket, key)
    if reply is None:
        raise VerificationError(f"s3://{bucket}/{key} is missing right after it was written; something deletes from this prefix: re-run 'mme push'")
    got_size = int(reply.get("ContentLength", -1))
    got_sha = reply.get("Metadata", {}).get(SHA_KEY)
    if got_size != size or got_sha != sha256:
        raise VerificationError(
            f"s3://{bucket}/{key} does not match what was written (size {got_size} vs {size}, sha256 metadata "
            f"{(got_sha or 'missing')[:12]} vs {sha256[:12]}); another writer changed it: re-run 'mme push' to rewrite it"
        )
    return reply
