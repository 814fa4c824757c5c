"""``mme push``: put an artifact's MME tarball and its copies under an S3 prefix.

The tarball is uploaded once (multipart above a threshold, with a progress line); the
copies ``<name>-v1..vN.tar.gz`` (named like ``serving.copies``) are made by server-side
copy, so no byte is sent twice. Each object carries the tarball's sha256 in its metadata
(``x-amz-meta-sha256``): an object whose size and sha256 already match is skipped, so a
second push writes nothing and a changed artifact re-uploads. Every write is checked
afterwards (HEAD: size and metadata). A multipart upload that fails or is interrupted is
aborted: S3 shows an object only once its upload completes, so nothing half-written is
ever visible, and no pending parts are left to pay for.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from mme.fsutil import sha256_of
from mme.progress import Reporter
from mme.versions import release as triton_release, require_sagemaker_image
from mme.aws.errors import AwsError, RandomWeightsRefused, S3Error, VerificationError
from mme.aws.session import S3Uri, aws_errors, check_bucket, error_code, s3_fail
from serving.copies import _COPY, copy_name

SHA_KEY = "sha256"  # S3 user metadata: x-amz-meta-sha256
CONTENT_TYPE = "application/gzip"
MIB = 1 << 20


@dataclass(frozen=True)
class Artifact:
    """The parts of a packaged artifact that a push needs."""

    directory: Path
    model: str
    format: str
    weights: str
    triton_release: str
    tarball: Path
    sha256: str
    size: int
    tensorrt: str | None = None  # engines only: the TensorRT they were built with
    engine: dict[str, str] = field(default_factory=dict)  # engines only: S3 metadata of EngineFacts
    image_uri: str | None = None  # the image it will be served with, when not AWS's

    def metadata(self, copy_of: str | None = None) -> dict[str, str]:
        """x-amz-meta-* of each object: what `mme deploy` checks against the endpoint it creates."""
        meta = {
            SHA_KEY: self.sha256,
            "mme-model": self.model,
            "mme-format": self.format,
            "mme-weights": self.weights,
            "mme-triton-release": self.triton_release,
            **self.engine,
        }
        if self.image_uri:
            meta["mme-image-uri"] = self.image_uri
        if copy_of:
            meta["mme-copy-of"] = copy_of
        return meta


def engine_metadata(facts) -> dict[str, str]:
    """The engine facts of a manifest as S3 metadata (read back by EngineFacts.from_s3_metadata)."""
    if not facts.has_engine:
        return {}
    fields = {"mme-tensorrt": facts.tensorrt, "mme-torch-tensorrt": facts.torch_tensorrt,
              "mme-torch-tensorrt-abi": facts.torch_tensorrt_abi, "mme-torch": facts.torch,
              "mme-compute-capability": facts.compute_capability,
              "mme-hardware-compatibility": facts.hardware_compatibility}
    return {key: value for key, value in fields.items() if value}


def load_artifact(directory: Path, allow_random_weights: bool = False, reporter: Reporter | None = None, *,
                  instance_type: str | None = None, image_uri: str | None = None) -> Artifact:
    """Read the manifest, refuse random weights unless allowed, check the tarball is the packaged
    one, and that its engine (if any) loads in its release and on ``instance_type``'s GPU."""
    from packager.compat import EngineFacts, check_artifact, compat_warnings
    from packager.manifest import Manifest

    directory = Path(directory)
    if not directory.is_dir():
        raise AwsError(f"artifact directory {directory} does not exist; pass artifacts/<model>/<format> made by 'mme package'")
    manifest = Manifest.load(directory)
    weights = manifest.source.weights
    if weights == "random":
        if not allow_random_weights:
            raise RandomWeightsRefused(
                f"{directory} was packaged with random weights (manifest source.weights = random): its outputs are "
                "meaningless; package with pretrained or --weights, or pass --allow-random-weights for a load test"
            )
        if reporter is not None:
            reporter.warn(f"{directory} has random weights (allowed by --allow-random-weights): fine for load tests only")
    tarball = directory / manifest.tarball
    if not tarball.is_file():
        raise AwsError(f"{tarball} is missing; re-run 'mme package' for this artifact")
    recorded = {entry.path: entry for entry in manifest.files}.get(manifest.tarball)
    size = tarball.stat().st_size
    sha = sha256_of(tarball)
    if recorded is not None and (recorded.sha256 != sha or recorded.bytes != size):
        raise AwsError(f"{tarball} differs from the one recorded in its manifest; re-run 'mme package' instead of editing artifacts")
    rel = triton_release(manifest.triton.release or None)
    facts = EngineFacts.of(manifest)
    cc, where = None, "the target GPU"
    if instance_type:
        from serving.instances import instance_gpu

        gpu = instance_gpu(instance_type)
        cc, where = gpu.compute_capability, gpu.describe(instance_type)
    check_artifact(facts, rel, compute_capability=cc, where=where)  # an engine that cannot load there never will
    for line in compat_warnings(facts, rel):
        if reporter is not None:
            reporter.warn(line)
    return Artifact(directory, manifest.model, manifest.format, weights, rel.name, tarball, sha, size,
                    facts.tensorrt if facts.has_engine else None, engine_metadata(facts), image_uri)


@dataclass(frozen=True)
class Action:
    kind: str  # "upload" | "copy" | "skip"
    key: str
    reason: str  # "new" | "changed" | "unchanged"
    source_key: str | None = None  # copies: the object copied from


@dataclass(frozen=True)
class PushPlan:
    artifact: Artifact
    destination: S3Uri
    base_key: str
    actions: tuple[Action, ...]
    stale: tuple[str, ...] = ()  # copies beyond --copies left from an earlier push

    def count(self, kind: str) -> int:
        return sum(1 for a in self.actions if a.kind == kind)

    def lines(self) -> list[str]:
        a = self.artifact
        out = [f"push plan for {self.destination} (artifact {a.directory}, {a.size} bytes, sha256 {a.sha256})"]
        for action in self.actions:
            url = self.destination.url(action.key)
            if action.kind == "upload":
                out.append(f"  upload  {url}  ({a.size} bytes, {action.reason})")
            elif action.kind == "copy":
                out.append(f"  copy    {url}  <- {self.destination.url(action.source_key)}  (server-side, {action.reason})")
            else:
                out.append(f"  skip    {url}  (unchanged: sha256 matches)")
        out.append(
            f"  {self.count('upload')} to upload, {self.count('copy')} to copy, {self.count('skip')} unchanged"
        )
        return out


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
class PushHooks:
    """Test seams: ``on_progress(key, bytes_so_far)`` runs in transfer threads (raising there
    fails the upload); ``after_write(key)`` runs after each write, before it is verified."""

    on_progress: Callable[[str, int], None] | None = None
    after_write: Callable[[str], None] | None = None


@dataclass(frozen=True)
class PushResult:
    plan: PushPlan
    uploaded: tuple[str, ...]
    copied: tuple[str, ...]
    skipped: tuple[str, ...]
    seconds: float = 0.0
    verified: tuple[str, ...] = field(default_factory=tuple)


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


def plan_push(s3: Any, artifact: Artifact, destination: S3Uri, copies: int) -> PushPlan:
    """What a push would do: reads only (HEAD bucket and objects, one listing)."""
    check_bucket(s3, destination.bucket)
    base_name = artifact.tarball.name
    base_key = destination.key(base_name)
    base_reply = head(s3, destination.bucket, base_key)
    if matches(base_reply, artifact.sha256, artifact.size):
        actions = [Action("skip", base_key, "unchanged")]
    else:
        actions = [Action("upload", base_key, "changed" if base_reply else "new")]
    for index in range(1, copies + 1):
        key = destination.key(copy_name(base_name, index))
        reply = head(s3, destination.bucket, key)
        if matches(reply, artifact.sha256, artifact.size):
            actions.append(Action("skip", key, "unchanged"))
        else:
            actions.append(Action("copy", key, "changed" if reply else "new", source_key=base_key))
    return PushPlan(artifact, destination, base_key, tuple(actions), _stale_copies(s3, destination, base_name, copies))


def _stale_copies(s3: Any, destination: S3Uri, base_name: str, copies: int) -> tuple[str, ...]:
    stem = base_name[: -len(".tar.gz")] if base_name.endswith(".tar.gz") else base_name
    stale = []
    try:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=destination.bucket, Prefix=destination.key(stem + "-v"))
        for page in pages:
            for obj in page.get("Contents", ()):
                match = _COPY.match(obj["Key"][len(destination.prefix):])
                if match and match["stem"] == stem and int(match["index"]) > copies:
                    stale.append(obj["Key"])
    except aws_errors() as exc:
        raise s3_fail(exc, "list", destination.url(), "s3:ListBucket") from None
    return tuple(sorted(stale))


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
                reporter: Reporter, hooks: PushHooks = PushHooks()) -> None:
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
            raise S3Error(f"upload to s3://{bucket}/{key} failed ({exc}); nothing was left behind: retry 'mme push'") from None
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


def execute_push(s3: Any, plan: PushPlan, settings: TransferSettings, reporter: Reporter,
                 hooks: PushHooks = PushHooks()) -> PushResult:
    start = time.perf_counter()
    artifact, bucket = plan.artifact, plan.destination.bucket
    uploaded: list[str] = []
    copied: list[str] = []
    verified: list[str] = []
    base_etag: str | None = None
    for action in plan.actions:
        if action.kind == "skip":
            continue
        if action.kind == "upload":
            reporter.info(f"  uploading {artifact.tarball.name} -> {plan.destination.url(action.key)} ({artifact.size / MIB:.1f} MiB)")
            upload_file(s3, artifact.tarball, bucket, action.key, artifact.metadata(), settings, reporter, hooks)
            uploaded.append(action.key)
        else:
            assert action.source_key is not None
            if base_etag is None:
                base_etag = verify(s3, bucket, action.source_key, artifact.sha256, artifact.size).get("ETag")
            copy_object(s3, bucket, action.source_key, action.key, base_etag,
                        artifact.metadata(copy_of=action.source_key.rsplit("/", 1)[-1]), settings)
            copied.append(action.key)
        if hooks.after_write is not None:
            hooks.after_write(action.key)
        reply = verify(s3, bucket, action.key, artifact.sha256, artifact.size)
        if action.key == plan.base_key:
            base_etag = reply.get("ETag")
        verified.append(action.key)
    skipped = tuple(a.key for a in plan.actions if a.kind == "skip")
    return PushResult(plan, tuple(uploaded), tuple(copied), skipped, time.perf_counter() - start, tuple(verified))


@dataclass(frozen=True)
class PushRequest:
    artifact: Path
    destination: S3Uri
    copies: int = 0
    allow_random_weights: bool = False
    dry_run: bool = False
    settings: TransferSettings = field(default_factory=TransferSettings)
    instance_type: str | None = None  # check the artifact against this instance's GPU
    image_uri: str | None = None  # serving image when AWS publishes none for the release


def push(s3: Any, request: PushRequest, reporter: Reporter, hooks: PushHooks = PushHooks(),
         out: Callable[[str], None] = print) -> PushResult:
    """Plan, print the plan, and (unless dry run) carry it out and verify every write."""
    if request.copies < 0:
        raise AwsError(f"--copies must be 0 or more (got {request.copies})")
    artifact = load_artifact(request.artifact, request.allow_random_weights, reporter,
                             instance_type=request.instance_type, image_uri=request.image_uri)
    require_sagemaker_image(triton_release(artifact.triton_release), request.image_uri, "serve what you push")
    if artifact.format == "cpu-local":
        reporter.warn(
            "the cpu-local format runs ONNX Runtime inside Triton's python backend, which the SageMaker Triton "
            "image does not ship; push the onnx, torchscript or tensorrt format for a SageMaker endpoint"
        )
    plan = plan_push(s3, artifact, request.destination, request.copies)
    for line in plan.lines():
        out(line)
    if plan.stale:
        reporter.warn(
            f"{len(plan.stale)} copies from an earlier push lie beyond --copies {request.copies} "
            f"({', '.join(k.rsplit('/', 1)[-1] for k in plan.stale[:3])}{', ...' if len(plan.stale) > 3 else ''}); "
            "an MME serves them too: delete them or push with a larger --copies"
        )
    if request.dry_run:
        out("dry run: nothing was written")
        return PushResult(plan, (), (), tuple(a.key for a in plan.actions if a.kind == "skip"))
    result = execute_push(s3, plan, request.settings, reporter, hooks)
    if not result.verified:
        out(f"pushed {request.destination}: nothing to write, all {len(result.skipped)} objects already match")
    else:
        out(
            f"pushed {request.destination}: {len(result.uploaded)} uploaded, {len(result.copied)} copied server-side, "
            f"{len(result.skipped)} unchanged; {len(result.verified)} written objects verified ({result.seconds:.1f} s)"
        )
    return result
