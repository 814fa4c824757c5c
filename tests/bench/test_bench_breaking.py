"""A load that breaks the endpoint (issue 33): ``mme bench`` alone exits non-zero when the failed
share passes --max-failure-rate; the demos' way of running the same request (``run_to_finding``)
returns the run as a finding, and the summary names the breaking point: the last stage before
the first failures, its users and requests/s. The endpoint answers its first requests, then fails
every one, as an endpoint past its limit does."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.analysis import analyse
from bench.render import breaking_point_text
from bench.request import (BenchRequest, EndpointOptions, LoadOptions, OutputOptions, PayloadOptions, run_to_end,
                           run_to_finding)
from mme.errors import MmeError
from tests.bench.fake_endpoint import FakeEndpoint
from tests.bench.helpers import run_bench

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration

ANSWERED = 40  # requests the endpoint answers before it breaks: the second stage (2 users, 0.9 s) ends well before


def _payload(tmp_path: Path) -> Path:
    path = tmp_path / "body.json"
    path.write_text('{"inputs": []}')
    return path


def test_mme_bench_alone_exits_non_zero_on_a_load_that_breaks_the_endpoint(tmp_path):
    with FakeEndpoint(fail_after=ANSWERED) as endpoint:
        completed = run_bench("--endpoint", "e", "--endpoint-url", endpoint.url, "--mode", "single", "--payload",
                              str(_payload(tmp_path)), "--peak-users", "20", "--time-scale", "0.03",
                              "--out", str(tmp_path / "out"))
    assert completed.returncode == 1, completed.stderr
    assert "above --max-failure-rate 1.0%" in completed.stderr
    run_dir = Path(completed.stdout.strip().splitlines()[-1])  # the results are there all the same
    summary = analyse(run_dir)
    assert [s.users for s in summary.stages] == [1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20]  # the article's, peaking at 20


def test_the_demos_get_the_broken_run_as_their_finding_with_its_breaking_point(tmp_path):
    def request(url: str, name: str) -> BenchRequest:
        return BenchRequest(endpoint=EndpointOptions("e", url, mode="single"),
                            payload=PayloadOptions(file=str(_payload(tmp_path))),
                            load=LoadOptions(shape="staged", peak_users=20, time_scale=0.03),
                            output=OutputOptions(out=str(tmp_path / "out"), run_id=name, quiet=True))

    with FakeEndpoint(fail_after=ANSWERED) as endpoint:
        outcome = run_to_finding(request(endpoint.url, "finding"), quiet=True)
    assert outcome.broke and outcome.run_dir.name == "finding"
    summary = analyse(outcome.run_dir)
    o = summary.overall
    assert o.failure_rate is not None and o.failure_rate > 0.01
    broken = summary.stages[o.breaking_stage]
    assert broken.failures > 0 and not any(s.failures for s in summary.stages[:o.breaking_stage])
    held = summary.stages[o.before_breaking_stage]
    assert o.before_breaking_stage == o.breaking_stage - 1 and held.error_free
    assert (o.before_breaking_users, o.before_breaking_rps) == (held.users, held.requests_per_s)
    assert breaking_point_text(summary).startswith(f"{held.users} users at {held.requests_per_s:.2f} requests/s; "
                                                   f"first failures at {broken.users} users")
    # the benchmark scripts' way keeps a failure a failure
    with FakeEndpoint(fail_after=ANSWERED) as endpoint, pytest.raises(MmeError, match="exit code 4"):
        run_to_end(request(endpoint.url, "failure"), quiet=True)
