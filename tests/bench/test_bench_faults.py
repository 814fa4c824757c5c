"""Faults: an endpoint that fails or goes away mid-run is recorded as failures, the run still
saves its results; Ctrl-C keeps what was measured; user mistakes are one-line errors before
the run starts."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from bench.results import RunInfo, read_endpoint_metrics, read_requests
from mme.cli import main
from tests.bench.fake_endpoint import FakeEndpoint
from tests.bench.helpers import ROOT, bench_command, bench_env, free_port, run_bench, saved_run

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def test_endpoint_failing_mid_run_is_recorded_not_a_crash(tmp_path):
    with FakeEndpoint(fail_after=10) as endpoint:
        run = saved_run(run_bench("--endpoint", "e", "--endpoint-url", endpoint.url, "--model", "m", "--copies", "2",
                                  "--payload", str(payload(tmp_path)), "--shape", "constant", "--users", "3",
                                  "--duration", "2", "--max-failure-rate", "1", "--out", str(tmp_path / "out")))
    assert run.info.stopped_reason == "completed"
    ok = [r for r in run.requests if r.ok]
    failed = [r for r in run.requests if not r.ok]
    assert len(ok) == 10 and len(failed) > 5
    assert {(r.status, r.error) for r in failed} == {(500, "InternalFailure")}
    assert run.info.extra["failures"] == len(failed)
    failures_csv = (run.directory / "locust_failures.csv").read_text()
    assert "InternalFailure (HTTP 500)" in failures_csv


def test_endpoint_going_away_mid_run(tmp_path):
    endpoint = FakeEndpoint(fail_after=8, after_behaviour="drop").__enter__()
    process = subprocess.Popen(bench_command("--endpoint", "e", "--endpoint-url", endpoint.url, "--mode", "single",
                                             "--shape", "constant", "--users", "3", "--duration", "3",
                                             "--wait", "0.05,0.1", "--timeout", "2", "--metrics-interval", "0.5",
                                             "--max-failure-rate", "1", "--out", str(tmp_path)),
                               cwd=ROOT, env=bench_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    # 8 answered, then dropped ones; and the baseline plus one snapshot within the stage
    while (endpoint.state.requests < 12 or endpoint.state.metrics_requests < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    endpoint.stop()  # new connections are refused from here on
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    directory = Path(out.strip().splitlines()[-1])
    info = RunInfo.read(directory)
    requests = list(read_requests(directory))
    assert info.stopped_reason == "completed" and info.ended_at
    failed = [r for r in requests if not r.ok]
    assert len([r for r in requests if r.ok]) == 8 and failed
    assert all(r.status == 0 for r in failed)  # no answer at all
    assert all(re.fullmatch(r"[A-Z][A-Za-z]+", r.error) for r in failed)  # named by the exception's type
    assert {"ConnectionRefusedError"} <= {r.error for r in failed}  # once nothing listens any more
    # the endpoint's metrics: a baseline, then snapshots within the stage until it went away
    metrics = read_endpoint_metrics(directory)
    assert (metrics[0]["stage"], metrics[0]["at"]) == (-1, "start")
    during = [m for m in metrics if m["at"] == "during"]
    assert during and all(m["stage"] == 0 for m in during)
    assert not any(m["at"] == "end" for m in metrics)  # nothing answered at the stage end
    assert max(m["snapshot"]["counts"]["Invocations"] for m in during) >= 1
    assert info.extra["endpoint_metrics_missed"] >= 1


def test_boto3_client_reports_sagemaker_error_codes(tmp_path):
    with FakeEndpoint(behaviour="model-error") as endpoint:
        run = saved_run(run_bench("--endpoint", "e", "--endpoint-url", endpoint.url, "--model", "m", "--copies", "2",
                                  "--payload", str(payload(tmp_path)), "--client", "boto3", "--shape", "constant",
                                  "--users", "2", "--duration", "1.5", "--max-failure-rate", "1",
                                  "--out", str(tmp_path / "out")))
        calls = endpoint.state.requests
    assert run.info.client == "boto3"
    assert run.requests and {(r.ok, r.status, r.error) for r in run.requests} == {(0, 424, "ModelError")}
    assert calls == len(run.requests)  # retries off: one call, one request
    assert {r.target for r in run.requests} <= {"m-v0.tar.gz", "m-v1.tar.gz"}


@pytest.mark.parametrize("sig, code, reason", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_ctrl_c_and_sigterm_stop_the_generator_and_save_what_was_measured(tmp_path, sig, code, reason):
    """Ctrl-C, and SIGTERM (docker stop, kill, a CI timeout), stop the load generator too: the
    run is saved and marked, nothing keeps sending load."""
    with FakeEndpoint() as endpoint:
        process = subprocess.Popen(bench_command("--endpoint", "e", "--endpoint-url", endpoint.url, "--mode", "single",
                                                 "--shape", "constant", "--users", "2", "--duration", "60",
                                                 "--out", str(tmp_path)),
                                   cwd=ROOT, env=bench_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # The generator sets its handlers before its first request: wait for load, not a clock.
            deadline = time.monotonic() + 60
            while endpoint.state.requests < 5:
                assert process.poll() is None and time.monotonic() < deadline, "mme bench never sent load"
                time.sleep(0.05)
            started = time.monotonic()
            process.send_signal(sig)
            out, err = process.communicate(timeout=30)
            stopped_in = time.monotonic() - started
            seen = endpoint.state.requests
            time.sleep(1.0)
            assert endpoint.state.requests == seen, "load went on after mme bench exited"
        finally:
            if process.poll() is None:  # never leave a 60 s load running after a failure
                process.kill()
                process.communicate(timeout=30)
    assert process.returncode == code, err
    assert stopped_in < 10
    directory = Path(out.strip().splitlines()[-1])
    info = RunInfo.read(directory)
    assert info.stopped_reason == reason and info.ended_at
    assert len(list(read_requests(directory))) > 3
    assert (directory / "stages.csv").read_text().count("\n") == 2
    assert "Traceback" not in err


def payload(tmp_path: Path) -> Path:
    path = tmp_path / "body.json"
    path.write_text('{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}')
    return path


@pytest.mark.parametrize("args, message", [
    (["--artifact", "{tmp}/missing"], "is not a directory"),
    (["--payload", "{tmp}/missing.json"], "does not exist"),
    ([], "needs a request body"),
    (["--payload", "{tmp}/body.json", "--shape", "file:{tmp}/bad.json"], "not valid JSON"),
    (["--payload", "{tmp}/body.json", "--shape", "constant"], "needs --users and --duration"),
    (["--payload", "{tmp}/body.json", "--distribution", "zipf:x"], "positive exponent"),
    (["--payload", "{tmp}/body.bin"], "give its --content-type"),
])
def test_user_mistakes_are_one_line_errors_before_the_run(tmp_path, capsys, args, message):
    (tmp_path / "body.json").write_text("{}")
    (tmp_path / "body.bin").write_bytes(b"\x00\x01")
    (tmp_path / "bad.json").write_text("[{")
    with FakeEndpoint() as endpoint:
        argv = ["bench", "--endpoint", "e", "--endpoint-url", endpoint.url, "--model", "m", "--out", str(tmp_path / "out")]
        code = main(argv + [a.replace("{tmp}", str(tmp_path)) for a in args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("mme: error: ") and err.count("\n") == 1 and message in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_unreachable_endpoint_is_refused_before_the_run(tmp_path, capsys):
    (tmp_path / "body.json").write_text("{}")
    code = main(["bench", "--endpoint", "e", "--endpoint-url", f"http://127.0.0.1:{free_port()}", "--model", "m",
                 "--payload", str(tmp_path / "body.json"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "is unreachable" in err and "mme serve" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
