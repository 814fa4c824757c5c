"""Chart helpers: comparison normalisation and labels; charts of unusual runs still draw."""

from __future__ import annotations

import pytest

from bench.analysis import analyse
from bench.charts import distinct_labels, normalised, run_chart
from bench.sizing import size
from tests.bench.runs import RunBuilder, clean_run, staged_run


def test_normalised_to_the_best_run():
    assert normalised([46, 23], higher_is_better=True) == pytest.approx([1.0, 0.5])
    # lower is better: best / value, so the best run is 1.0 and a taller bar is better
    assert normalised([40.0, 80.0], higher_is_better=False) == pytest.approx([1.0, 0.5])
    assert normalised([None, 10], higher_is_better=True) == [None, 1.0]
    assert normalised([0, 0], higher_is_better=True) == [0.0, 0.0]
    assert normalised([None, None], higher_is_better=False) == [None, None]


def test_labels_stay_distinct(tmp_path):
    a = analyse(clean_run(tmp_path / "a"))
    b = analyse(clean_run(tmp_path / "b"))
    c = analyse(clean_run(tmp_path / "c", format="tensorrt", instance_type=None))
    assert distinct_labels([a, b, c]) == ["resnet50 onnx (ml.g5.2xlarge) [a]", "resnet50 onnx (ml.g5.2xlarge) [b]",
                                          "resnet50 tensorrt"]


def test_partial_single_stage_run_draws(tmp_path):
    b = RunBuilder(tmp_path / "run")
    b.stage(5, 0.0, 3.0)
    b.ok(0, [12.0, 13.0])
    png = run_chart(analyse(b.write(stopped_reason="interrupted")))
    assert png[:4] == b"\x89PNG" and len(png) > 5000


def test_sizing_notes_for_saturated_stage_and_measured_instances(tmp_path):
    summary = analyse(staged_run(tmp_path / "run", extra={"instance_count": 2}))
    z = size(summary, 10, 1000)  # stage 3 (saturated, 0.3 req/s) is not the best; stage 1 (1.0 req/s) is
    assert z.capacity_rps == pytest.approx(0.5) and z.measured_instances == 2
    assert (z.instances_at_60, z.instances_at_70) == (34, 29)  # 10 / 0.3 = 33.3, 10 / 0.35 = 28.6
    assert any("2 instances" in note for note in z.notes)
    saturated = RunBuilder(tmp_path / "sat")
    saturated.stage(10, 0.0, 1.0, saturated=1)
    saturated.ok(0, [10.0] * 5)
    z = size(analyse(saturated.write()), 10, 100)
    assert any("saturated" in note for note in z.notes)


def test_runs_are_compared_at_the_highest_user_level_every_run_held(tmp_path):
    """A short run (10, 20 users) and a long one (10, 20, 40 users) compare at 20 users: the
    long run's 40-user stage, which the short one never reached, is not set against its 20."""
    from bench.analysis import analyse
    from bench.render import comparison_rows
    from bench.summary_records import common_users, stage_with_users
    from tests.bench.runs import RunBuilder

    short = RunBuilder(tmp_path / "short")
    for users, start in ((10, 0.0), (20, 10.0)):
        short.ok(short.stage(users, start, start + 10.0), [10.0] * 10)
    long = RunBuilder(tmp_path / "long")
    for users, start, latency in ((10, 0.0, 20.0), (20, 10.0, 30.0), (40, 20.0, 90.0)):
        long.ok(long.stage(users, start, start + 10.0), [latency] * 20)
    summaries = [analyse(short.write()), analyse(long.write())]
    assert common_users(summaries) == 20
    assert [stage_with_users(s, 20).latency_p95_ms for s in summaries] == pytest.approx([10.0, 30.0])
    header, rows = comparison_rows(summaries)
    assert header[3:5] == ["p95 ms at 20 users", "req/s at 20 users"]
    assert [row[3:5] for row in rows] == [["10.0", "1.00"], ["30.0", "2.00"]]
    from bench.charts import comparison_chart

    assert comparison_chart(summaries).startswith(b"\x89PNG")  # the chart draws at the shared level too
