"""A short bench against the real local endpoint (`mme serve`: the front, a real Triton, three
copies of a packaged model) with the fast client: what run.json, requests.csv, stages.csv and
endpoint_metrics.jsonl hold afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from bench.analysis import analyse
from bench.results import ENDPOINT_METRICS_FILE, REQUESTS_FILE, RUN_FILE, STAGES_FILE
from tests.bench.helpers import ROOT, bench_env, free_port, run_bench, saved_run
from serving.runtime.reply_headers import COLD_HEADER
from tests.conftest import serving_process

STARTUP_TIMEOUT_S = 60.0

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


@pytest.fixture(scope="module")
def local_endpoint(test_resnet_cpu_local):
    artifact_dir, _ = test_resnet_cpu_local
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "mme", "-q", "serve", "--models", str(artifact_dir), "--port", str(port),
               "--server", "local", "--copies", "3", "--allow-unsigned"]
    with serving_process(command, f"{url}/ping", what="mme serve", timeout_s=STARTUP_TIMEOUT_S, cwd=ROOT,
                         env=bench_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True):
        warm_up(url, artifact_dir)
        yield artifact_dir, url


def warm_up(url: str, artifact_dir) -> None:
    """Load the three copies first (a few seconds each on two cores), so the short bench measures
    a warm endpoint and every copy is loaded when it snapshots the metrics."""
    body = (artifact_dir / "sample_request.json").read_bytes()

    def invoke(i: int) -> tuple[int, str | None]:
        request = urllib.request.Request(f"{url}/endpoints/local/invocations", data=body, method="POST", headers={
            "Content-Type": "application/json", "X-Amzn-SageMaker-Target-Model": f"test_resnet-v{i}.tar.gz"})
        with urllib.request.urlopen(request, timeout=STARTUP_TIMEOUT_S) as response:
            return response.status, response.headers.get(COLD_HEADER)

    with ThreadPoolExecutor(3) as pool:  # each copy's first request waits for its load: cold, and said so
        assert list(pool.map(invoke, (0, 1, 2))) == [(200, "1")] * 3  # -v0 ... -v2
    assert invoke(1) == (200, "0")


def test_short_bench_against_the_local_endpoint(local_endpoint, tmp_path):
    artifact_dir, url = local_endpoint
    shape = tmp_path / "shape.json"
    shape.write_text(json.dumps([{"duration": 3, "users": 2, "spawn_rate": 4},
                                 {"duration": 6, "users": 4, "spawn_rate": 4}]))
    completed = run_bench("--endpoint", "local", "--endpoint-url", url, "--artifact", str(artifact_dir),
                          "--copies", "3", "--shape", f"file:{shape}", "--progress-interval", "2",
                          "--out", str(tmp_path / "results"))
    run = saved_run(completed)

    # run.json
    info = run.info
    assert run.directory.parent == tmp_path / "results" and run.directory.name.endswith("-test_resnet")
    assert info.run_id == run.directory.name
    assert (info.endpoint, info.endpoint_url, info.mode, info.model, info.format) == ("local", url, "multi", "test_resnet", "cpu-local")
    assert (info.copies, info.target_distribution, info.client, info.workers) == (3, "uniform", "fast", 1)
    assert info.instance_type == "local" and info.content_type == "application/json"
    assert info.payload_bytes == (artifact_dir / "sample_request.json").stat().st_size
    assert info.stopped_reason == "completed" and info.started_at and info.ended_at
    assert info.models_loaded == 3
    assert info.extra["requests"] == len(run.requests) and info.extra["failures"] == 0

    # requests.csv: every request answered, spread over the three copies
    assert len(run.requests) > 30
    assert all(r.ok == 1 and r.status == 200 and r.error == "" for r in run.requests)
    assert all(r.cold == 0 for r in run.requests)  # warmed up: the endpoint says each request was warm
    targets = Counter(r.target for r in run.requests)
    assert set(targets) == {f"test_resnet-v{i}.tar.gz" for i in (0, 1, 2)}
    assert min(targets.values()) >= len(run.requests) / 8
    assert {r.stage for r in run.requests} == {0, 1}
    assert {r.users for r in run.requests if r.stage == 0} == {2}
    assert max(r.users for r in run.requests if r.stage == 1) == 4
    assert all(0 <= r.t < 6.5 and r.latency_ms > 0 for r in run.requests)

    # stages.csv
    assert [(s.stage, s.users) for s in run.stages] == [(0, 2), (1, 4)]
    assert run.stages[0].start_t == pytest.approx(0, abs=0.05) and run.stages[0].end_t == pytest.approx(3, abs=0.3)
    assert run.stages[1].end_t == pytest.approx(6, abs=0.4)
    assert all(0 < s.generator_cpu_max < 90 and s.saturated == 0 for s in run.stages)

    # endpoint_metrics.jsonl: the local endpoint's /metrics.json before the run, at each stage end,
    # and the last stage's again once the drain is over
    assert [(m["stage"], m["at"]) for m in run.metrics] == [(-1, "start"), (0, "end"), (1, "end"), (1, "end")]
    assert run.metrics[0]["t"] <= 0 < run.metrics[1]["t"]
    served = (run.metrics[-1]["snapshot"]["counts"]["Invocations"]
              - run.metrics[0]["snapshot"]["counts"].get("Invocations", 0))
    assert served == len(run.requests)  # every request the endpoint answered during the run is recorded
    # stage 0's endpoint figures are the run's own: the warm-up's three loads came before the baseline
    first = analyse(run.directory).stages[0]
    assert (first.model_loads, first.cache_misses, first.model_evictions) == (0, 0, 0)
    assert first.cache_hits and first.invocations_ok
    last = run.metrics[-1]["snapshot"]
    assert last["gauges"]["LoadedModelCount"] == 3
    assert len(last["loaded_models"]) == 3

    # Locust's own CSVs next to ours
    for name in (RUN_FILE, REQUESTS_FILE, STAGES_FILE, ENDPOINT_METRICS_FILE, "locust_stats.csv",
                 "locust_stats_history.csv", "locust_failures.csv"):
        assert (run.directory / name).exists(), name
    assert "stage 2/2 done" in completed.stderr and "completed after" in completed.stderr
    assert completed.stdout.strip() == str(run.directory)
