"""Distributed runs: a Locust master with local worker processes (--workers 2), and a remote
worker joining with `mme bench-worker`. Every request record reaches the master, so one
requests.csv covers all workers and its percentiles are exact."""

from __future__ import annotations

import pytest

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tests.bench.fake_endpoint import FakeEndpoint
from tests.bench.helpers import ROOT, bench_command, bench_env, free_port, read_run, run_bench, saved_run

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def test_two_workers_one_combined_requests_csv(tmp_path):
    body = tmp_path / "body.json"
    body.write_text("{}")
    with FakeEndpoint() as endpoint:
        run = saved_run(run_bench("--endpoint", "e", "--endpoint-url", endpoint.url, "--payload", str(body),
                                  "--model", "m", "--copies", "3", "--shape", "constant", "--users", "4",
                                  "--duration", "3", "--workers", "2", "--out", str(tmp_path / "out"), timeout=120))
        served = endpoint.state.requests
    assert run.info.workers == 2 and run.info.stopped_reason == "completed"
    per_worker = Counter(r.worker for r in run.requests)
    assert len(per_worker) == 2 and min(per_worker.values()) > 5
    assert sorted(run.info.extra["generators"]) == sorted(per_worker)
    assert all(r.ok for r in run.requests)
    assert len(run.requests) == served  # nothing lost between workers and master
    assert max(r.users for r in run.requests) == 4
    assert {r.target for r in run.requests} == {"m-v0.tar.gz", "m-v1.tar.gz", "m-v2.tar.gz"}
    assert len(run.stages) == 1 and run.stages[0].generator_cpu_max > 0
    locust_total = (run.directory / "locust_stats.csv").read_text().splitlines()[-1].split(",")
    assert locust_total[1] == "Aggregated" and int(locust_total[2]) == len(run.requests)


def test_a_remote_worker_joins_with_mme_bench_worker(tmp_path):
    port = free_port()
    with FakeEndpoint() as endpoint:
        master = subprocess.Popen(bench_command("--endpoint", "e", "--endpoint-url", endpoint.url, "--mode", "single",
                                                "--shape", "constant", "--users", "2", "--duration", "2",
                                                "--expect-workers", "1", "--master-port", str(port), "--worker-token", "shared-secret",
                                                "--out", str(tmp_path)),
                                  cwd=ROOT, env=bench_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
        worker = subprocess.Popen([sys.executable, "-m", "mme", "bench-worker", "--master-host", "127.0.0.1",
                                   "--master-port", str(port), "--token", "shared-secret"], cwd=ROOT, env=bench_env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = master.communicate(timeout=90)
            worker_rc = worker.wait(timeout=30)
        finally:
            for process in (master, worker):
                if process.poll() is None:
                    process.kill()
    assert master.returncode == 0, err
    assert worker_rc == 0
    run = read_run(Path(out.strip().splitlines()[-1]))
    assert run.info.workers == 1 and run.requests and all(r.ok for r in run.requests)
    assert len({r.worker for r in run.requests}) == 1 and "waiting for 1 remote worker" in err
