"""The end of a run tells the truth (issue 14): when the shape ends, a stop condition fires or
Ctrl-C comes, no new request starts and those in flight get the drain (``--drain``, default
the request timeout) to answer; each is recorded in the stage it started in, and one still in
flight after the drain is recorded as cut off, never dropped. A run whose failures pass
``--max-failure-rate`` exits non-zero and says which failures, with their messages.

The endpoint is a controlled slow one: latency drawn from a range, unlimited concurrency.
Every request goes to 127.0.0.1."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from bench.analysis import analyse
from tests.bench.fake_endpoint import FakeEndpoint
from tests.bench.helpers import ROOT, bench_command, bench_env, read_run, run_bench, saved_run

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def _payload(tmp_path: Path) -> Path:
    path = tmp_path / "body.json"
    path.write_text('{"inputs": []}')
    return path


def _args(endpoint: FakeEndpoint, tmp_path: Path, *more: str) -> list[str]:
    return ["--endpoint", "e", "--endpoint-url", endpoint.url, "--mode", "single", "--payload",
            str(_payload(tmp_path)), "--wait", "0.05,0.1", "--out", str(tmp_path / "out"), *more]


def test_the_last_stage_matches_an_identical_middle_stage_and_every_served_request_is_recorded(tmp_path):
    """Three identical stages of 12 users against 1-3 s latencies: before the drain, the last
    stage lost the requests still in flight 2 s after the shape ended (a quarter of them)."""
    shape = tmp_path / "shape.json"
    shape.write_text(json.dumps([{"duration": 6 * i, "users": 12, "spawn_rate": 100} for i in (1, 2, 3)]))
    with FakeEndpoint(behaviour="slow", delay_s=1.0, delay_max_s=3.0) as endpoint:
        run = saved_run(run_bench(*_args(endpoint, tmp_path, "--shape", f"file:{shape}"), timeout=120))
        served = endpoint.state.answered
    assert len(run.requests) == served  # recorded == served: nothing in flight was dropped
    assert not [r for r in run.requests if r.cut_off]
    summary = analyse(run.directory)
    middle, last = summary.stages[1], summary.stages[2]
    assert middle.requests and 0.75 <= last.requests / middle.requests <= 1.33, (middle.requests, last.requests)
    assert last.cut_off == 0 and summary.overall.cut_off == 0


STAGE_LINE = re.compile(r"stage (\d+)/\d+ done .*? users\s+(\d+)\s+(\d+) req .*? p50\s+(\S+)(?: ms)?\s+"
                        r"p95\s+(\S+)(?: ms)?\s+failures (\d+)")


@pytest.mark.parametrize("workers", [1, 2])
def test_the_live_stage_lines_give_the_reports_figures(tmp_path, workers):
    """0.5-1.5 s latencies: a dozen requests are in flight at each stage end. The line for a
    stage waits until every request sent in it has answered (with workers, until each has
    reported since), so it counts them in that stage with the report's percentiles."""
    shape = tmp_path / "shape.json"
    shape.write_text(json.dumps([{"duration": 4 * i, "users": 4 * i, "spawn_rate": 100} for i in (1, 2, 3)]))
    with FakeEndpoint(behaviour="slow", delay_s=0.5, delay_max_s=1.5) as endpoint:
        completed = run_bench(*_args(endpoint, tmp_path, "--shape", f"file:{shape}", "--workers", str(workers)),
                              timeout=120)
    run = saved_run(completed)
    live = {int(m[1]) - 1: m.groups()[1:] for m in STAGE_LINE.finditer(completed.stderr)}
    summary = analyse(run.directory)
    assert sorted(live) == [s.stage for s in summary.stages] == [0, 1, 2], completed.stderr
    for s in summary.stages:
        assert live[s.stage] == (str(s.users), str(s.requests), f"{s.latency_p50_ms:.1f}", f"{s.latency_p95_ms:.1f}",
                                 str(s.failures)), (s.stage, completed.stderr)
    assert "not counted yet" not in completed.stderr and "not in yet" not in completed.stderr


def test_ctrl_c_drains_then_a_second_one_cuts_the_drain_short_and_records_the_cut_offs(tmp_path):
    with FakeEndpoint(behaviour="slow", delay_s=0.5, delay_max_s=1.0) as endpoint:
        process = subprocess.Popen(bench_command(*_args(endpoint, tmp_path, "--shape", "constant", "--users", "4",
                                                        "--duration", "60")),
                                   cwd=ROOT, env=bench_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60  # load under way: the generator's handlers are set
            while endpoint.state.requests < 8:
                assert process.poll() is None and time.monotonic() < deadline, "mme bench never sent load"
                time.sleep(0.05)
            process.send_signal(signal.SIGINT)  # drains: every request in flight answers (at most 1 s)
            out, err = process.communicate(timeout=60)
            served = endpoint.state.answered
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 130, err
    run = read_run(Path(out.strip().splitlines()[-1]))
    assert run.info.stopped_reason == "interrupted"
    assert len(run.requests) == served and not [r for r in run.requests if r.cut_off]

    with FakeEndpoint(behaviour="slow", delay_s=30.0) as endpoint:
        process = subprocess.Popen(bench_command(*_args(endpoint, tmp_path, "--shape", "constant", "--users", "3",
                                                        "--duration", "60")),
                                   cwd=ROOT, env=bench_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 30
            while endpoint.state.requests < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            process.send_signal(signal.SIGINT)
            time.sleep(1.0)
            started = time.monotonic()
            process.send_signal(signal.SIGINT)  # the second: stop now, answers or not
            out, err = process.communicate(timeout=60)
            stopped_in = time.monotonic() - started
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 130, err
    assert stopped_in < 15 and "stopping at once" in err
    run = read_run(Path(out.strip().splitlines()[-1]))
    cut = [r for r in run.requests if r.cut_off]
    assert len(cut) == 3 and all(r.error == "CutOff" and not r.ok for r in cut)
    summary = analyse(run.directory)
    assert summary.overall.cut_off == 3 and summary.overall.failures == 0  # censored, not failed


def test_requests_in_flight_after_the_drain_are_recorded_as_cut_off_in_their_stage(tmp_path):
    with FakeEndpoint(behaviour="slow", delay_s=2.0, delay_max_s=3.0) as endpoint:
        completed = run_bench(*_args(endpoint, tmp_path, "--shape", "constant", "--users", "5", "--duration", "2",
                                     "--drain", "0.3"), timeout=120)
        sent = endpoint.state.requests
    run = saved_run(completed)
    cut = [r for r in run.requests if r.cut_off]
    assert cut and len(run.requests) == sent  # answered or cut off: every request sent is in requests.csv
    assert {r.stage for r in cut} == {0}
    assert "cut off" in completed.stderr
    summary = analyse(run.directory)
    assert summary.stages[0].cut_off == len(cut) and summary.overall.failures == 0
    assert any("cut off" in w for w in summary.warnings)


def test_an_all_failing_run_exits_non_zero_and_names_the_failure(tmp_path):
    with FakeEndpoint(behaviour="fail") as endpoint:
        completed = run_bench(*_args(endpoint, tmp_path, "--shape", "constant", "--users", "2", "--duration", "2"))
    assert completed.returncode == 1, completed.stderr
    directory = Path(completed.stdout.strip().splitlines()[-1])  # the results are there all the same
    run = read_run(directory)
    assert run.requests and all(not r.ok and r.message == "injected failure" for r in run.requests)
    assert "requests failed (100.0%, above --max-failure-rate 1.0%)" in completed.stderr
    assert 'InternalFailure "injected failure"' in completed.stderr
    assert "p50 –" in completed.stderr  # no finished request: no figure, not 0.0 ms
    summary = analyse(directory)
    assert summary.overall.failure_rate == 1.0
    assert summary.overall.top_errors[0]["error"] == "InternalFailure"
    assert summary.overall.top_errors[0]["message"] == "injected failure"
    assert summary.overall.top_errors[0]["count"] == len(run.requests)


def test_failures_under_the_limit_keep_exit_code_zero(tmp_path):
    with FakeEndpoint(fail_after=30) as endpoint:
        completed = run_bench(*_args(endpoint, tmp_path, "--shape", "constant", "--users", "2", "--duration", "2",
                                     "--max-failure-rate", "0.99"))
    assert completed.returncode == 0, completed.stderr
    assert "most common failures" in completed.stderr
