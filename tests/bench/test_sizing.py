"""Instance counts for a target TPS at 60-70% utilisation (the second article's method)."""

from __future__ import annotations

import pytest

from bench.analysis import analyse
from bench.sizing import instances_needed, size
from mme.errors import UsageError
from tests.bench.runs import clean_run, sizing_run


def test_instances_needed_arithmetic():
    # the article: ~200 TPS per instance, target 1000 TPS
    assert instances_needed(1000, 200, 1.0) == 5
    assert instances_needed(1000, 200, 0.7) == 8  # 1000 / 140 = 7.14
    assert instances_needed(1000, 200, 0.6) == 9  # 1000 / 120 = 8.33
    assert instances_needed(840, 200, 0.7) == 6  # exactly 6, despite 6.000000000000001 in floating point
    assert instances_needed(1, 200, 0.6) == 1


def test_capacity_is_best_error_free_stage_within_slo(tmp_path):
    summary = analyse(sizing_run(tmp_path / "run"))
    assert [s.requests_per_s for s in summary.stages] == pytest.approx([50, 100, 200, 250])
    z = size(summary, target_tps=1000, p95_slo_ms=250)
    assert z.capacity_rps == pytest.approx(200) and z.capacity_users == 40 and z.capacity_p95_ms == 180
    assert (z.instances_at_60, z.instances_at_70, z.instances_at_100) == (9, 8, 5)
    assert "9 instances at 60%" in z.message and "8 at 70%" in z.message
    # the 250 req/s stage failed: never the capacity, whatever the SLO
    assert size(summary, 1000, 10_000).capacity_rps == pytest.approx(200)
    z = size(summary, 1000, 100)
    assert z.capacity_rps == pytest.approx(100) and (z.instances_at_60, z.instances_at_70) == (17, 15)


def test_no_stage_meets_the_slo(tmp_path):
    z = size(analyse(sizing_run(tmp_path / "run")), 1000, 10)
    assert z.capacity_rps is None and z.instances_at_60 is None and z.instances_at_70 is None
    assert "no error-free stage had p95 <= 10 ms" in z.message
    assert "50.0 ms at 10 users" in z.message


def test_capacity_at_the_last_stage_is_a_lower_bound(tmp_path):
    z = size(analyse(clean_run(tmp_path / "run")), 30, 50)
    assert z.capacity_rps == pytest.approx(6.0)
    assert (z.instances_at_60, z.instances_at_70) == (9, 8)  # 30/3.6 = 8.3, 30/4.2 = 7.1
    assert any("at least" in note for note in z.notes)


def test_sizing_needs_positive_numbers(tmp_path):
    summary = analyse(clean_run(tmp_path / "run"))
    with pytest.raises(UsageError):
        size(summary, 0, 100)
