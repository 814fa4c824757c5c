"""``mme compile --on sagemaker``: build a TensorRT plan in a SageMaker training job.

A plan runs only on the TensorRT version and GPU architecture it was built with, so it is
built where it will run: a training job on the target instance type, in the serving image
(the SageMaker Triton image of the artifact's release), as the source article did. The
job reads the ONNX model (channel ``model``) and a small entry script with its build
configuration (channel ``code``: ``trt_build_entry.py`` + ``build_config.json``, the
optimisation profile taken from the manifest's inputs and max batch size) and writes
``model.plan`` + ``build_info.json``, which SageMaker uploads as ``output/model.tar.gz``.
Then the plan is downloaded into ``artifacts/<model>/tensorrt/`` with the Triton model
directory, MME tarball, sample requests and a manifest (format tensorrt, TensorRT version
and GPU from the job).

This module runs the steps and keeps the state file; ``plan`` works out the job,
``job`` talks to S3 and SageMaker, ``artifact`` writes the result with the packager's
layout code.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from mme.aws.errors import AwsError, CompileFailed, Interrupted
from mme.aws.s3 import TransferSettings
from mme.aws.session import aws_errors, explain
from mme.aws.state import SCHEMA_VERSION, StateDir, now_iso
from mme.progress import Reporter
from mme.versions import release as triton_release
from mme.versions import same_tensorrt
from packager.remote.artifact import write_tensorrt_artifact
from packager.remote.job import download_job_output, find_job, upload_inputs, wait_for_job
from packager.remote.plan import CompilePlan, OnnxArtifact


def download_and_write(s3: Any, plan: CompilePlan, artifact: OnnxArtifact, job: dict, reporter: Reporter) -> Path:
    """The completed job's plan, written as the tensorrt artifact (a warning when the job's
    TensorRT differs from the release's)."""
    with tempfile.TemporaryDirectory(prefix=".mme-compile-") as tmp:
        output = download_job_output(s3, plan, job, Path(tmp), reporter)
        expected = triton_release(plan.release).tensorrt
        built = output.info.tensorrt
        if expected and built != "unknown" and not same_tensorrt(built, expected):
            reporter.warn(
                f"the job built with TensorRT {built} but release {plan.release} serves TensorRT {expected}: the plan "
                "loads only on a release with the TensorRT it was built with (the manifest records the real one)"
            )
        return write_tensorrt_artifact(plan, artifact, output, job)


class _CompileState:
    """The compile state file: the jobs started for one (model, instance, precision, ONNX) and their fate."""

    def __init__(self, store: StateDir, plan: CompilePlan) -> None:
        self.store = store
        self.plan = plan
        self.data: dict = {}

    def load(self) -> None:
        self.data = self.store.read(self.plan.job_base) or {
            "schema_version": SCHEMA_VERSION, "job_base": self.plan.job_base, "region": self.plan.region,
            "instance_type": self.plan.instance_type, "out_dir": str(self.plan.out_dir), "jobs": [], "created_at": now_iso(),
        }

    def job(self, name: str) -> dict | None:
        return next((j for j in self.data["jobs"] if j["name"] == name), None)

    def set_job(self, name: str, status: str) -> None:
        job = self.job(name)
        if job is None:
            job = {"name": name, "attempt": self.plan.attempt}
            self.data["jobs"].append(job)
        job["status"] = status
        self.data["updated_at"] = now_iso()
        self.store.write(self.plan.job_base, self.data)


def run_compile(plan: CompilePlan, artifact: OnnxArtifact, sm: Any, s3: Any, store: StateDir, reporter: Reporter, *,
                timeout_s: float = 5400.0, poll_s: float = 30.0, settings: TransferSettings = TransferSettings(),
                sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> Path:
    state = _CompileState(store, plan)
    state.load()
    reporter.info(f"==> compiling {artifact.model} to TensorRT on {plan.instance_type} (job {plan.job_name}); state in {plan.state_path}")
    try:
        existing = find_job(sm, plan.job_name)
        if existing is not None and existing.get("TrainingJobStatus") in ("Failed", "Stopped"):
            raise CompileFailed(
                f"training job {plan.job_name} {existing['TrainingJobStatus']}: {existing.get('FailureReason', 'no reason given')}; "
                "fix the cause and re-run with --retry to start a new job"
            )
        if existing is None:
            upload_inputs(s3, plan, artifact, settings, reporter)
            state.set_job(plan.job_name, "requested")
            try:
                sm.create_training_job(**plan.create_training_job)
            except aws_errors() as exc:
                raise AwsError(explain(exc, "create", f"training job {plan.job_name}",
                                       "sagemaker:CreateTrainingJob and iam:PassRole on the role")) from None
            state.set_job(plan.job_name, "created")
        else:
            reporter.info(f"  training job {plan.job_name} exists ({existing.get('TrainingJobStatus')}): following it")
        try:
            job = wait_for_job(sm, plan.job_name, timeout_s, poll_s, reporter, sleep, clock)
        except CompileFailed:
            state.set_job(plan.job_name, "Failed")
            raise
        state.set_job(plan.job_name, "Completed")
        out = download_and_write(s3, plan, artifact, job, reporter)
        state.set_job(plan.job_name, "downloaded")
        return out
    except KeyboardInterrupt:
        raise Interrupted(
            f"interrupted; the training job (if it started) keeps running in SageMaker: run the same mme compile again "
            f"to follow it and download the plan (state in {plan.state_path})"
        ) from None
