"""The collector: raw request samples to requests.csv rows with stage and users, per-stage
generator CPU and the saturation mark; the payload and CLI plumbing around it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench import analysis, collect
from bench.collect import CpuSample, Collector
from mme.stats import percentile
from bench.payload import from_artifact
from bench.results import read_requests
from tests.bench.helpers import ROOT, bench_env

T0 = 1_000_000.0


def test_records_get_the_stage_and_users_of_the_moment_they_were_sent(tmp_path):
    collector = Collector(tmp_path, T0, exact_users=False)
    collector.begin_stage(0, 0.0, 10, 5)
    collector.note_users(0.0, 0)
    collector.note_users(0.5, 6)
    collector.note_users(1.0, 10)
    collector.begin_stage(1, 2.0, 20, 1)
    collector.note_users(2.5, 20)
    # (sent_at, target, status, error, users on that worker, latency_ms, message, cut_off, cold)
    collector.add("host:1", [(T0 + 0.7, "m-v1.tar.gz", 200, "", 3, 12.0, "", 0, 1),
                             (T0 + 2.6, "m-v2.tar.gz", 424, "ModelError", 9, 5.0, "bad input", 0, None)])
    collector.add("host:2", [(T0 + 1.5, "m-v1.tar.gz", 200, "", 2, 30.0, "", 0, 0),
                             (T0 + 2.9, "m-v1.tar.gz", 0, "CutOff", 20, 900.0, "still in flight", 1, None)])
    collector.close()
    rows = list(read_requests(tmp_path))
    assert [(r.stage, r.users, r.ok, r.worker, r.cut_off) for r in rows] == [
        (0, 6, 1, "host:1", 0), (1, 20, 0, "host:1", 0), (0, 10, 1, "host:2", 0), (1, 20, 0, "host:2", 1)]
    assert rows[1].message == "bad input"
    assert [r.cold for r in rows] == [1, None, 0, None]  # cold, unknown (the endpoint did not say), warm
    assert collector.first_failure.error == "ModelError"
    assert collector.stats[0].requests == 2 and collector.stats[1].failures == 1
    # a request cut off by the drain is counted apart: not a failure, no latency
    assert collector.stats[1].requests == 1 and collector.stats[1].cut_off == 1 and collector.total.cut_off == 1
    assert collector.stats[1].errors == {("ModelError", "bad input", "m-v2.tar.gz"): 1}
    assert sorted(collector.stats[0].latencies_ok) == [12.0, 30.0]


def test_stages_where_a_generator_passed_90_percent_are_saturated(tmp_path):
    collector = Collector(tmp_path, T0, exact_users=True)
    collector.begin_stage(0, 0.0, 10, 5)
    collector.begin_stage(1, 10.0, 20, 1)
    collector.end_stage(20.0)
    collector.add_cpu([CpuSample("a", T0 + 5, 1.0, 40.0), CpuSample("b", T0 + 6, 1.0, 60.0),
                       CpuSample("a", T0 + 15, 1.0, 95.0), CpuSample("b", T0 + 15, 1.0, 50.0)])
    rows = collector.stage_records(open_loop=False, now_t=20.0)
    collector.close()
    assert [(r.stage, r.users, r.generator_cpu_max, r.generator_cpu_mean, r.saturated) for r in rows] == [
        (0, 10, 60.0, 50.0, 0), (1, 20, 95.0, 72.5, 1)]


def test_the_run_checks_percentiles_as_the_report_computes_them():
    """One definition: the p95 that --max-p95-ms is checked against is the report's (linear)."""
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 100)) == (50.5, 95.05, 100.0)
    assert percentile([], 95) is None and percentile([7.0], 95) == 7.0
    assert collect.percentile is analysis.percentile is percentile
    stats = collect.StageStats(latencies_ok=[40.0, 10.0, 30.0, 20.0])
    assert stats.p(95) == pytest.approx(38.5)  # nearest rank said 40.0: over a 39 ms limit the report shows under


def test_artifact_payloads_json_and_binary(test_resnet_cpu_local):
    artifact_dir, _ = test_resnet_cpu_local
    as_json = from_artifact(artifact_dir)
    as_binary = from_artifact(artifact_dir, binary=True)
    assert as_json.content_type == "application/json" and as_json.body.startswith(b"{")
    assert as_binary.content_type.startswith("application/vnd.sagemaker-triton.binary+json;json-header-size=")
    assert as_binary.body == (artifact_dir / "sample_request.bin").read_bytes()
    assert (as_json.model, as_json.format) == ("test_resnet", "cpu-local")


def test_mme_help_does_not_import_locust_or_gevent():
    code = ("import sys; from mme.cli import build_parser; build_parser().parse_args(['bench', '--endpoint', 'e']); "
            "print(sorted(m for m in ('locust', 'gevent', 'geventhttpclient', 'zmq') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=bench_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
