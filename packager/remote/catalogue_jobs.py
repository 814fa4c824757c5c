"""``mme package --catalogue FILE --on sagemaker``: the catalogue packaged by SageMaker training
jobs on the target GPU, the artifacts pulled back into ``--out`` as a local run leaves them.

Each shard (``catalogue_plan``) runs as one training job in the builder image
(``docker/builder``, pushed to ECR) on ``--instance-type``: the job packages its entries as
``mme package --catalogue`` does (``packager.catalogue_run``; TensorRT engines built and
validated on the GPU they will serve on) and SageMaker uploads them as ``output/model.tar.gz``. ``--parallel-jobs`` jobs run at
once; a job SageMaker refuses for the account's instance quota waits for a running one to end.
Each completed job's artifacts are unpacked (regular files and directories only, nothing
outside the archive) and swapped into ``--out/<model>/<format>/``; an entry counts as
packaged only when its manifests are then current for its options (the check a local re-run
makes). A state file in ``--state-dir`` records every job started, before it is started, so
running the same command again follows jobs still running, downloads finished ones and starts
only what is missing; ``--retry`` starts a new attempt of a shard whose job failed or left
entries unpackaged.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from mme import __version__
from mme.archive import ArtifactError, ExtractLimits, safe_extract
from mme.aws.errors import AwsError, CompileFailed, Interrupted, WaitTimeout
from mme.aws.session import S3Uri, aws_errors, connect, error_code, error_message, explain, s3_fail
from mme.aws.state import SCHEMA_VERSION, StateDir, now_iso
from mme.fsutil import replace_directory
from mme.progress import Reporter
from packager.catalogue import LOGS_DIR, Catalogue, up_to_date
from packager.catalogue_summary import SUMMARY_NAME, EntryResult, format_rows
from packager.manifest import is_artifact_directory
from packager.model import triton_model_name
from packager.pipeline import request_fingerprint
from packager.remote.catalogue_plan import (
    JOB_CONFIG,
    JOB_INFO,
    RETRYABLE,
    SHARD_FILE,
    JobsPlan,
    JobsRequest,
    ShardPlan,
    check_entries,
    plan_jobs,
)
from packager.remote.job import find_job, put_bytes

QUOTA_CODES = ("ResourceLimitExceeded",)
ENDED = ("Completed", "Failed", "Stopped")


# --- state ---------------------------------------------------------------------------------


class _JobsState:
    """The state file: each shard's jobs and what became of them."""

    def __init__(self, store: StateDir, plan: JobsPlan, catalogue: Path, out: Path) -> None:
        self.store, self.plan = store, plan
        self.data = store.read(plan.state_name) or {
            "schema_version": SCHEMA_VERSION, "catalogue": str(catalogue), "out": str(out), "region": plan.region,
            "instance_type": plan.instance_type, "image_uri": plan.image_uri, "shards": {}, "created_at": now_iso(),
        }

    def shard(self, base: str) -> dict[str, Any]:
        return self.data["shards"].get(base, {})

    def set(self, shard: ShardPlan, status: str, **extra: Any) -> None:
        record = self.data["shards"].setdefault(shard.base, {})
        if record.get("attempt") != shard.attempt:
            record.clear()
        record.update({"job": shard.job_name, "attempt": shard.attempt, "status": status,
                       "entries": [e.name for e in shard.entries], **extra})
        self.data["updated_at"] = now_iso()
        self.store.write(self.plan.state_name, self.data)


# --- one shard's job -----------------------------------------------------------------------


def upload_shard_inputs(s3: Any, shard: ShardPlan) -> None:
    put_bytes(s3, shard.input_uri + SHARD_FILE, shard.catalogue_toml.encode())
    put_bytes(s3, shard.input_uri + JOB_CONFIG, (json.dumps(shard.job_config, indent=2) + "\n").encode())


def _start(sm: Any, s3: Any, shard: ShardPlan, state: _JobsState, reporter: Reporter) -> bool:
    """Create the shard's job; False when the account's quota refuses it for now."""
    upload_shard_inputs(s3, shard)
    state.set(shard, "requested")
    try:
        sm.create_training_job(**shard.create_training_job)
    except aws_errors() as exc:
        if error_code(exc) in QUOTA_CODES:
            state.set(shard, "queued", reason=error_message(exc))
            return False
        raise AwsError(explain(exc, "create", f"training job {shard.job_name}",
                               "sagemaker:CreateTrainingJob and iam:PassRole on the role")) from None
    state.set(shard, "created")
    reporter.info(f"  started training job {shard.job_name} ({len(shard.entries)} entries: "
                  f"{', '.join(e.name for e in shard.entries)})")
    return True


def _download(s3: Any, job: dict, shard: ShardPlan, into: Path) -> Path:
    uri = (job.get("ModelArtifacts") or {}).get("S3ModelArtifacts") or shard.model_uri
    location = S3Uri.parse(uri.rsplit("/", 1)[0])
    local = into / "model.tar.gz"
    try:
        s3.download_file(location.bucket, location.key(uri.rsplit("/", 1)[1]), str(local))
    except aws_errors() as exc:
        raise s3_fail(exc, "download", uri, "s3:GetObject") from None
    return local


def _unpack(tarball: Path, into: Path, job_name: str, entries: int) -> None:
    """Regular files, directories and links within, nothing outside ``into``, within the size and
    gzip-bomb limits of a model tarball per entry (:func:`mme.archive.safe_extract`)."""
    try:
        safe_extract(tarball, into, ExtractLimits(allow_links=True).times(entries), name=tarball.name)
    except (ArtifactError, OSError) as exc:
        raise CompileFailed(f"the output of training job {job_name} is not a readable tar.gz ({exc}); "
                            "re-run with --retry") from None


def _install(extracted: Path, shard: ShardPlan, requests: dict[int, Any], results: dict[int, EntryResult],
             out: Path, reporter: Reporter) -> list[str]:
    """Swap each entry's artifacts into ``out``; the entries' results; the names left unpackaged."""
    try:
        summary = json.loads((extracted / f"{SUMMARY_NAME}.json").read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        summary = {}
    reported = {e.get("name"): e for e in summary.get("entries", []) if isinstance(e, dict)}
    (out / LOGS_DIR).mkdir(parents=True, exist_ok=True)
    missing = []
    for entry in shard.entries:
        request = requests[entry.index]
        model = triton_model_name(entry.name)
        for fmt in request.formats:
            source = extracted / model / fmt
            if is_artifact_directory(source):
                (out / model).mkdir(parents=True, exist_ok=True)
                replace_directory(source, out / model / fmt)
        log = extracted / LOGS_DIR / f"{entry.slug}.log"
        result = results[entry.index]
        if log.is_file():
            os.replace(log, out / LOGS_DIR / log.name)
            result.log = str(out / LOGS_DIR / log.name)
        remote = reported.get(entry.name, {})
        result.job = shard.job_name
        result.seconds = float(remote.get("seconds") or 0.0)
        result.peak_rss_mib = float(remote.get("peak_rss_mib") or 0.0)
        result.formats = format_rows(request, out)
        current, why = up_to_date(request, out)
        if current:
            result.status, result.error = "packaged", ""
        else:
            result.status = "failed"
            result.error = str(remote.get("error") or why or "not packaged by the job")
            missing.append(entry.name)
    return missing


def _finish(s3: Any, job: dict, shard: ShardPlan, requests: dict[int, Any], results: dict[int, EntryResult],
            out: Path, state: _JobsState, reporter: Reporter) -> None:
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out, prefix=".mme-job-"))
    try:
        reporter.info(f"  downloading the artifacts of {shard.job_name}")
        tarball = _download(s3, job, shard, staging)
        extracted = staging / "model"
        extracted.mkdir()
        _unpack(tarball, extracted, shard.job_name, len(shard.entries))
        tarball.unlink()
        try:
            info = json.loads((extracted / JOB_INFO).read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            info = {}
        if info.get("mme_version") not in (None, __version__):
            reporter.warn(f"{shard.job_name} ran mme {info['mme_version']} and this is mme {__version__}: its artifacts "
                          "are kept but count as packaged with other options (push the builder of this version)")
        missing = _install(extracted, shard, requests, results, out, reporter)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    errors = {results[e.index].entry.name: results[e.index].error for e in shard.entries if e.name in missing}
    state.set(shard, "incomplete" if missing else "downloaded", gpu=info.get("gpu"), errors=errors)
    done = len(shard.entries) - len(missing)
    seconds = job.get("TrainingTimeInSeconds") or job.get("BillableTimeInSeconds")
    reporter.info(f"  {shard.job_name}: {done} of {len(shard.entries)} entries packaged on {info.get('gpu', 'its GPU')}"
                  + (f" in {seconds} s" if seconds else ""))
    for name, error in errors.items():
        reporter.warn(f"{name}: not packaged by {shard.job_name}: {error}")


def _ended_badly(job: dict, shard: ShardPlan, results: dict[int, EntryResult], state: _JobsState | None,
                 reporter: Reporter) -> None:
    status = job.get("TrainingJobStatus")
    reason = f"training job {shard.job_name} {status}: {job.get('FailureReason', 'no reason given')}; fix the cause " \
             "and re-run with --retry (logs in CloudWatch /aws/sagemaker/TrainingJobs)"
    for entry in shard.entries:
        results[entry.index].status, results[entry.index].error = "failed", reason
        results[entry.index].job = shard.job_name
    if state is not None:
        state.set(shard, str(status), reason=job.get("FailureReason", ""))
    reporter.warn(reason)


# --- the run -------------------------------------------------------------------------------


def run_jobs(plan: JobsPlan, request: JobsRequest, catalogue: Catalogue, requests: dict[int, Any],
             results: dict[int, EntryResult], out: Path, sm: Any, s3: Any, store: StateDir, reporter: Reporter, *,
             sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
    state = _JobsState(store, plan, catalogue.path, out)
    queued: list[ShardPlan] = []
    running: dict[str, ShardPlan] = {}
    seen: dict[str, tuple] = {}
    try:
        for shard in plan.shards:
            record = state.shard(shard.base)
            if record.get("attempt") == shard.attempt and record.get("status") in RETRYABLE:
                for entry in shard.entries:  # reported as they ended; --retry makes a new attempt
                    r = results[entry.index]
                    r.status, r.job = "failed", shard.job_name
                    r.error = (record.get("errors", {}).get(entry.name) or record.get("reason") or "not packaged") + \
                        " (re-run with --retry to start a new job)"
                reporter.warn(f"{shard.job_name} ended {record['status']}: re-run with --retry to start a new job")
                continue
            job = find_job(sm, shard.job_name)
            if job is None:
                queued.append(shard)
            elif job.get("TrainingJobStatus") == "Completed":
                _finish(s3, job, shard, requests, results, out, state, reporter)
            elif job.get("TrainingJobStatus") in ENDED:
                _ended_badly(job, shard, results, state, reporter)
            else:
                reporter.info(f"  training job {shard.job_name} exists ({job.get('TrainingJobStatus')}): following it")
                running[shard.job_name] = shard
        deadline = clock() + request.timeout_s
        while queued or running:
            while queued and len(running) < request.parallel_jobs:
                if not _start(sm, s3, queued[0], state, reporter):
                    break
                shard = queued.pop(0)
                running[shard.job_name] = shard
            if queued and not running:
                raise AwsError(f"SageMaker refused training job {queued[0].job_name}: "
                               f"{state.shard(queued[0].base).get('reason')}; the account's quota of "
                               f"{request.instance_type} training instances is in use: ask for more in Service Quotas "
                               "or wait for other jobs, then run the same command again")
            if clock() + request.poll_interval_s > deadline:
                names = ", ".join(running)
                raise WaitTimeout(f"training jobs {names} still running after {request.timeout_s:.0f} s; they keep "
                                  f"running: run the same command again to follow them (state in {plan.state_path})")
            sleep(request.poll_interval_s)
            for name, shard in list(running.items()):
                job = find_job(sm, name) or {}
                status, secondary = job.get("TrainingJobStatus"), job.get("SecondaryStatus")
                if seen.get(name) != (status, secondary):
                    reporter.info(f"  training job {name}: {status} / {secondary}")
                    seen[name] = (status, secondary)
                if status == "Completed":
                    del running[name]
                    _finish(s3, job, shard, requests, results, out, state, reporter)
                elif status in ENDED:
                    del running[name]
                    _ended_badly(job, shard, results, state, reporter)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; training jobs already started keep running in SageMaker: run the same command "
                          f"again to follow them and download their artifacts (state in {plan.state_path})") from None


def package_on_sagemaker(request: JobsRequest, catalogue: Catalogue, requests: Sequence[Any],
                         results: list[EntryResult], out: Path, reporter: Reporter, *, sm: Any = None,
                         s3: Any = None, region: str | None = None, **wait: Any) -> bool:
    """Plan the jobs of the entries not refused nor up to date, print the plan, run them (False
    for a dry run). ``sm``/``s3``/``region`` default to clients of the request's region."""
    by_index = {r.entry.index: r for r in results}
    candidates = [r.entry for r in results if r.status != "failed"]
    refused = check_entries(candidates, [requests[e.index - 1] for e in candidates], request.image_uri,
                            request.instance_type)
    for index, reason in refused.items():
        by_index[index].status, by_index[index].error = "failed", reason
        reporter.warn(f"{by_index[index].entry.name} (entry {index}): {reason}")
    entries = [e for e in candidates if e.index not in refused]
    if sm is None or s3 is None:

        aws = connect(request.region)
        region = aws.region
        s3 = aws.client("s3", request.s3_endpoint_url)
        sm = aws.client("sagemaker")
    store = StateDir(request.state_dir, "catalogue packaging")
    plan = plan_jobs(request, catalogue.path, out, entries, [request_fingerprint(requests[e.index - 1]) for e in entries],
                     {r.entry.index for r in results if r.status == "up to date"}, region or "", s3, store, reporter)
    for line in plan.lines(with_request=request.dry_run):
        print(line)
    if request.dry_run:
        print("dry run: nothing was uploaded or started")
        return False
    run_jobs(plan, request, catalogue, {e.index: requests[e.index - 1] for e in catalogue.entries}, by_index, out, sm,
             s3, store, reporter, **wait)
    return True
