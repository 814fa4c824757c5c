"""``mme capacity --endpoint``: the copy-counting loop against a deployed endpoint, run here
against the real local MME (Triton, python backend) serving from a moto S3 prefix. No GPU:
the gpu-metrics model reports the resident memory of the Triton process tree."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from sizing.capacity_remote import (
    HOST_KIND, METRICS_TARBALL, EndpointInvoker, RemoteCapacityRequest, build_metrics_tarball,
    measure_remote_capacity, runtime_client,
)
from mme.aws.session import S3Uri

PREFIX = "mme/models"


def run_mme(capsys, *argv: str) -> tuple[int, str, str]:
    import mme.cli

    capsys.readouterr()
    code = mme.cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def local_mme(s3env):
    """The local MME (real Triton) serving s3://<bucket>/mme/models from moto."""
    from serving.runtime.local_endpoint import LocalEndpoint, LocalEndpointOptions

    options = LocalEndpointOptions(models=f"s3://{s3env.bucket}/{PREFIX}", port=0, server_kind="local",
                                   s3_endpoint_url=s3env.url)
    with LocalEndpoint(options) as endpoint:
        yield endpoint


def test_metrics_tarball_is_deterministic_and_named(tmp_path: Path) -> None:
    a = build_metrics_tarball(tmp_path / "a")
    b = build_metrics_tarball(tmp_path / "b")
    assert a.name == METRICS_TARBALL and a.read_bytes() == b.read_bytes()
    with tarfile.open(a) as tar:
        names = tar.getnames()
        config = tar.extractfile("gpu-metrics/config.pbtxt").read().decode()
    assert names == ["gpu-metrics", "gpu-metrics/1", "gpu-metrics/1/model.py", "gpu-metrics/config.pbtxt"]
    assert 'backend: "python"' in config and "name:" not in config.split("input")[0]


def test_remote_loop_against_local_mme(s3env, artifact: Path, local_mme, tmp_path: Path, capsys) -> None:
    import boto3

    destination = S3Uri.parse(f"s3://{s3env.bucket}/{PREFIX}")
    invoker = EndpointInvoker(runtime_client(boto3.session.Session(region_name="us-east-1"), local_mme.url), "local")
    request = RemoteCapacityRequest("local", destination, artifact, threshold=0.9, max_copies=3)
    result = measure_remote_capacity(s3env.client, invoker, request)
    report = result.report

    # The metrics model ran in the local Triton and, without a GPU, read the process tree with psutil.
    assert result.source == "host-rss:psutil" and report.memory_kind == HOST_KIND
    assert result.stopped == "max-copies" and [s.copies for s in report.steps] == [1, 2, 3]
    memories = [report.baseline_bytes] + [s.memory_bytes for s in report.steps]
    assert all(later > earlier for earlier, later in zip(memories, memories[1:])), memories
    assert report.footprint_min_bytes > 4 * 2**20  # each copy is a python-backend stub with ONNX Runtime
    assert report.actual_copies == 3 and report.predicted_copies >= 3
    # the first copy apart (on a GPU it carries the one-time start-up), per copy from copies 2-3
    assert report.first_copy_bytes == report.steps[0].delta_bytes
    assert report.per_copy_basis == "copies 2-3, after the first"
    assert report.footprint_mean_bytes == (report.steps[1].delta_bytes + report.steps[2].delta_bytes) // 2
    assert 0 < report.baseline_bytes < report.limit_bytes
    # Copies by server-side copy only: the base tarball and the metrics model are the only bodies sent.
    assert s3env.calls.copies == 3 and s3env.calls.count("PutObject") == 2
    keys = s3env.keys(PREFIX)
    assert keys == sorted(f"{PREFIX}/{n}" for n in ("test_resnet.tar.gz", METRICS_TARBALL, "test_resnet-v0.tar.gz",
                                                     "test_resnet-v1.tar.gz", "test_resnet-v2.tar.gz"))
    copy_meta = s3env.client.head_object(Bucket=s3env.bucket, Key=f"{PREFIX}/test_resnet-v2.tar.gz")["Metadata"]
    assert copy_meta["mme-copy-of"] == "test_resnet.tar.gz"

    # The threshold stops the loop: one already-loaded copy is enough to be above a tiny share.
    tiny = measure_remote_capacity(s3env.client, invoker,
                                   RemoteCapacityRequest("local", destination, artifact, threshold=1e-6, max_copies=5))
    assert tiny.stopped == "threshold" and len(tiny.report.steps) == 1 and tiny.report.actual_copies == 0
    assert tiny.reused == (f"{PREFIX}/test_resnet-v0.tar.gz",) and not tiny.copied

    # The command line: existing copies are reused, the fourth one is made, the report is written.
    out = tmp_path / "results"
    code, stdout, stderr = run_mme(
        capsys, "capacity", "--endpoint", "local", "--endpoint-url", local_mme.url, "--region", "us-east-1",
        "--s3", destination.url(), "--s3-endpoint-url", s3env.url, "--artifact", str(artifact),
        "--max-copies", "4", "--out", str(out),
    )
    assert code == 0, stderr
    assert "1 created by server-side copy, 3 already in" in stdout and "stopped at max-copies" in stdout
    assert HOST_KIND in stdout and "copy   4:" in stderr + stdout
    assert "copy 1 added almost nothing: it was probably loaded already" in stderr
    saved = json.loads((out / "capacity_test_resnet_cpu-local.json").read_text())
    assert saved["memory_kind"] == HOST_KIND and len(saved["steps"]) == 4 and saved["actual_copies"] == 4
    # Copies 1-3 (-v0 ... -v2) were loaded by the first run: only copy 4 (-v3)'s growth is a footprint.
    assert saved["footprint_min_bytes"] == saved["footprint_max_bytes"] == saved["steps"][3]["delta_bytes"] > 4 * 2**20
    # copy 1 was not measured in this run: its one-time start-up is in the baseline, and the report says so
    assert saved["first_copy_bytes"] is None and "copy 1 was loaded before" in saved["per_copy_basis"]
    assert "first copy: not measured" in stdout
    assert f"{PREFIX}/test_resnet-v3.tar.gz" in s3env.keys(PREFIX)


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        ((), "pass ARTIFACT"),
        (("a", "--s3", "s3://b/p"), "--s3 only apply with --endpoint"),
        (("--endpoint", "e", "--artifact", "a"), "needs --s3"),
        (("--endpoint", "e", "--s3", "s3://bucket/p"), "needs ARTIFACT"),
        (("art", "--endpoint", "e", "--s3", "s3://bucket/p", "--artifact", "other"), "differ; give the artifact once"),
        (("--endpoint", "e", "--s3", "s3://bucket/p", "--artifact", "a", "--cycles", "2", "--no-verify"),
         "--no-verify, --cycles only apply to the local loop"),
        (("--endpoint", "e", "--s3", "bucket/p", "--artifact", "a"), "is not an S3 URI"),
        (("--endpoint", "e", "--s3", "s3://bucket/p", "--artifact", "a", "--threshold", "1.5"), "must be a fraction"),
    ],
)
def test_bad_combinations_are_one_line_errors(argv, wanted, aws_env, capsys) -> None:
    code, stdout, stderr = run_mme(capsys, "capacity", *argv)
    assert code == 2 and stdout == ""
    assert wanted in stderr and stderr.count("\n") == 1 and stderr.startswith("mme: error: "), stderr


def test_missing_artifact_and_unreachable_endpoint(s3env, artifact: Path, tmp_path: Path, capsys) -> None:
    common = ("capacity", "--endpoint", "nowhere", "--endpoint-url", "http://127.0.0.1:9", "--s3",
              f"s3://{s3env.bucket}/{PREFIX}", "--s3-endpoint-url", s3env.url, "--out", str(tmp_path))
    code, _, stderr = run_mme(capsys, *common, "--artifact", str(tmp_path / "absent"))
    assert code == 2 and "does not exist" in stderr and stderr.count("\n") == 1
    code, _, stderr = run_mme(capsys, *common, "--artifact", str(artifact))
    errors = [line for line in stderr.splitlines() if line.startswith("mme: error: ")]
    assert code == 2 and len(errors) == 1 and "endpoint 'nowhere'" in errors[0] and "Traceback" not in stderr, stderr


def _load_metrics_module(monkeypatch):
    """metrics_model/model.py imported outside Triton (a stand-in for triton_python_backend_utils)."""
    import importlib.util
    import sys
    import types
    from importlib import resources

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    path = resources.files("serving").joinpath("metrics_model/model.py")
    spec = importlib.util.spec_from_file_location("mme_gpu_metrics_model", str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_metrics_fallbacks_agree(monkeypatch) -> None:
    """Without psutil the model reads /proc: the same process tree, about the same bytes."""
    import os

    import psutil

    module = _load_metrics_module(monkeypatch)
    used_psutil, total_psutil = module._host_psutil(os.getpid())
    used_proc, total_proc = module._host_proc(os.getpid())
    assert total_proc == total_psutil == psutil.virtual_memory().total
    assert abs(used_proc - used_psutil) < 0.1 * used_psutil
    monkeypatch.setenv("MME_METRICS_SOURCE", "host")
    used, total, source = module.read_memory()
    assert source == "host-rss:psutil" and 0 < used < total
