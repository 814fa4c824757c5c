"""`mme serve --instances 2` as a user starts it, load-tested by `mme bench` through the router:
every request answered, each copy served by the one instance holding it, the endpoint's metrics
(summed over the instances) read by the bench as one endpoint's."""

from __future__ import annotations

import pytest

import requests

from tests.bench.helpers import run_bench, saved_run, served_in_background

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def test_bench_through_a_two_instance_endpoint(test_resnet_cpu_local, tmp_path):
    artifact_dir, _ = test_resnet_cpu_local
    with served_in_background(artifact_dir, tmp_path, "--instances", "2", "--copies", "4") as (url, banner):
        assert "on 2 instances" in banner and "instance 0: http://127.0.0.1:" in banner and "instance 1:" in banner
        completed = run_bench("--endpoint", "local", "--endpoint-url", url, "--artifact", str(artifact_dir),
                              "--copies", "4", "--shape", "constant", "--users", "2", "--duration", "4", "--warmup",
                              "--out", str(tmp_path / "results"))
        run = saved_run(completed)
        assert run.requests and all(r.ok for r in run.requests), completed.stderr
        assert run.info.extra["warmup"]["targets"] == 4 and run.info.extra["warmup"]["failed"] == 0
        assert {r.target for r in run.requests} <= {f"test_resnet-v{i}.tar.gz" for i in range(4)}
        assert not any(r.cold for r in run.requests), "each request went to the instance the warm-up loaded it on"
        models = requests.get(f"{url}/models", timeout=10).json()["models"]
        assert len(models) == 4 and {m["instance"] for m in models} <= {0, 1}
        last = run.metrics[-1]["snapshot"]
        assert last["instance_count"] == 2
        assert last["counts"]["ModelLoads"] == 4, "one load per copy: later requests went to the instance holding it"
