"""bench.analysis against answers computed by hand from runs built by hand."""

from __future__ import annotations

import csv
import json

import pytest

from bench.analysis import analyse
from bench.summary_io import write_summary
from mme.stats import percentile
from tests.bench.runs import RunBuilder, clean_run, staged_run

approx = pytest.approx


def test_percentile_is_linear_interpolation_between_closest_ranks():
    values = [40, 10, 30, 20]  # sorted: 10 20 30 40, positions h = 3 * q / 100
    assert percentile(values, 50) == approx(25.0)  # h 1.5
    assert percentile(values, 90) == approx(37.0)  # h 2.7
    assert percentile(values, 95) == approx(38.5)  # h 2.85
    assert percentile(values, 99) == approx(39.7)  # h 2.97
    assert percentile(values, 0) == 10 and percentile(values, 100) == 40
    assert percentile([7.5], 99) == 7.5
    assert percentile([], 50) is None


def test_stage_statistics(tmp_path):
    s = analyse(staged_run(tmp_path / "run"))
    assert [st.users for st in s.stages] == [10, 20, 40, 60]
    assert [st.requests for st in s.stages] == [4, 10, 6, 3]
    assert [st.failures for st in s.stages] == [0, 0, 2, 0]
    assert [st.successes for st in s.stages] == [4, 10, 4, 3]
    assert [st.requests_per_s for st in s.stages] == approx([0.4, 1.0, 0.6, 0.3])
    first, second, third = s.stages[:3]
    assert (first.latency_avg_ms, first.latency_min_ms, first.latency_max_ms) == approx((25.0, 10.0, 40.0))
    assert (first.latency_p50_ms, first.latency_p90_ms, first.latency_p95_ms, first.latency_p99_ms) == approx(
        (25.0, 37.0, 38.5, 39.7))
    # 5..50 step 5: h = 9q/100 -> p50 27.5, p90 x8 + 0.1*5 = 45.5, p95 45 + 0.55*5, p99 45 + 0.91*5
    assert (second.latency_p50_ms, second.latency_p90_ms, second.latency_p95_ms, second.latency_p99_ms) == approx(
        (27.5, 45.5, 47.75, 49.55))
    # latency is over successful requests only: failures (5 ms) do not pull it down
    assert (third.latency_min_ms, third.latency_p50_ms) == approx((100.0, 250.0))
    assert third.successes_per_s == approx(0.4)
    assert third.errors == "ModelError:1; no response:1"
    assert [st.saturated for st in s.stages] == [False, False, False, True]
    assert s.stages[3].generator_cpu_max == 95.0 and s.stages[3].generator_cpu_mean == 30.0
    assert not any(st.partial or st.derived for st in s.stages)
    assert not s.has_endpoint_metrics and s.stages[0].model_loads is None


def test_overall_metrics(tmp_path):
    o = analyse(staged_run(tmp_path / "run")).overall
    assert (o.requests, o.successes, o.failures) == (23, 21, 2)
    assert o.max_users_without_failure == 20  # stage 2 (40 users) had the first failures
    assert o.failed
    assert (o.first_failure_users, o.first_failure_t, o.first_failure_error) == (37, 25.0, "ModelError")
    assert o.max_error_free_rps == approx(1.0) and o.max_error_free_rps_users == 20
    assert o.max_error_free_rps_stage == 1
    assert o.lowest_p50_ms == approx(25.0) and o.lowest_p50_users == 10
    assert o.min_latency_ms == approx(5.0)
    assert o.saturated_stages == (3,)
    assert o.duration_s == approx(40.0)
    assert (o.endpoint, o.instance_type, o.format, o.stopped_reason) == ("local", "ml.g5.2xlarge", "onnx", "completed")
    assert o.models_loaded is None and not o.partial


def test_run_without_failures_and_models_loaded_from_run_json(tmp_path):
    s = analyse(clean_run(tmp_path / "run", models_loaded=46))
    o = s.overall
    assert not o.failed and o.first_failure_users is None
    assert o.max_users_without_failure == 40
    # 20, 40, 60 requests in 10 s stages
    assert o.max_error_free_rps == approx(6.0) and o.max_error_free_rps_users == 40
    assert (o.models_loaded, o.models_loaded_source) == (46, "run.json")
    assert o.lowest_p50_ms == approx(8.0)


def test_summary_files(tmp_path):
    s = analyse(staged_run(tmp_path / "run"))
    csv_path, json_path = write_summary(s)
    rows = list(csv.DictReader(csv_path.open()))
    assert len(rows) == 4
    assert rows[0]["users"] == "10" and rows[0]["latency_p50_ms"] == "25.0" and rows[0]["requests_per_s"] == "0.4"
    assert rows[3]["saturated"] == "1" and rows[0]["saturated"] == "0"
    assert rows[0]["model_loads"] == ""  # no endpoint metrics: empty, not 0
    data = json.loads(json_path.read_text())
    assert data["schema_version"] == 1
    assert "linear" in data["percentile_method"]
    assert data["overall"]["max_users_without_failure"] == 20
    assert data["overall"]["saturated_stages"] == [3]
    assert data["run"]["run_id"] == "run"
    assert data["stages"][1]["latency_p95_ms"] == 47.75
    assert not list(tmp_path.joinpath("run").glob(".*tmp"))  # atomic writes leave no temp files


def test_endpoint_metric_deltas_per_stage(tmp_path):
    b = RunBuilder(tmp_path / "run")
    for i, users in enumerate((10, 20, 40)):
        b.stage(users, 10.0 * i, 10.0 * (i + 1))
        b.ok(i, [20.0] * 4)
    run_dir = b.write()
    b.metrics(-1, {"ModelLoads": 2, "ModelCacheHit": 10, "ModelCacheMiss": 2}, loaded=2)  # baseline
    b.metrics(0, {"ModelLoads": 7, "ModelCacheHit": 12, "ModelCacheMiss": 7, "Invocations.ok": 4},
              loaded=7, memory_pct=50.0, model_latency=(4, 80_000.0))
    b.metrics(1, {"ModelLoads": 10, "ModelEvictions": 3, "ModelCacheHit": 19, "ModelCacheMiss": 10,
                  "Invocations.ok": 14}, loaded=7, memory_pct=88.5, model_latency=(14, 380_000.0))
    b.metrics(2, {"ModelLoads": 1, "ModelCacheHit": 3, "ModelCacheMiss": 1, "Invocations.ok": 4},
              loaded=1, model_latency=(4, 40_000.0))  # the endpoint restarted: counters reset
    with (run_dir / "endpoint_metrics.jsonl").open("a") as fh:
        fh.write('{"stage": 3, "snaps')  # a write cut short
    s = analyse(run_dir)
    assert s.has_endpoint_metrics
    first, second, third = s.stages
    assert (first.model_loads, first.model_evictions, first.cache_hits, first.cache_misses) == (5, 0, 2, 5)
    assert (first.invocations_ok, first.loaded_model_count, first.memory_utilization) == (4, 7, 50.0)
    assert first.model_latency_avg_ms == approx(20.0)
    assert (second.model_loads, second.model_evictions, second.cache_hits, second.cache_misses) == (3, 3, 7, 3)
    assert second.model_latency_avg_ms == approx(30.0)  # (380000 - 80000) us / 10
    assert (third.model_loads, third.cache_hits, third.loaded_model_count) == (1, 3, 1)
    assert third.model_latency_avg_ms == approx(10.0)
    assert (s.overall.models_loaded, s.overall.models_loaded_source) == (7, "endpoint metrics")
    assert any("line 5" in w for w in s.warnings)


def test_a_stage_the_endpoint_did_not_see_end_keeps_its_last_snapshot(tmp_path):
    """Snapshots within a stage stand in for its end when the endpoint died before it ended; a
    stage's end snapshot is never replaced by one taken within it that was written later."""
    b = RunBuilder(tmp_path / "run")
    for i in range(2):
        b.stage(10, 10.0 * i, 10.0 * (i + 1))
        b.ok(i, [20.0] * 4)
    run_dir = b.write()
    b.metrics(-1, {"ModelLoads": 1}, at="start")
    b.metrics(0, {"ModelLoads": 3}, at="during")
    b.metrics(0, {"ModelLoads": 4}, at="end")
    b.metrics(0, {"ModelLoads": 9}, at="during")  # taken just before the end, written after it
    b.metrics(1, {"ModelLoads": 6}, at="during")
    b.metrics(1, {"ModelLoads": 8}, at="during")  # then the endpoint stopped answering
    first, second = analyse(run_dir).stages
    assert (first.model_loads, second.model_loads) == (3, 4)


def test_interrupted_run_without_stages_file(tmp_path):
    b = RunBuilder(tmp_path / "run")
    b.ok(0, [1000.0] * 4, users=10, t0=0.0, dt=1.0)  # sent at 0,1,2,3 s; the last ends at 4 s
    b.ok(1, [500.0] * 3, users=20, t0=5.0, dt=1.0)
    s = analyse(b.write(stopped_reason=None, write_stages_file=False))
    assert all(st.derived for st in s.stages)
    assert s.stages[0].duration_s == approx(4.0) and s.stages[0].requests_per_s == approx(1.0)
    assert s.stages[0].generator_cpu_max is None
    assert [st.partial for st in s.stages] == [False, True]
    # the last stage was cut short: it does not count as completed without failure
    assert s.overall.max_users_without_failure == 10
    assert s.overall.partial
    assert any("stages.csv" in w for w in s.warnings)
    assert any("partial" in w for w in s.warnings)


def test_requests_of_a_stage_missing_from_stages_csv(tmp_path):
    b = RunBuilder(tmp_path / "run")
    b.stage(10, 0.0, 10.0)
    b.ok(0, [10.0, 20.0])
    b.ok(1, [30.0], users=20, t0=11.0)
    s = analyse(b.write(stopped_reason="interrupted"))
    assert [(st.stage, st.derived) for st in s.stages] == [(0, False), (1, True)]
    assert any("stage(s) 1 missing" in w for w in s.warnings)


def test_empty_stage_and_zero_request_run(tmp_path):
    b = RunBuilder(tmp_path / "empty-stage")
    b.stage(10, 0.0, 10.0)
    b.stage(20, 10.0, 20.0)
    b.ok(0, [10.0])
    s = analyse(b.write())
    assert s.stages[1].requests == 0 and s.stages[1].requests_per_s == 0.0
    assert s.stages[1].latency_p50_ms is None
    assert s.overall.max_users_without_failure == 10  # a stage without requests proves nothing

    b = RunBuilder(tmp_path / "nothing")
    b.stage(10, 0.0, 10.0)
    o = analyse(b.write(stopped_reason="interrupted")).overall
    assert o.requests == 0 and o.max_users_without_failure is None and o.max_error_free_rps is None
    assert o.lowest_p50_ms is None and o.min_latency_ms is None and not o.failed


def test_all_failed_run(tmp_path):
    b = RunBuilder(tmp_path / "run")
    b.stage(10, 0.0, 10.0)
    b.stage(20, 10.0, 20.0)
    b.fail(0, t=0.5, users=3, error="ServiceUnavailable", status=503)
    b.fail(1, t=12.0, users=20)
    o = analyse(b.write(stopped_reason="stop-on-failure")).overall
    assert o.failed and o.failures == 2 and o.successes == 0
    assert o.max_users_without_failure is None
    assert (o.first_failure_users, o.first_failure_error) == (3, "ServiceUnavailable")
    assert o.max_error_free_rps is None and o.lowest_p50_ms is None


def test_last_request_row_cut_short_is_left_out(tmp_path):
    run_dir = staged_run(tmp_path / "run", stopped_reason="interrupted")
    with (run_dir / "requests.csv").open("a") as fh:
        fh.write("41.5,3,60,m-v1.tar")  # killed mid-row: no newline, missing fields
    s = analyse(run_dir)
    assert s.overall.requests == 23
    assert any("line 25 was cut short" in w for w in s.warnings)


def test_headlines_overall_percentiles_sustained_throughput_and_models_named_as_such(tmp_path):
    b = RunBuilder(tmp_path / "run")
    first, second = b.stage(10, 0.0, 10.0), b.stage(20, 10.0, 20.0)
    b.ok(first, [10.0, 20.0, 30.0, 40.0])
    b.ok(second, [50.0, 60.0])
    run_dir = b.write(models_loaded=2, copies=10)
    b.metrics(-1, {"ModelLoads": 5}, at="start")  # loads before the run are not the run's
    b.metrics(first, {"ModelLoads": 8}, loaded=3)
    b.metrics(second, {"ModelLoads": 9}, loaded=2)
    o = analyse(run_dir).overall
    # 10..60 step 10: h = 5q/100 -> p50 35, p95 57.5, p99 59.5
    assert (o.latency_p50_ms, o.latency_p95_ms, o.latency_p99_ms) == approx((35.0, 57.5, 59.5))
    assert o.sustained_rps == approx(6 / 20)
    assert (o.copies_targeted, o.model_loads, o.models_loaded) == (10, 4, 2)


def test_a_burst_stage_is_not_a_sustained_error_free_throughput(tmp_path):
    b = RunBuilder(tmp_path / "run")
    held, burst = b.stage(10, 0.0, 10.0), b.stage(20, 10.0, 13.0)
    b.ok(held, [10.0] * 10)  # 1 request/s for 10 s
    b.ok(burst, [10.0] * 30)  # 10 requests/s for 3 s
    o = analyse(b.write()).overall
    assert o.max_error_free_rps == approx(1.0) and o.max_error_free_rps_users == 10


def test_stages_where_no_request_finished_end_the_no_failure_claim(tmp_path):
    from bench.render import max_users_text

    b = RunBuilder(tmp_path / "run")
    answered, silent = b.stage(140, 0.0, 10.0), b.stage(160, 10.0, 20.0)
    b.stage(200, 20.0, 30.0)
    b.ok(answered, [10.0, 20.0])
    assert silent == 1
    s = analyse(b.write())
    assert s.overall.unanswered_stages == (1, 2) and not s.overall.failed
    assert s.overall.max_users_without_failure == 140
    text = max_users_text(s)
    assert "no failure in the run" not in text and "no request finished at 160, 200 users" in text


def test_cold_requests_are_told_apart_and_warm_percentiles_leave_them_out(tmp_path):
    from bench.results import RequestRecord

    b = RunBuilder(tmp_path / "run")
    stage = b.stage(10, 0.0, 10.0)
    for i, (latency, cold) in enumerate([(4000.0, 1), (3000.0, 1), (10.0, 0), (20.0, 0), (30.0, 0), (40.0, 0)]):
        b.requests.append(RequestRecord(0.1 * i, stage, 10, "m-v1.tar.gz", latency, 1, 200, "", "host:1", cold=cold))
    s = analyse(b.write())
    st, o = s.stages[0], s.overall
    assert st.cold_requests == 2 and o.cold_requests == 2 and o.cold_method
    assert (st.warm_p50_ms, st.warm_p95_ms) == approx((25.0, 38.5))  # 10..40 only
    assert (st.cold_p50_ms, st.cold_max_ms) == approx((3500.0, 4000.0))
    assert st.latency_p95_ms > 3000  # the all-requests figure keeps them, next to the warm one
    assert (o.warm_p50_ms, o.cold_max_ms) == approx((25.0, 4000.0))


def test_an_endpoint_that_does_not_say_leaves_cold_unknown(tmp_path):
    o = analyse(staged_run(tmp_path / "run")).overall
    assert o.cold_requests is None and o.cold_method is None and o.warm_p50_ms is None


def test_the_breaking_point_is_the_last_stage_before_the_first_failures(tmp_path):
    from bench.render import breaking_point_text

    s = analyse(staged_run(tmp_path / "run"))
    o = s.overall
    # stage 2 (40 users) had the first failures, 2 of its 6 requests; stage 1 (20 users) held 1.0 request/s
    assert (o.breaking_stage, o.breaking_users, o.breaking_failures, o.breaking_requests) == (2, 40, 2, 6)
    assert (o.before_breaking_stage, o.before_breaking_users) == (1, 20)
    assert o.before_breaking_rps == approx(1.0)
    assert breaking_point_text(s) == "20 users at 1.00 requests/s; first failures at 40 users (2 of 6 requests failed)"
    saved = json.loads((write_summary(s)[1]).read_text())["overall"]
    assert saved["before_breaking_users"] == 20 and saved["breaking_users"] == 40


def test_a_run_without_failures_has_no_breaking_point(tmp_path):
    from bench.render import breaking_point_text

    s = analyse(clean_run(tmp_path / "run"))
    assert s.overall.breaking_stage is None and s.overall.before_breaking_rps is None
    assert breaking_point_text(s) == f"not reached: no failure up to {max(st.users for st in s.stages)} users"
