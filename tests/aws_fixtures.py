"""Fixtures for the cloud commands: a real moto S3 server over HTTP, dummy credentials,
stubbed SageMaker / CloudWatch clients (botocore's Stubber checks every request against
the service model), artifact copies to change, and the command line run in-process."""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import pytest

ROLE = "arn:aws:iam::123456789012:role/SageMakerExecution"


@pytest.fixture(scope="session")
def moto_url(moto_server) -> str:
    return moto_server.endpoint_url


@dataclass
class Calls:
    """Counts S3 operations a client sends (PutObject/UploadPart carry bodies; copies do not)."""

    names: list[str] = field(default_factory=list)

    def count(self, *operations: str) -> int:
        return sum(1 for n in self.names if n in operations)

    @property
    def bodies(self) -> int:
        return self.count("PutObject", "UploadPart")

    @property
    def copies(self) -> int:
        return self.count("CopyObject", "UploadPartCopy")

    @property
    def writes(self) -> int:
        return self.count("PutObject", "UploadPart", "CopyObject", "UploadPartCopy", "CreateMultipartUpload",
                          "CompleteMultipartUpload", "DeleteObject", "DeleteObjects")


@dataclass(frozen=True)
class S3Env:
    url: str
    client: object
    bucket: str
    calls: Calls

    def keys(self, prefix: str = "") -> list[str]:
        reply = self.client.list_objects_v2(Bucket=self.bucket, Prefix=prefix)
        return sorted(o["Key"] for o in reply.get("Contents", ()))

    def pending_uploads(self) -> list:
        return list(self.client.list_multipart_uploads(Bucket=self.bucket).get("Uploads", ()))


@pytest.fixture
def s3env(aws_env, moto_url: str) -> S3Env:
    """A fresh bucket on the moto server and a client that counts what it sends."""
    import boto3

    client = boto3.session.Session().client("s3", endpoint_url=moto_url)
    bucket = f"mme-test-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=bucket)
    calls = Calls()
    client.meta.events.register("before-call.s3", lambda model, **_: calls.names.append(model.name))
    return S3Env(moto_url, client, bucket, calls)


@pytest.fixture
def artifact(test_resnet_cpu_local, tmp_path: Path) -> Path:
    """A private copy of the packaged test_resnet (cpu-local, weights: random) that tests may change."""
    source, _ = test_resnet_cpu_local
    dest = tmp_path / "artifacts" / "test_resnet" / "cpu-local"
    shutil.copytree(source, dest)
    return dest


def rewrite_tarball(directory: Path, data: bytes) -> None:
    """Replace an artifact's tarball and record it in the manifest, as a re-package would."""
    from mme.fsutil import sha256_of
    from packager.manifest import Manifest
    from packager.manifest_records import FileEntry

    manifest = Manifest.load(directory)
    tarball = directory / manifest.tarball
    tarball.write_bytes(data)
    files = tuple(FileEntry(e.path, sha256_of(tarball), tarball.stat().st_size) if e.path == manifest.tarball else e
                  for e in manifest.files)
    replace(manifest, files=files).write(directory)


@pytest.fixture
def change_tarball() -> Callable[[Path, bytes], None]:
    return rewrite_tarball


@pytest.fixture
def onnx_artifact(artifact: Path) -> Path:
    """The copy turned into an onnx-format artifact (same model.onnx, onnxruntime config), for compile tests."""
    from packager.manifest import Manifest

    manifest = Manifest.load(artifact)
    manifest = replace(manifest, format="onnx", triton=replace(manifest.triton, platform="onnxruntime_onnx", backend=None,
                                                               instance_kind="KIND_GPU"))
    model_dir = artifact / manifest.model
    (model_dir / "1" / "model.py").unlink()
    (model_dir / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 16\n'
        'input { name: "pixel_values" data_type: TYPE_FP32 dims: [3, 160, 160] }\n'
        'output { name: "logits" data_type: TYPE_FP32 dims: [1000] }\n'
        'instance_group { count: 1 kind: KIND_GPU }\ndynamic_batching { max_queue_delay_microseconds: 100 }\n'
    )
    manifest.write(artifact)
    onnx_dir = artifact.parent / "onnx"
    artifact.rename(onnx_dir)
    return onnx_dir


@pytest.fixture
def stubbed(aws_env):
    """stubbed(service) -> (client, Stubber), activated; pending responses are checked by the test."""
    import boto3
    from botocore.stub import Stubber

    stubs = []

    def make(service: str):
        client = boto3.session.Session(region_name="us-east-1").client(service)
        stub = Stubber(client)
        stub.activate()
        stubs.append(stub)
        return client, stub

    yield make
    for stub in stubs:
        stub.deactivate()


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch, capsys):
    """run_cli(*argv) -> (exit code, stdout, stderr): ``mme`` with the cloud commands, in-process."""
    import mme.cli

    monkeypatch.setattr(mme.cli, "COMMAND_MODULES", ("mme.cli.aws",))

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = mme.cli.main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


class FakeClock:
    """sleep() advances the clock instead of waiting; optional hook per sleep."""

    def __init__(self, on_sleep: Callable[[int], None] | None = None) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []
        self.on_sleep = on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(len(self.sleeps))


@pytest.fixture
def fake_clock() -> Callable[..., FakeClock]:
    return FakeClock


LOCAL_CLOUD_BUCKET = "mme-cloud-test"


@pytest.fixture
def local_cloud(aws_env, monkeypatch: pytest.MonkeyPatch):
    """A local SageMaker (mme cloud) on a free port, with the bucket LOCAL_CLOUD_BUCKET; boto3 and
    every mme command pointed at it as a user would, by the standard endpoint variables only.
    Every endpoint it ran is gone afterwards."""
    import boto3

    from serving.cloud.hosting import CloudOptions
    from serving.cloud.server import LocalCloud

    options = CloudOptions(port=0, metrics_interval_s=0.5)  # each instance's limit: its type's GPU memory
    with LocalCloud(options) as running:
        for name, value in running.environment().items():
            monkeypatch.setenv(name, value)
        boto3.client("s3").create_bucket(Bucket=LOCAL_CLOUD_BUCKET)
        yield running
    assert running.hosting is not None and running.hosting.running() == []
