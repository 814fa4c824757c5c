"""The SageMaker side of ``mme compile --on sagemaker``: upload the job's inputs (the ONNX
model, the entry script and its build configuration, each skipped when S3 holds the same
bytes), follow the training job until it ends, and take ``model.plan`` and
``build_info.json`` out of the ``model.tar.gz`` it leaves in S3.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from mme.aws.errors import AwsError, CompileFailed, WaitTimeout
from mme.aws.s3 import SHA_KEY, TransferSettings, head, matches, upload_file, verify
from mme.aws.session import S3Uri, aws_errors, explain, is_not_found, s3_fail
from mme.fsutil import sha256_of
from mme.polling import poll_until
from mme.progress import Reporter
from packager.formats.tensorrt_plan import fp16_onnx
from packager.remote.plan import BUILD_CONFIG, ENTRY_SCRIPT, ONNX_FILE, CompilePlan, OnnxArtifact

PLAN_FILE = "model.plan"
INFO_FILE = "build_info.json"
MAX_PLAN_BYTES = 32 << 30
NOT_REPORTED = "unknown"  # what the job's build_info.json did not say


@dataclass(frozen=True)
class BuildInfo:
    """``build_info.json`` as the job's entry script writes it (``trt_build_entry.py``); what
    it leaves out reads "unknown"."""

    tensorrt: str = NOT_REPORTED
    gpu: str = NOT_REPORTED
    compute_capability: str = NOT_REPORTED
    builder: str = NOT_REPORTED
    command: list[str] | None = None  # the trtexec command line (trtexec builds only)
    io_dtypes: Mapping[str, str] = field(default_factory=dict)  # tensor -> TensorRT dtype (python builds only)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BuildInfo":
        def text(key: str) -> str:
            return str(data.get(key) or NOT_REPORTED)

        command = data.get("command")
        return cls(
            tensorrt=text("tensorrt"), gpu=text("gpu"), compute_capability=text("compute_capability"),
            builder=text("builder"), command=[str(c) for c in command] if isinstance(command, list) and command else None,
            io_dtypes={str(k): str(v) for k, v in (data.get("io_dtypes") or {}).items()},
        )


@dataclass(frozen=True)
class JobOutput:
    plan_file: Path  # model.plan, in a temporary directory the caller owns
    info: BuildInfo


# --- inputs ------------------------------------------------------------------------------


def put_bytes(s3: Any, uri: str, data: bytes) -> None:
    target = S3Uri.parse(uri.rsplit("/", 1)[0])
    key = target.key(uri.rsplit("/", 1)[1])
    sha = hashlib.sha256(data).hexdigest()
    if matches(head(s3, target.bucket, key), sha, len(data)):
        return
    try:
        s3.put_object(Bucket=target.bucket, Key=key, Body=data, Metadata={SHA_KEY: sha})
    except aws_errors() as exc:
        raise s3_fail(exc, "upload to", uri, "s3:PutObject") from None
    verify(s3, target.bucket, key, sha, len(data))


def upload_inputs(s3: Any, plan: CompilePlan, artifact: OnnxArtifact, settings: TransferSettings, reporter: Reporter) -> None:
    with tempfile.TemporaryDirectory(prefix=".mme-compile-") as tmp:
        onnx, sha = artifact.onnx, artifact.sha256
        if plan.fp16_graph:

            reporter.info(f"  converting {artifact.onnx} to an FP16 graph (TensorRT 11 builds FP16 from FP16 graphs)")
            onnx = fp16_onnx(artifact.onnx, Path(tmp) / ONNX_FILE)
            sha = sha256_of(onnx)
        model_uri = S3Uri.parse(plan.input_uri)
        key = model_uri.key(ONNX_FILE)
        size = onnx.stat().st_size
        if matches(head(s3, model_uri.bucket, key), sha, size):
            reporter.info(f"  {plan.input_uri}{ONNX_FILE}: unchanged")
        else:
            reporter.info(f"  uploading {onnx} -> {plan.input_uri}{ONNX_FILE}")
            upload_file(s3, onnx, model_uri.bucket, key, {SHA_KEY: sha}, settings, reporter)
            verify(s3, model_uri.bucket, key, sha, size)
    put_bytes(s3, plan.code_uri + ENTRY_SCRIPT.name, ENTRY_SCRIPT.read_bytes())
    put_bytes(s3, plan.code_uri + BUILD_CONFIG, (json.dumps(plan.build_config, indent=2) + "\n").encode())


# --- the job -------------------------------------------------------------------------------


def find_job(sm: Any, name: str) -> dict | None:
    """The training job's description, or None when there is no job of that name."""
    try:
        return sm.describe_training_job(TrainingJobName=name)
    except aws_errors() as exc:
        if is_not_found(exc):
            return None
        raise AwsError(explain(exc, "describe", f"training job {name}", "sagemaker:DescribeTrainingJob")) from None


def describe_job(sm: Any, name: str) -> dict:
    try:
        return sm.describe_training_job(TrainingJobName=name)
    except aws_errors() as exc:
        raise AwsError(explain(exc, "describe", f"training job {name}", "sagemaker:DescribeTrainingJob")) from None


def wait_for_job(sm: Any, name: str, timeout_s: float, poll_s: float, reporter: Reporter,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> dict:
    """The job's description once it completes; CompileFailed when it fails or is stopped,
    WaitTimeout (the job keeps running) when ``timeout_s`` would pass."""
    last: dict[str, Any] = {"seen": None, "status": None}  # the status line printed last

    def check(elapsed: Callable[[], float]) -> dict | None:
        desc = describe_job(sm, name)
        status, secondary = desc.get("TrainingJobStatus"), desc.get("SecondaryStatus")
        last["status"] = status
        if last["seen"] != (status, secondary):
            reporter.info(f"  training job {name}: {status} / {secondary} ({elapsed():.0f} s)")
            last["seen"] = (status, secondary)
        if status == "Completed":
            return desc
        if status in ("Failed", "Stopped"):
            raise CompileFailed(
                f"training job {name} {status}: {desc.get('FailureReason', 'no reason given')}; logs in CloudWatch "
                "/aws/sagemaker/TrainingJobs; fix the cause and re-run with --retry to start a new job"
            )
        return None

    def timed_out(waited: float) -> BaseException:
        return WaitTimeout(
            f"training job {name} still {last['status']} after {waited:.0f} s; it keeps running: run the same mme "
            "compile again to wait and download"
        )

    return poll_until(check, timeout_s=timeout_s, interval_s=poll_s, on_timeout=timed_out, sleep=sleep, clock=clock)


# --- its output ----------------------------------------------------------------------------


def read_job_output(tarball: Path, into: Path) -> JobOutput:
    """Take model.plan and build_info.json out of the job's model.tar.gz (regular files only)."""
    wanted = {PLAN_FILE, INFO_FILE}
    found: dict[str, Path] = {}
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                if name not in wanted or not member.isfile() or name in found:
                    continue
                if member.size > MAX_PLAN_BYTES:
                    raise CompileFailed(f"{name} in the job output is {member.size} bytes, more than the {MAX_PLAN_BYTES} allowed")
                source = tar.extractfile(member)
                if source is None:
                    continue
                dest = into / name
                with source, open(dest, "wb") as fh:
                    shutil.copyfileobj(source, fh, 1 << 20)
                found[name] = dest
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise CompileFailed(f"the job output {tarball.name} is not a readable tar.gz ({exc}); re-run with --retry") from None
    if PLAN_FILE not in found:
        raise CompileFailed(f"the job output has no {PLAN_FILE}; see the job's logs and re-run with --retry")
    info: Any = {}
    if INFO_FILE in found:
        try:
            info = json.loads(found[INFO_FILE].read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            info = {}  # the plan is there; its description is optional
    return JobOutput(found[PLAN_FILE], BuildInfo.from_dict(info if isinstance(info, dict) else {}))


def download_job_output(s3: Any, plan: CompilePlan, job: dict, into: Path, reporter: Reporter) -> JobOutput:
    """Download the completed job's model.tar.gz into ``into`` and read the plan out of it."""
    model_uri = (job.get("ModelArtifacts") or {}).get("S3ModelArtifacts")
    if not model_uri:
        raise CompileFailed(f"training job {plan.job_name} completed without model artifacts; re-run with --retry")
    location = S3Uri.parse(model_uri.rsplit("/", 1)[0])
    key = location.key(model_uri.rsplit("/", 1)[1])
    local = into / "model.tar.gz"
    reporter.info(f"  downloading {model_uri}")
    try:
        s3.download_file(location.bucket, key, str(local))
    except aws_errors() as exc:
        raise s3_fail(exc, "download", model_uri, "s3:GetObject") from None
    return read_job_output(local, into)
