"""``mme push``: put an artifact's MME tarball and its copies under an S3 prefix.

The tarball is uploaded once (multipart above a threshold, with a progress line); the
copies ``<name>-v0..v{N-1}.tar.gz`` (named like ``serving.models.copies``) are made by server-side
copy, so no byte is sent twice. Each object carries the tarball's sha256 in its metadata
(``x-amz-meta-sha256``): an object whose size and sha256 already match is skipped, so a
second push writes nothing and a changed artifact re-uploads. Every write is checked
afterwards (HEAD: size and metadata). A multipart upload that fails or is interrupted is
aborted: S3 shows an object only once its upload completes, so nothing half-written is
ever visible, and no pending parts are left to pay for.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from mme.aws.errors import AwsError, RandomWeightsRefused
from mme.aws.s3 import MIB, SHA_KEY, TransferHooks, TransferSettings, copy_object, head, matches, upload_file, verify
from mme.aws.session import S3Uri, aws_errors, check_bucket, s3_fail
from mme.fsutil import sha256_of
from mme.hosts import HostVerdict, check_host, require_starts
from mme.instances import instance_gpu
from mme.progress import Reporter
from mme.versions import release as triton_release
from mme.versions import require_sagemaker_image
from packager.compat import EngineFacts, check_artifact, compat_warnings
from packager.formats import format_of
from packager.manifest import Manifest
from serving.models.copies import copy_indices, copy_name, parse_copy_name, renumbering_note


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
    renumbering: str | None = None  # the prefix holds copies numbered from 1 (before mme numbered from 0)

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
class PushResult:
    plan: PushPlan
    uploaded: tuple[str, ...]
    copied: tuple[str, ...]
    skipped: tuple[str, ...]
    seconds: float = 0.0
    verified: tuple[str, ...] = field(default_factory=tuple)


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
    for index in copy_indices(copies):
        key = destination.key(copy_name(base_name, index))
        reply = head(s3, destination.bucket, key)
        if matches(reply, artifact.sha256, artifact.size):
            actions.append(Action("skip", key, "unchanged"))
        else:
            actions.append(Action("copy", key, "changed" if reply else "new", source_key=base_key))
    existing = _existing_copies(s3, destination, base_name)
    stem = base_name[: -len(".tar.gz")] if base_name.endswith(".tar.gz") else base_name
    stale = tuple(sorted(key for index, key in existing.items() if index not in copy_indices(copies)))
    return PushPlan(artifact, destination, base_key, tuple(actions), stale,
                    renumbering_note(stem, frozenset(existing), destination.url()))


def _existing_copies(s3: Any, destination: S3Uri, base_name: str) -> dict[int, str]:
    """The copies of ``base_name`` already under the prefix: index -> key."""
    stem = base_name[: -len(".tar.gz")] if base_name.endswith(".tar.gz") else base_name
    found: dict[int, str] = {}
    try:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=destination.bucket, Prefix=destination.key(stem + "-v"))
        for page in pages:
            for obj in page.get("Contents", ()):
                parsed = parse_copy_name(obj["Key"][len(destination.prefix):])
                if parsed is not None and parsed.stem == stem:
                    found[parsed.index] = obj["Key"]
    except aws_errors() as exc:
        raise s3_fail(exc, "list", destination.url(), "s3:ListBucket") from None
    return found


def execute_push(s3: Any, plan: PushPlan, settings: TransferSettings, reporter: Reporter,
                 hooks: TransferHooks = TransferHooks()) -> PushResult:
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


def check_push_host(rel: Any, instance_type: str | None, image_uri: str | None, reporter: Reporter) -> HostVerdict | None:
    """With --instance-type: the release's CUDA against the NVIDIA drivers SageMaker offers that
    instance type (its default host, or an InferenceAmiVersion, which mme deploy sets): refuse what
    no host image starts; warn where the image is the user's own (CUDA unknown)."""
    if not instance_type:
        return None
    image = f"your image {image_uri}" if image_uri else f"release {rel.name}"
    verdict = require_starts(check_host(None if image_uri else rel.cuda, instance_type, None, image=image),
                             option="mme deploy --inference-ami-version")
    if verdict.starts is None:
        reporter.warn(f"{verdict.reason}; mme deploy --inference-ami-version picks a host image with a newer driver")
    return verdict


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


def push(s3: Any, request: PushRequest, reporter: Reporter, hooks: TransferHooks = TransferHooks(),
         out: Callable[[str], None] = print) -> PushResult:
    """Plan, print the plan, and (unless dry run) carry it out and verify every write."""
    if request.copies < 0:
        raise AwsError(f"--copies must be 0 or more (got {request.copies})")
    artifact = load_artifact(request.artifact, request.allow_random_weights, reporter,
                             instance_type=request.instance_type, image_uri=request.image_uri)
    rel = triton_release(artifact.triton_release)
    require_sagemaker_image(rel, request.image_uri, "serve what you push")
    host = check_push_host(rel, request.instance_type, request.image_uri, reporter)
    if (fmt := format_of(artifact.format)) and not fmt.runs_on_sagemaker_image:
        reporter.warn(
            "the cpu-local format runs ONNX Runtime inside Triton's python backend, which the SageMaker Triton "
            "image does not ship; push the onnx, torchscript or tensorrt format for a SageMaker endpoint"
        )
    plan = plan_push(s3, artifact, request.destination, request.copies)
    for line in plan.lines():
        out(line)
    if host is not None:
        out(f"  {host.line()}")
    if plan.renumbering:
        reporter.warn(plan.renumbering)
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
