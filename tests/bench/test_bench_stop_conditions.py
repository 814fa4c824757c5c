"""--stop-on-failure and --max-p95-ms end the run early and say why in run.json."""

from __future__ import annotations

import pytest

import json

from tests.bench.fake_endpoint import FakeEndpoint
from tests.bench.helpers import run_bench, saved_run

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def test_stop_on_failure_stops_at_the_first_failed_request(tmp_path):
    with FakeEndpoint(fail_after=15) as endpoint:
        completed = run_bench("--endpoint", "e", "--endpoint-url", endpoint.url, "--mode", "single", "--shape", "constant",
                              "--users", "4", "--duration", "20", "--stop-on-failure", "--max-failure-rate", "1",
                              "--out", str(tmp_path))
        run = saved_run(completed)
    assert run.info.stopped_reason == "stop-on-failure"
    failed = [r for r in run.requests if not r.ok]
    assert failed and failed[0].error == "InternalFailure" and failed[0].status == 500
    first = run.info.extra["first_failure"]
    assert first["error"] == "InternalFailure" and first["users"] == 4
    assert run.stages[-1].end_t < 10  # far short of the 20 s shape
    # In-flight requests may finish after the stop, but the run stopped right away.
    assert len(run.requests) <= 15 + 8


def test_max_p95_stops_after_the_stage_that_exceeded_it(tmp_path):
    shape = tmp_path / "shape.json"
    shape.write_text(json.dumps([{"duration": 1.5, "users": 2, "spawn_rate": 10},
                                 {"duration": 3.0, "users": 4, "spawn_rate": 10},
                                 {"duration": 30.0, "users": 6, "spawn_rate": 10}]))
    with FakeEndpoint(behaviour="slow", delay_s=0.25) as endpoint:
        completed = run_bench("--endpoint", "e", "--endpoint-url", endpoint.url, "--mode", "single",
                              "--shape", f"file:{shape}", "--max-p95-ms", "100", "--out", str(tmp_path / "out"))
        run = saved_run(completed)
    assert run.info.stopped_reason == "max-p95-ms"
    assert run.info.extra["max_p95_exceeded"]["stage"] == 0
    assert run.info.extra["max_p95_exceeded"]["p95_ms"] > 100
    assert all(r.ok for r in run.requests)
    assert len(run.stages) <= 2 and run.stages[-1].end_t < 5
    assert "stage 1/3 done" in completed.stderr


def test_a_fast_endpoint_does_not_trip_the_p95_limit(tmp_path):
    with FakeEndpoint() as endpoint:
        run = saved_run(run_bench("--endpoint", "e", "--endpoint-url", endpoint.url, "--mode", "single",
                                  "--shape", "constant", "--users", "2", "--duration", "1.5", "--max-p95-ms", "500",
                                  "--out", str(tmp_path)))
    assert run.info.stopped_reason == "completed" and "max_p95_exceeded" not in run.info.extra
