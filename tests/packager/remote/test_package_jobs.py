"""mme package --catalogue --on sagemaker: the shards and their training-job requests (checked
against SageMaker's service model), the jobs followed through stubbed SageMaker calls, a quota
refusal that waits for a running job, the job's own entry run here on the inputs uploaded to a
real S3 server (the real mme package of the shard), its output pulled back into --out as a local
run leaves it, resume, failures and --retry."""

from __future__ import annotations

import io
import json
import re
import tarfile
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest

from mme.aws.state import StateDir
from mme.cli import main
from mme.progress import Reporter
from packager.catalogue import entry_request, load_catalogue
from packager.catalogue_run import triage
from packager.remote import catalogue_entry
from packager.remote.catalogue_jobs import package_on_sagemaker, upload_shard_inputs
from packager.remote.catalogue_plan import JobsRequest, check_entries, image_release, plan_jobs
from packager.request import request_fingerprint

ROLE = "arn:aws:iam::123456789012:role/SageMakerExecution"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mme-builder:{release}"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
JOB_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def release_name() -> str:
    from mme.versions import release

    return release().name


def write_catalogue(tmp_path: Path, models: str) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(f'[defaults]\nformats = ["onnx"]\nweights = "random"\nmax_batch_size = 2\n\n{models}')
    return path


def models(*names: str) -> str:
    return "".join(f'[[model]]\nname = "{n}"\n' for n in names)


def jobs_request(s3env, tmp_path: Path, **overrides) -> JobsRequest:
    return JobsRequest(s3=f"s3://{s3env.bucket}/work", instance_type="ml.g5.2xlarge", role_arn=ROLE,
                       image_uri=IMAGE.format(release=release_name()), state_dir=tmp_path / "state",
                       poll_interval_s=30, **overrides)


def prepare(path: Path, out: Path):
    catalogue = load_catalogue(path)
    requests = [entry_request(e, out) for e in catalogue.entries]
    results, _ = triage(catalogue, requests, out, Reporter(quiet=True), build_here=False)
    return catalogue, requests, results


def describe(name: str, status: str, secondary: str, model_uri: str, **extra) -> dict:
    return {"TrainingJobName": name, "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{name}",
            "ModelArtifacts": {"S3ModelArtifacts": model_uri}, "TrainingJobStatus": status, "SecondaryStatus": secondary,
            "CreationTime": NOW, "StoppingCondition": {"MaxRuntimeInSeconds": 14400}, **extra}


def not_found(stub, name: str) -> None:
    stub.add_client_error("describe_training_job", service_error_code="ValidationException", http_status_code=400,
                          service_message="Requested resource not found.", expected_params={"TrainingJobName": name})


def run_job_here(s3env, shard, tmp_path: Path) -> int:
    """What the training job does, here: its inputs from S3 into the channel directory, the entry
    module on them (container paths mapped to temporary ones), /opt/ml/model uploaded as SageMaker
    uploads it (output/model.tar.gz, the directory's contents at the root)."""
    root = tmp_path / "job" / shard.job_name
    channel, model_dir = root / "input" / "data" / "catalogue", root / "model"
    channel.mkdir(parents=True)
    prefix = shard.input_uri[len(f"s3://{s3env.bucket}/"):]
    for key in s3env.keys(prefix):
        (channel / key.rsplit("/", 1)[1]).write_bytes(s3env.client.get_object(Bucket=s3env.bucket, Key=key)["Body"].read())
    config = json.loads((channel / "job.json").read_text())
    assert config["out"] == "/opt/ml/model" and config["failure"] == "/opt/ml/output/failure"
    config |= {"out": str(model_dir), "failure": str(root / "output" / "failure")}
    (channel / "job.json").write_text(json.dumps(config))
    code = catalogue_entry.run(channel / "job.json")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(model_dir.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(model_dir)), recursive=False)
    s3env.client.put_object(Bucket=s3env.bucket, Key=shard.model_uri[len(f"s3://{s3env.bucket}/"):], Body=buffer.getvalue())
    return code


def test_shards_become_valid_training_jobs_and_a_dry_run_writes_nothing(s3env, tmp_path, capsys):
    import botocore.session
    from botocore.validate import validate_parameters

    out = tmp_path / "artifacts"
    path = write_catalogue(tmp_path, models("test_resnet", "test_vit", "test_convnext")
                           + '[[model]]\nname = "test_efficientnet"\nformats = ["onnx", "tensorrt"]\nprecision = "fp16"\n'
                           + '[[model]]\nname = "test_byobnet"\nweights = "auto"\nweights_path = "w.pth"\n')
    (tmp_path / "w.pth").write_bytes(b"x")
    catalogue, requests, results = prepare(path, out)
    assert [r.status for r in results] == ["pending"] * 5, "a GPU format is not refused for want of a GPU here"
    request = jobs_request(s3env, tmp_path, shard_size=2)
    refused = check_entries(catalogue.entries, requests, request.image_uri, request.instance_type)
    assert list(refused) == [5] and "a SageMaker job cannot read" in refused[5]
    entries = [e for e in catalogue.entries if e.index not in refused]
    fingerprints = [request_fingerprint(requests[e.index - 1]) for e in entries]
    store = StateDir(request.state_dir)
    plan = plan_jobs(request, path, out, entries, fingerprints, set(), "us-east-1", s3env.client, store, Reporter(quiet=True))
    assert [[e.name for e in s.entries] for s in plan.shards] == [["test_resnet", "test_vit"],
                                                                  ["test_convnext", "test_efficientnet"]]
    model = botocore.session.get_session().get_service_model("sagemaker").operation_model("CreateTrainingJob")
    for shard in plan.shards:
        job = shard.create_training_job
        validate_parameters(job, model.input_shape)
        assert JOB_NAME.match(shard.job_name) and job["TrainingJobName"] == shard.job_name
        assert job["AlgorithmSpecification"]["TrainingImage"] == request.image_uri
        assert job["AlgorithmSpecification"]["ContainerArguments"] == ["/opt/ml/input/data/catalogue/job.json"]
        assert job["ResourceConfig"]["InstanceType"] == "ml.g5.2xlarge"
        assert job["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] == shard.input_uri
        # the shard is a catalogue of its own: the same mme package arguments, entry by entry
        (tmp_path / "shard.toml").write_text(shard.catalogue_toml)
        assert [e.command_line for e in load_catalogue(tmp_path / "shard.toml").entries] == [e.command_line for e in shard.entries]
    # the same inputs give the same jobs; one changed entry changes its shard only
    again = plan_jobs(request, path, out, entries, fingerprints, set(), "us-east-1", s3env.client, store, Reporter(quiet=True))
    assert [s.job_name for s in again.shards] == [s.job_name for s in plan.shards]
    changed = plan_jobs(request, path, out, entries, fingerprints[:3] + ["other"], set(), "us-east-1", s3env.client,
                        store, Reporter(quiet=True))
    assert changed.shards[0].job_name == plan.shards[0].job_name and changed.shards[1].job_name != plan.shards[1].job_name
    skipped = plan_jobs(request, path, out, entries, fingerprints, {1, 2}, "us-east-1", s3env.client, store,
                        Reporter(quiet=True))
    assert [s.base for s in skipped.shards] == [plan.shards[1].base], "a shard packaged here already is not planned"

    # the command line, dry run: the plan on stdout, nothing uploaded, started or written
    capsys.readouterr()
    code = main(["package", "--catalogue", str(path), "--out", str(out), "--on", "sagemaker", "--instance-type",
                 "ml.g5.2xlarge", "--s3", request.s3, "--role", ROLE, "--image-uri", request.image_uri, "--shard-size", "2",
                 "--state-dir", str(tmp_path / "cli-state"), "--s3-endpoint-url", s3env.url, "--dry-run"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "package plan: 4 entries in 2 SageMaker training jobs on ml.g5.2xlarge in us-east-1" in printed.out
    assert f"job {plan.shards[0].job_name}: test_resnet, test_vit" in printed.out and '"CreateTrainingJob"' not in printed.out
    assert "test_byobnet (entry 5): weights_path" in printed.err
    assert s3env.calls.writes == 0 and not out.exists() and not (tmp_path / "cli-state").exists()


@pytest.mark.parametrize("argv, message", [
    (["--catalogue", "C", "--on", "sagemaker"], "--on sagemaker needs --instance-type, --s3, --role, --image-uri"),
    (["test_resnet", "--on", "sagemaker"], "--on sagemaker packages a --catalogue FILE"),
    (["test_resnet", "--instance-type", "ml.g5.2xlarge"], "--instance-type goes with --catalogue FILE --on sagemaker"),
    (["--catalogue", "C", "--on", "sagemaker", "--instance-type", "ml.g5.2xlarge", "--s3", "s3://b/p", "--role", ROLE,
      "--image-uri", "not an image"], "--image-uri 'not an image' is not a container image URI"),
    (["--catalogue", "C", "--on", "sagemaker", "--instance-type", "ml.g9.nothing", "--s3", "s3://b/p", "--role", ROLE,
      "--image-uri", "1.dkr.ecr.us-east-1.amazonaws.com/b:1"], "--instance-type"),
])
def test_sagemaker_options_are_checked_before_anything_runs(tmp_path, capsys, argv, message):
    path = write_catalogue(tmp_path, models("test_resnet"))
    argv = [str(path) if a == "C" else a for a in argv]
    out = tmp_path / "artifacts"
    code = main(["package", *argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_an_image_of_another_release_or_a_gpu_it_cannot_serve_refuses_the_entry(tmp_path):
    path = write_catalogue(tmp_path, models("test_resnet"))
    catalogue, requests, _ = prepare(path, tmp_path / "out")
    assert image_release(IMAGE.format(release="24.01")) == "24.01" and image_release("x.amazonaws.com/builder:latest") is None
    if release_name() != "24.01":
        refused = check_entries(catalogue.entries, requests, IMAGE.format(release="24.01"), "ml.g5.2xlarge")
        assert "--image-uri is the builder of 24.01" in refused[1] and "make docker-build" in refused[1]
    assert check_entries(catalogue.entries, requests, IMAGE.format(release=release_name()), "ml.g5.2xlarge") == {}
    assert check_entries(catalogue.entries, requests, IMAGE.format(release=release_name()), "ml.m5.xlarge") == {}, \
        "CPU formats package on a CPU instance"
    gpu_path = write_catalogue(tmp_path, '[[model]]\nname = "test_resnet"\nformats = ["onnx", "tensorrt"]\n')
    catalogue, requests, _ = prepare(gpu_path, tmp_path / "out")
    refused = check_entries(catalogue.entries, requests, IMAGE.format(release=release_name()), "ml.m5.xlarge")
    assert "tensorrt need a GPU and ml.m5.xlarge has none (" in refused[1]


def test_jobs_package_the_catalogue_wait_for_quota_and_their_artifacts_land_as_a_local_run_leaves_them(
        s3env, tmp_path, stubbed, fake_clock, capsys, monkeypatch):
    from packager.catalogue import up_to_date

    out = tmp_path / "artifacts"
    path = write_catalogue(tmp_path, models("test_resnet", "test_vit"))
    catalogue, requests, results = prepare(path, out)
    request = jobs_request(s3env, tmp_path, parallel_jobs=2)
    store = StateDir(request.state_dir)
    entries = list(catalogue.entries)
    plan = plan_jobs(request, path, out, entries, [request_fingerprint(r) for r in requests], set(), "us-east-1",
                     s3env.client, store, Reporter(quiet=True))
    first, second = plan.shards
    sm, stub = stubbed("sagemaker")
    not_found(stub, first.job_name)
    not_found(stub, second.job_name)
    arn = {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:123456789012:training-job/x"}
    stub.add_response("create_training_job", arn, first.create_training_job)
    stub.add_client_error("create_training_job", service_error_code="ResourceLimitExceeded", http_status_code=400,
                          service_message="The account-level service limit 'ml.g5.2xlarge for training job usage' is 1 "
                          "Instances", expected_params=second.create_training_job)
    stub.add_response("describe_training_job", describe(first.job_name, "Completed", "Completed", first.model_uri,
                                                        TrainingTimeInSeconds=95), {"TrainingJobName": first.job_name})
    stub.add_response("create_training_job", arn, second.create_training_job)
    stub.add_response("describe_training_job", describe(second.job_name, "Completed", "Completed", second.model_uri),
                      {"TrainingJobName": second.job_name})
    codes = []
    clock = fake_clock(on_sleep=lambda n: codes.append(run_job_here(s3env, (first, second)[n - 1], tmp_path)))
    lines = io.StringIO()
    ran = package_on_sagemaker(request, catalogue, requests, results, out, Reporter(stream=lines), sm=sm,
                               s3=s3env.client, region="us-east-1", sleep=clock.sleep, clock=clock.clock)
    stub.assert_no_pending_responses()
    assert ran and codes == [0, 0] and clock.sleeps == [30, 30], lines.getvalue()
    assert [(r.status, r.job) for r in results] == [("packaged", first.job_name), ("packaged", second.job_name)]
    for result, req in zip(results, requests):
        assert up_to_date(req, out) == (True, "") and Path(result.log).is_file() and result.seconds > 0
        (row,) = result.formats
        assert row["format"] == "onnx" and row["tarball_mb"] > 0 and row["max_abs_diff"] < 1e-3
    assert not list(out.glob(".mme-job-*")), "no download left behind"
    state = json.loads(next((tmp_path / "state").glob("*.json")).read_text())
    assert {s["job"]: s["status"] for s in state["shards"].values()} == {first.job_name: "downloaded",
                                                                         second.job_name: "downloaded"}
    printed = lines.getvalue()
    assert f"{first.job_name}: 1 of 1 entries packaged" in printed and "in 95 s" in printed

    # a local run finds everything up to date; so does the same SageMaker run (no SageMaker call at all)
    capsys.readouterr()
    assert main(["package", "--catalogue", str(path), "--out", str(out)]) == 0
    assert "catalogue: 0 packaged, 2 up to date, 0 failed" in capsys.readouterr().out
    _, requests, results = prepare(path, out)
    sm_idle, idle = stubbed("sagemaker")
    package_on_sagemaker(request, catalogue, requests, results, out, Reporter(quiet=True), sm=sm_idle, s3=s3env.client,
                         region="us-east-1", sleep=clock.sleep, clock=clock.clock)
    assert [r.status for r in results] == ["up to date", "up to date"]

    # the command line, artifacts gone here: the completed jobs' output is downloaded again, the summary names the jobs
    import shutil


    shutil.rmtree(out)
    sm_cli, cli_stub = stubbed("sagemaker")
    for shard in plan.shards:
        cli_stub.add_response("describe_training_job", describe(shard.job_name, "Completed", "Completed", shard.model_uri),
                              {"TrainingJobName": shard.job_name})

    class Aws:
        region = "us-east-1"

        def client(self, service, endpoint_url=None):
            return sm_cli if service == "sagemaker" else s3env.client

    import packager.remote.catalogue_jobs

    monkeypatch.setattr(packager.remote.catalogue_jobs, "connect", lambda region=None, **_: Aws())  # where it is used
    capsys.readouterr()
    code = main(["package", "--catalogue", str(path), "--out", str(out), "--on", "sagemaker", "--instance-type",
                 "ml.g5.2xlarge", "--s3", request.s3, "--role", ROLE, "--image-uri", request.image_uri,
                 "--state-dir", str(request.state_dir)])
    printed = capsys.readouterr()
    cli_stub.assert_no_pending_responses()
    assert code == 0 and "catalogue: 2 packaged, 0 up to date, 0 failed" in printed.out, printed.err
    summary = json.loads((out / "catalogue-summary.json").read_text())
    assert summary["where"] == "sagemaker:ml.g5.2xlarge"
    assert [(e["status"], e["job"]) for e in summary["entries"]] == [("packaged", first.job_name),
                                                                     ("packaged", second.job_name)]
    assert f"packaged (job {first.job_name})" in (out / "catalogue-summary.md").read_text()


def test_a_failed_job_fails_its_entries_only_and_retry_starts_a_new_attempt(s3env, tmp_path, stubbed, fake_clock):
    out = tmp_path / "artifacts"
    path = write_catalogue(tmp_path, models("test_resnet", "test_vit"))
    catalogue, requests, results = prepare(path, out)
    request = jobs_request(s3env, tmp_path, parallel_jobs=2)
    store = StateDir(request.state_dir)
    plan = plan_jobs(request, path, out, list(catalogue.entries), [request_fingerprint(r) for r in requests], set(),
                     "us-east-1", s3env.client, store, Reporter(quiet=True))
    first, second = plan.shards
    for shard in plan.shards:  # a run interrupted once both jobs were started
        upload_shard_inputs(s3env.client, shard)
    sm, stub = stubbed("sagemaker")
    reason = "AlgorithmError: mme: error: out of GPU memory"
    stub.add_response("describe_training_job", describe(first.job_name, "Failed", "Failed", first.model_uri,
                                                        FailureReason=reason))
    stub.add_response("describe_training_job", describe(second.job_name, "InProgress", "Training", second.model_uri))
    stub.add_response("describe_training_job", describe(second.job_name, "InProgress", "Downloading", second.model_uri))
    stub.add_response("describe_training_job", describe(second.job_name, "Completed", "Completed", second.model_uri))
    clock = fake_clock(on_sleep=lambda n: n == 2 and run_job_here(s3env, second, tmp_path))
    package_on_sagemaker(request, catalogue, requests, results, out, Reporter(quiet=True), sm=sm, s3=s3env.client,
                         region="us-east-1", sleep=clock.sleep, clock=clock.clock)
    stub.assert_no_pending_responses()
    assert results[0].status == "failed" and reason in results[0].error and "--retry" in results[0].error
    assert results[1].status == "packaged" and results[1].job == second.job_name

    # again without --retry: the failure is reported from the state file, nothing is asked of SageMaker
    _, requests, results = prepare(path, out)
    sm_idle, _ = stubbed("sagemaker")
    package_on_sagemaker(request, catalogue, requests, results, out, Reporter(quiet=True), sm=sm_idle, s3=s3env.client,
                         region="us-east-1", sleep=clock.sleep, clock=clock.clock)
    assert results[0].status == "failed" and reason in results[0].error and results[1].status == "up to date"
    # with --retry: a new attempt of the failed shard only
    retry = replace(request, retry=True)
    again = plan_jobs(retry, path, out, list(catalogue.entries), [request_fingerprint(r) for r in requests], {2},
                      "us-east-1", s3env.client, store, Reporter(quiet=True))
    assert [s.job_name for s in again.shards] == [first.base + "-2"]


def test_the_job_entry_fails_the_job_with_the_reason_when_no_entry_is_packaged(tmp_path):
    channel = tmp_path / "channel"
    channel.mkdir()
    (channel / "catalogue.toml").write_text('[[model]]\nname = "test_resnett"\nformats = ["onnx"]\n')
    failure = tmp_path / "output" / "failure"
    (channel / "job.json").write_text(json.dumps({"catalogue": "catalogue.toml", "out": str(tmp_path / "model"),
                                                  "failure": str(failure), "jobs": 1}))
    assert catalogue_entry.main([str(channel / "job.json")]) == 1
    reason = failure.read_text()
    assert reason.startswith("no entry was packaged; test_resnett: ") and "test_resnett" in reason[36:]
    info = json.loads((tmp_path / "model" / "job_info.json").read_text())
    assert info["exit_code"] == 1 and info["gpu"] in ("none", "unknown") or "NVIDIA" in info["gpu"]
    assert catalogue_entry.main([]) == 2



def test_the_job_entry_says_to_push_the_job_image_when_the_model_directory_is_not_writable(tmp_path):
    channel = tmp_path / "channel"
    channel.mkdir()
    (tmp_path / "mounted").write_text("")  # /opt/ml/model as a non-root user finds it: not writable
    model = tmp_path / "mounted" / "model"
    (channel / "catalogue.toml").write_text('[[model]]\nname = "test_resnet"\nformats = ["onnx"]\n')
    failure = tmp_path / "failure"
    (channel / "job.json").write_text(json.dumps({"catalogue": "catalogue.toml", "out": str(model), "failure": str(failure)}))
    assert catalogue_entry.main([str(channel / "job.json")]) == 1
    reason = failure.read_text()
    assert reason.startswith(f"mme: error: cannot write to --out {model}") and "make docker-build-job" in reason, reason
