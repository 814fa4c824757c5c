"""The first article's own Locust file (tests/fixtures/article/locust_benchmark_sm.py, unchanged)
runs against `mme serve --copies 3` as the article's users run it, with no failed request.

Nothing of the file is changed or imported: Locust loads it in its own process, its boto3
``sagemaker-runtime`` client is pointed at the local endpoint only through boto3's standard
per-service endpoint variable (AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME), and its body is the article
notebook's payload (a KServe v2 JSON request of random pixels) sent as application/octet-stream to
TargetModel ``<model>-v0..v2.tar.gz``, the copies ``--copies 3`` answers for.

The file's StagesShape drives the users (10 in the first 30 s, up to 200 over 340 s). Locust
ignores --run-time when a shape class does not set ``use_common_options`` (it says so at start),
so the run is stopped as a user stops it, with Ctrl-C (SIGINT), inside the first stage; Locust
then prints and saves its stats and exits 0 unless a request failed."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from mme.process import child_env

from tests.bench.helpers import served_in_background

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration

ARTICLE_LOCUSTFILE = Path(__file__).resolve().parents[1] / "fixtures" / "article" / "locust_benchmark_sm.py"
ENDPOINT = "mme-cv-benchmark-pt"  # the Locust file's default --endpoint-name
COPIES = 3
RUN_S = 20.0  # inside the shape's first stage (30 s at 10 users)


def article_payload(packaged) -> str:
    """The body the article's notebook writes to sample_payload.json for a CV model: one input,
    shape [1, *dims], ``np.random.rand(*dims).tolist()`` as its data (named and sized here from
    the packaged model's manifest instead of the notebook's INPUT__0 of 3x224x224)."""
    (tensor,) = packaged.manifest.inputs
    data = np.random.default_rng(0).random(tensor.dims).tolist()
    return json.dumps({"inputs": [{"name": tensor.name, "shape": [1, *tensor.dims], "datatype": tensor.datatype,
                                   "data": data}]})


def _sigint_default() -> None:
    # Locust stops on Ctrl-C only if SIGINT reaches it: a shell's background job is started with
    # SIGINT ignored, and an ignored signal stays ignored across exec.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def aggregated(stats_csv: Path) -> dict[str, str]:
    with stats_csv.open(newline="") as f:
        rows = [row for row in csv.DictReader(f) if row["Name"] == "Aggregated"]
    assert len(rows) == 1, stats_csv.read_text()
    return rows[0]


def data_rows(csv_file: Path) -> list[list[str]]:
    with csv_file.open(newline="") as f:
        return list(csv.reader(f))[1:]


def run_article_locust(url: str, model: str, payload: Path, out: Path) -> tuple[int, str, dict[str, str], float]:
    """The article's Locust file against the runtime at ``url``, stopped with Ctrl-C after RUN_S:
    (exit code, its output, the stats CSV's Aggregated row, seconds it ran)."""
    prefix = out / f"{model}-{COPIES}"
    out.mkdir(parents=True, exist_ok=True)
    log = out / "locust.log"
    command = [sys.executable, "-m", "locust", "-f", str(ARTICLE_LOCUSTFILE), "--headless",
               "--run-time", f"{RUN_S:.0f}s", "--endpoint-name", ENDPOINT, "--model-name", model,
               "--model-count", str(COPIES), "--use-case", "cv", "--payload", str(payload),
               "--csv", str(prefix), "--only-summary"]
    # the test's dummy credentials, and the standard variable that points an unchanged client here
    env = child_env({"AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": url})
    started = time.monotonic()
    with log.open("w") as stream:
        locust = subprocess.Popen(command, cwd=out, env=env, stdout=stream, stderr=subprocess.STDOUT,
                                  preexec_fn=_sigint_default)
        try:
            try:
                code = locust.wait(timeout=RUN_S)
                pytest.fail(f"locust exited with {code} before {RUN_S:.0f} s:\n{log.read_text()[-4000:]}")
            except subprocess.TimeoutExpired:
                pass
            locust.send_signal(signal.SIGINT)  # Ctrl-C
            code = locust.wait(timeout=120)
        finally:
            if locust.poll() is None:
                locust.kill()
                locust.wait()
    ran_s = time.monotonic() - started
    output = log.read_text()
    assert code == 0, f"locust exited with {code} after {ran_s:.0f} s:\n{output[-4000:]}"
    assert "Shape test updating to 10 users" in output, output[-4000:]  # the file's StagesShape drove the users
    assert "Found endpoint for sagemaker-runtime via: environment_service" in output, output[-4000:]
    total = aggregated(prefix.with_name(prefix.name + "_stats.csv"))
    assert data_rows(prefix.with_name(prefix.name + "_failures.csv")) == []
    assert data_rows(prefix.with_name(prefix.name + "_exceptions.csv")) == []
    return code, output, total, ran_s


def test_the_articles_locust_file_runs_unchanged_against_mme_serve_with_three_copies(packaged_test_resnet, aws_env,
                                                                                     tmp_path):
    model = packaged_test_resnet.manifest.model
    payload = tmp_path / "sample_payload.json"
    payload.write_text(article_payload(packaged_test_resnet))
    with served_in_background(packaged_test_resnet.directory, tmp_path, "--copies", str(COPIES),
                              "--endpoint-name", ENDPOINT) as (url, banner):
        targets = [f"{model}-v{i}.tar.gz" for i in range(COPIES)]
        assert all(t in banner for t in targets), banner
        _, _, total, ran_s = run_article_locust(url, model, payload, tmp_path / "results")
        with urllib.request.urlopen(f"{url}/models", timeout=10) as response:
            served = {m["target"]: m["invocations"] for m in json.load(response)["models"]}

    requests, failures = int(total["Request Count"]), int(total["Failure Count"])
    print(f"article locust file: {requests} requests, {failures} failures in {ran_s:.1f} s; per copy: {served}")
    assert requests > 20 and failures == 0, total
    # Every copy was loaded and invoked, and only the copies (Locust's stats name the model, not the copy).
    assert set(served) == set(targets) and all(n > 0 for n in served.values()), served
    assert sum(served.values()) >= requests, (served, requests)  # the CSV is saved every second: it may lag


def test_the_articles_locust_file_runs_unchanged_against_a_deployed_local_endpoint(packaged_test_resnet, aws_env,
                                                                                   monkeypatch, tmp_path):
    """The same file against what make demo-cloud deploys: 3 copies pushed with mme push, an MME
    created with mme deploy on the local SageMaker (mme cloud), invoked by its endpoint name."""
    from mme.cli import main
    from serving.cloud.hosting import CloudOptions
    from serving.cloud.server import LocalCloud

    model = packaged_test_resnet.manifest.model
    payload = tmp_path / "sample_payload.json"
    payload.write_text(article_payload(packaged_test_resnet))
    with LocalCloud(CloudOptions(port=0)) as cloud:
        for name, value in cloud.environment().items():
            monkeypatch.setenv(name, value)
        import boto3

        boto3.client("s3").create_bucket(Bucket="mme-article")
        prefix = f"s3://mme-article/{model}/"
        assert main(["push", str(packaged_test_resnet.directory), "--s3", prefix, "--copies", str(COPIES),
                     "--allow-random-weights"]) == 0
        assert main(["deploy", "--s3", prefix, "--instance-type", "ml.g5.2xlarge", "--role",
                     "arn:aws:iam::000000000000:role/article", "--name", ENDPOINT, "--poll-interval", "1",
                     "--state-dir", str(tmp_path / "state")]) == 0
        _, _, total, ran_s = run_article_locust(cloud.url, model, payload, tmp_path / "results")
        runtime = cloud.hosting.runtime_of("us-east-1", ENDPOINT)
        served = {m["target"]: m["invocations"] for m in runtime.endpoint.loaded_models()}
        assert main(["delete", "--endpoint", ENDPOINT, "--delete-s3", "--state-dir", str(tmp_path / "state")]) == 0

    requests, failures = int(total["Request Count"]), int(total["Failure Count"])
    print(f"article locust file on mme cloud: {requests} requests, {failures} failures in {ran_s:.1f} s; {served}")
    assert requests > 20 and failures == 0, total
    assert set(served) == {f"{model}-v{i}.tar.gz" for i in range(COPIES)} and all(n > 0 for n in served.values())
