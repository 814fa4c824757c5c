"""mme push against a real S3 server (moto over HTTP): one upload, server-side copies,
skip-unchanged, random-weights refusal, dry run, interrupted multipart uploads, verification."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from mme import versions
from mme.fsutil import sha256_of
from mme.progress import Reporter
from packager.manifest import Manifest
from mme.aws.errors import RandomWeightsRefused, VerificationError
from mme.errors import MmeError
from mme.aws.images import triton_image_uri
from mme.aws.s3 import TransferHooks, TransferSettings
from serving.deploy.s3push import PushRequest, push
from mme.aws.session import S3Uri

MIB = 1 << 20
SMALL_PARTS = TransferSettings(multipart_threshold=5 * MIB, multipart_chunksize=5 * MIB, max_concurrency=2)


def _push(s3env, artifact: Path, prefix: str = "models/r", *, copies: int = 0, allow: bool = True, dry: bool = False,
          settings: TransferSettings = TransferSettings(), hooks: TransferHooks = TransferHooks(), lines: list | None = None, reporter=None):
    request = PushRequest(artifact, S3Uri.parse(f"s3://{s3env.bucket}/{prefix}"), copies, allow, dry, settings)
    out = lines.append if lines is not None else (lambda _line: None)
    return push(s3env.client, request, reporter or Reporter(quiet=True), hooks, out)


def test_push_uploads_once_and_makes_copies_server_side(s3env, artifact):
    result = _push(s3env, artifact, copies=3)
    assert s3env.calls.bodies == 1, "the tarball's bytes went up once"
    assert s3env.calls.copies == 3, "each copy is a server-side CopyObject"
    names = ["test_resnet.tar.gz"] + [f"test_resnet-v{i}.tar.gz" for i in (0, 1, 2)]  # the article's -v0 ... -v{N-1}
    assert s3env.keys("models/r/") == sorted(f"models/r/{n}" for n in names)
    sha = sha256_of(artifact / "test_resnet.tar.gz")
    for name in names:
        head = s3env.client.head_object(Bucket=s3env.bucket, Key=f"models/r/{name}")
        assert head["Metadata"]["sha256"] == sha
        assert head["ContentLength"] == (artifact / "test_resnet.tar.gz").stat().st_size
    body = s3env.client.get_object(Bucket=s3env.bucket, Key="models/r/test_resnet-v2.tar.gz")["Body"].read()
    assert body == (artifact / "test_resnet.tar.gz").read_bytes()
    assert len(result.verified) == 4


def test_second_push_writes_nothing_and_changed_artifact_reuploads(s3env, artifact, change_tarball):
    _push(s3env, artifact, copies=2)
    s3env.calls.names.clear()
    lines: list[str] = []
    second = _push(s3env, artifact, copies=2, lines=lines)
    assert s3env.calls.writes == 0
    assert len(second.skipped) == 3 and not second.uploaded and not second.copied
    assert "nothing to write" in lines[-1]

    change_tarball(artifact, (artifact / "test_resnet.tar.gz").read_bytes() + b"changed")
    s3env.calls.names.clear()
    third = _push(s3env, artifact, copies=2)
    assert s3env.calls.bodies == 1 and s3env.calls.copies == 2
    assert len(third.uploaded) == 1 and len(third.copied) == 2
    head = s3env.client.head_object(Bucket=s3env.bucket, Key="models/r/test_resnet-v1.tar.gz")
    assert head["Metadata"]["sha256"] == sha256_of(artifact / "test_resnet.tar.gz")


def test_random_weights_refused_unless_allowed(s3env, artifact, run_cli):
    with pytest.raises(RandomWeightsRefused, match="--allow-random-weights"):
        _push(s3env, artifact, allow=False)
    assert s3env.keys() == []

    code, out, err = run_cli("push", str(artifact), "--s3", f"s3://{s3env.bucket}/m", "--endpoint-url", s3env.url)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("mme: error:") and "random weights" in err
    assert "Traceback" not in err and s3env.keys() == []

    code, out, err = run_cli("push", str(artifact), "--s3", f"s3://{s3env.bucket}/m", "--endpoint-url", s3env.url,
                             "--allow-random-weights", "--copies", "1")
    assert code == 0, err
    assert s3env.keys() == ["m/test_resnet-v0.tar.gz", "m/test_resnet.tar.gz"]
    assert "random weights" in err  # the override is loud


def test_dry_run_prints_the_plan_and_writes_nothing(s3env, artifact):
    lines: list[str] = []
    _push(s3env, artifact, copies=2, dry=True, lines=lines)
    assert s3env.calls.writes == 0 and s3env.keys() == []
    base = f"s3://{s3env.bucket}/models/r"
    assert lines[1] == f"  upload  {base}/test_resnet.tar.gz  ({(artifact / 'test_resnet.tar.gz').stat().st_size} bytes, new)"
    assert lines[2] == f"  copy    {base}/test_resnet-v0.tar.gz  <- {base}/test_resnet.tar.gz  (server-side, new)"
    assert lines[3] == f"  copy    {base}/test_resnet-v1.tar.gz  <- {base}/test_resnet.tar.gz  (server-side, new)"
    assert lines[-1] == "dry run: nothing was written"

    _push(s3env, artifact, copies=1)
    s3env.calls.names.clear()
    lines.clear()
    _push(s3env, artifact, copies=2, dry=True, lines=lines)
    assert [line.split()[0] for line in lines[1:4]] == ["skip", "skip", "copy"]
    assert s3env.calls.writes == 0


def _big_artifact(artifact: Path, change_tarball, size: int = 11 * MIB) -> Path:
    change_tarball(artifact, os.urandom(size))
    return artifact


def test_failed_multipart_upload_leaves_no_object_and_no_pending_upload(s3env, artifact, change_tarball):
    _big_artifact(artifact, change_tarball)

    def fail_midway(key: str, done: int) -> None:
        if done > 5 * MIB:
            raise RuntimeError("injected network failure")

    with pytest.raises(RuntimeError, match="injected"):
        _push(s3env, artifact, copies=2, settings=SMALL_PARTS, hooks=TransferHooks(on_progress=fail_midway))
    assert s3env.calls.count("CreateMultipartUpload") == 1
    assert s3env.keys() == []
    assert s3env.pending_uploads() == []


def test_ctrl_c_during_multipart_upload_leaves_nothing(s3env, artifact, change_tarball):
    _big_artifact(artifact, change_tarball)
    sent = []

    def ctrl_c(key: str, done: int) -> None:
        if done > 5 * MIB and not sent:
            sent.append(done)
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        _push(s3env, artifact, settings=SMALL_PARTS, hooks=TransferHooks(on_progress=ctrl_c))
    assert sent
    assert s3env.keys() == []
    assert s3env.pending_uploads() == []


def test_large_upload_is_multipart_with_progress_lines(s3env, artifact, change_tarball):
    import io

    _big_artifact(artifact, change_tarball)
    stream = io.StringIO()
    result = _push(s3env, artifact, settings=SMALL_PARTS, reporter=Reporter(stream=stream))
    assert s3env.calls.count("UploadPart") == 3 and s3env.calls.count("PutObject") == 0
    progress = [line for line in stream.getvalue().splitlines() if "%" in line]
    assert progress and "uploading models/r/test_resnet.tar.gz" in progress[0] and "MiB/s" in progress[0]
    assert result.verified == ("models/r/test_resnet.tar.gz",)


def test_object_changed_between_write_and_verify_is_a_clear_error(s3env, artifact):
    def tamper(key: str) -> None:
        s3env.client.put_object(Bucket=s3env.bucket, Key=key, Body=b"someone else's bytes")

    with pytest.raises(VerificationError) as caught:
        _push(s3env, artifact, hooks=TransferHooks(after_write=tamper))
    message = str(caught.value)
    assert "does not match what was written" in message and "re-run 'mme push'" in message
    assert "\n" not in message and caught.value.exit_code == 3
    # a second push repairs it
    s3env.calls.names.clear()
    result = _push(s3env, artifact)
    assert result.uploaded == ("models/r/test_resnet.tar.gz",)


def test_stale_copies_beyond_copies_are_reported(s3env, artifact):
    _push(s3env, artifact, copies=3)
    stream = __import__("io").StringIO()
    _push(s3env, artifact, copies=1, reporter=Reporter(stream=stream))
    assert "2 copies from an earlier push" in stream.getvalue()


def test_a_prefix_with_copies_numbered_from_one_gets_a_warning_naming_the_change(s3env, artifact):
    """A prefix laid out before copies were numbered from 0 (-v1 ... -vN): the push says so in one
    line and adds -v0, so the article's notebook and Locust file find every copy they ask for."""
    import io

    for i in (1, 2):  # an earlier layout: -v1, -v2
        s3env.client.put_object(Bucket=s3env.bucket, Key=f"old/test_resnet-v{i}.tar.gz", Body=b"x")
    stream = io.StringIO()
    _push(s3env, artifact, "old", copies=2, reporter=Reporter(stream=stream))
    warnings = [line for line in stream.getvalue().splitlines() if "numbered from 1" in line]
    assert len(warnings) == 1 and "test_resnet-v1 ... test_resnet-v2" in warnings[0] and "test_resnet-v0" in warnings[0]
    assert "old/test_resnet-v0.tar.gz" in s3env.keys("old/")
    stream = io.StringIO()
    _push(s3env, artifact, "old", copies=3, reporter=Reporter(stream=stream))
    assert "numbered from 1" not in stream.getvalue()  # -v0 is there now


def test_push_with_an_instance_type_says_which_host_image_runs_the_release(s3env, artifact):
    lines: list[str] = []
    stream = __import__("io").StringIO()
    request = PushRequest(artifact, S3Uri.parse(f"s3://{s3env.bucket}/h"), allow_random_weights=True, dry_run=True,
                          instance_type="ml.g5.2xlarge")
    push(s3env.client, request, Reporter(stream=stream), out=lines.append)
    host = next(line for line in lines if line.startswith("  host: "))
    assert host.startswith("  host: al2023-ami-sagemaker-inference-gpu-4-1 (driver 580, CUDA 13.0): release 25.09")
    assert "CUDA" not in stream.getvalue(), "a release whose CUDA is known and runs there is not warned about"
    # the user's own image: its CUDA is unknown, so a warning instead of a refusal
    own = PushRequest(artifact, S3Uri.parse(f"s3://{s3env.bucket}/h"), allow_random_weights=True, dry_run=True,
                      instance_type="ml.g5.2xlarge", image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/mine:1")
    warned = __import__("io").StringIO()
    push(s3env.client, own, Reporter(stream=warned), out=lines.append)
    assert "the CUDA of your image 123456789012.dkr.ecr.us-east-1.amazonaws.com/mine:1 is unknown" in warned.getvalue()
    assert "mme deploy --inference-ami-version" in warned.getvalue()
    assert s3env.calls.writes == 0


def test_push_refuses_a_release_no_sagemaker_host_image_starts(monkeypatch, artifact):
    from serving.deploy import s3push

    future = versions.Release("27.01", "nvcr.io/nvidia/tritonserver:27.01-py3", "sagemaker-tritonserver:27.01-py3",
                              "2.80.0", cuda="14.0.0", sagemaker=True)
    with pytest.raises(MmeError) as info:
        s3push.check_push_host(future, "ml.g5.2xlarge", None, Reporter(quiet=True))
    message = str(info.value)
    assert "\n" not in message and "release 27.01 needs CUDA 14.0.0" in message
    assert "no InferenceAmiVersion runs it natively or by minor-version compatibility" in message
    assert message.endswith("compatibility (newest: al2023-ami-sagemaker-inference-gpu-4-1 (driver 580, CUDA 13.0)); "
                            "package for a release whose CUDA it runs (--triton-release 22.10)")
    assert s3push.check_push_host(future, None, None, Reporter(quiet=True)) is None  # no --instance-type: no check
    assert s3push.check_push_host(future, "ml.c5.xlarge", None, Reporter(quiet=True)).how == "no NVIDIA GPU"


def test_cli_push_then_deploy_dry_run_prints_the_exact_plan(s3env, artifact, run_cli, tmp_path, monkeypatch):
    import boto3

    created: list[str] = []
    real_client = boto3.session.Session.client

    def recording_client(self, service, *args, **kwargs):
        created.append(service)
        return real_client(self, service, *args, **kwargs)

    monkeypatch.setattr(boto3.session.Session, "client", recording_client)
    uri = f"s3://{s3env.bucket}/mme/resnet"
    code, out, err = run_cli("push", str(artifact), "--s3", uri, "--copies", "2", "--allow-random-weights",
                             "--endpoint-url", s3env.url)
    assert code == 0, err
    assert out.splitlines()[1].startswith("  upload  ") and out.splitlines()[-1].startswith(f"pushed {uri}/")

    state_dir = tmp_path / "state"
    code, out, err = run_cli("deploy", "--s3", uri, "--instance-type", "ml.g5.2xlarge", "--role",
                             "arn:aws:iam::123456789012:role/SageMakerExecution", "--dry-run", "--state-dir", str(state_dir),
                             "--endpoint-url", s3env.url)
    assert code == 0, err
    assert "sagemaker" not in created, "a dry run makes no SageMaker call"
    assert not state_dir.exists(), "a dry run writes no state"
    lines = out.splitlines()
    assert lines[0] == "deploy plan: endpoint mme-resnet in us-east-1 (multi-model, ml.g5.2xlarge)"
    assert lines[1] == f"  model data: {uri}/"
    release = Manifest.load(artifact).triton.release
    image = triton_image_uri("us-east-1", release)  # the pushed artifacts' release, from their metadata
    assert image.startswith("763104351884.dkr.ecr.us-east-1.amazonaws.com/sagemaker-tritonserver:")
    assert lines[2] == f"  image:      {image}"
    # the release's CUDA against ml.g5's host: its default host (driver 470) cannot start it, so the
    # variant gets the host image that can, and the plan says which and why in one line
    cuda = versions.release(release).cuda
    assert release == versions.default_release_name() == "25.09"
    assert lines[3] == (f"  host: al2023-ami-sagemaker-inference-gpu-4-1 (driver 580, CUDA 13.0): release {release} needs "
                        f"CUDA {cuda}, which driver 580 runs natively; InferenceAmiVersion set because ml.g5's default "
                        "host (driver 470, CUDA 11.4) cannot start it")
    start = lines.index("  requests, in order:") + 1
    requests = json.loads("\n".join(lines[start:-1]))
    assert lines[-1] == "dry run: nothing was created"
    assert requests["CreateModel"]["PrimaryContainer"] == {
        "Image": image,
        "Mode": "MultiModel",
        "ModelDataUrl": f"{uri}/",
    }
    assert requests["CreateModel"]["ExecutionRoleArn"] == "arn:aws:iam::123456789012:role/SageMakerExecution"
    variant = requests["CreateEndpointConfig"]["ProductionVariants"]
    assert variant == [{"VariantName": "AllTraffic", "ModelName": "mme-resnet-model", "InstanceType": "ml.g5.2xlarge",
                        "InitialInstanceCount": 1, "InitialVariantWeight": 1.0,
                        "InferenceAmiVersion": "al2023-ami-sagemaker-inference-gpu-4-1"}]
    assert requests["CreateEndpoint"]["EndpointConfigName"] == "mme-resnet-config"
    _validate_against_service_model(requests)


def _validate_against_service_model(requests: dict) -> None:
    import botocore.session
    from botocore.validate import validate_parameters

    model = botocore.session.get_session().get_service_model("sagemaker")
    for operation, params in requests.items():
        validate_parameters(params, model.operation_model(operation).input_shape)
