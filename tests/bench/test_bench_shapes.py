"""Load shapes: the Locust LoadTestShape classes' tick() sequences, and the plan checks
``mme bench`` runs before anything imports Locust."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.stages import (ARTICLE_STAGES, Stage, build_load_plan, load_shape_file, peak_stages,
                          peak_users_for)
from mme.errors import MmeError, UsageError
from tests.bench.helpers import ROOT, bench_env

# Locust monkey-patches the standard library on import: tick() runs in a process of its own.
TICKS = r'''
import json, sys, time
from bench.shapes import ConstantShape, FileShape, OpenLoopShape, RampShape, StagedShape

def ticks(shape, times):
    out = []
    for t in times:
        shape.start_time = time.perf_counter() - t  # as if the run had started t seconds ago
        tick = shape.tick()
        out.append(None if tick is None else [tick[0], round(tick[1], 6)])
    return out

print(json.dumps({
    "staged": ticks(StagedShape(), [0, 29.9, 30.1, 59.9, 60.1, 339.9, 340.1]),
    "staged_scaled": ticks(StagedShape(time_scale=0.1), [0, 2.9, 3.1, 6.1, 33.9, 34.1]),
    "ramp": ticks(RampShape(users=10, duration_s=5, steps=5), [0, 0.9, 1.1, 4.9, 5.1]),
    "constant": ticks(ConstantShape(users=4, duration_s=6), [0, 5.9, 6.1]),
    "file": ticks(FileShape(sys.argv[1]), [0, 1.9, 2.1, 4.9, 5.1]),
    "file_scaled": ticks(FileShape(sys.argv[1], time_scale=0.5), [0, 0.9, 1.1, 2.4, 2.6]),
    "open_loop": ticks(OpenLoopShape(rate=50, duration_s=3, schedulers=2), [0, 2.9, 3.1]),
}))
'''


@pytest.fixture(scope="module")
def ticks(tmp_path_factory):
    shape_file = tmp_path_factory.mktemp("shape") / "shape.json"
    shape_file.write_text(json.dumps([{"duration": 2, "users": 3, "spawn_rate": 1},
                                      {"duration": 5, "users": 6, "spawn_rate": 3}]))
    out = subprocess.run([sys.executable, "-c", TICKS, str(shape_file)], cwd=ROOT, env=bench_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_staged_shape_is_the_articles(ticks):
    assert ticks["staged"] == [[10, 5], [10, 5], [20, 1], [20, 1], [40, 2], [200, 2], None]


def test_time_scale_compresses_durations_and_speeds_up_spawning(ticks):
    assert ticks["staged_scaled"] == [[10, 50], [10, 50], [20, 10], [40, 20], [200, 20], None]


def test_ramp_constant_and_file_shapes(ticks):
    assert ticks["ramp"] == [[2, 2], [2, 2], [4, 2], [10, 2], None]
    assert ticks["constant"] == [[4, 4], [4, 4], None]
    assert ticks["file"] == [[3, 1], [3, 1], [6, 3], [6, 3], None]
    assert ticks["file_scaled"] == [[3, 2], [3, 2], [6, 6], [6, 6], None]


def test_open_loop_shape_runs_one_scheduler_per_generator(ticks):
    assert ticks["open_loop"] == [[2, 2], [2, 2], None]


def test_plan_stage_index_and_defaults():
    plan = build_load_plan("staged")
    assert plan.stages == ARTICLE_STAGES and plan.duration_s == 340 and plan.max_users == 200
    assert [plan.stage_index(t) for t in (0, 29.99, 30, 339.9, 340)] == [0, 0, 1, 10, None]
    assert build_load_plan("staged", time_scale=0.03).duration_s == pytest.approx(10.2)
    ramp = build_load_plan("ramp", users=100, duration_s=60)
    assert len(ramp.stages) == 10 and ramp.stages[-1] == Stage(60, 100, pytest.approx(100 / 60, rel=1e-5))
    assert build_load_plan("open-loop", rate=5, duration_s=2).rate == 5


@pytest.mark.parametrize("content, message", [
    ("not json", "not valid JSON"),
    ("[]", "non-empty JSON list"),
    ('{"duration": 3}', "non-empty JSON list"),
    ('[{"duration": 3, "users": 1, "spawn_rate": 1}, {"duration": 2, "users": 2, "spawn_rate": 1}]', "must increase"),
    ('[{"duration": 3, "users": -1, "spawn_rate": 1}]', "non-negative integer"),
    ('[{"duration": 3, "users": 2, "spawn_rate": 0}]', "positive number"),
    ('[{"duration": 3, "users": 2, "rate": 1}]', "expected an object"),
    ('[{"duration": 3, "users": 0, "spawn_rate": 1}]', "every stage has 0 users"),
])
def test_invalid_shape_file_is_a_one_line_error(tmp_path, content, message):
    path = tmp_path / "shape.json"
    path.write_text(content)
    with pytest.raises(MmeError, match=message) as info:
        build_load_plan(f"file:{path}")
    assert "\n" not in str(info.value)


def test_missing_shape_file_and_bad_options():
    with pytest.raises(MmeError, match="does not exist"):
        load_shape_file(ROOT / "no-such-shape.json")
    with pytest.raises(UsageError, match="needs --users and --duration"):
        build_load_plan("constant", users=3)
    with pytest.raises(UsageError, match="needs --rate"):
        build_load_plan("open-loop", duration_s=3)
    with pytest.raises(UsageError, match="unknown --shape"):
        build_load_plan("sawtooth")
    with pytest.raises(UsageError, match="--time-scale"):
        build_load_plan("constant", users=3, duration_s=4, time_scale=0.5)


def test_duration_stretches_the_staged_and_file_shapes(tmp_path):
    staged = build_load_plan("staged", duration_s=170)
    assert staged.duration_s == pytest.approx(170) and len(staged.stages) == len(ARTICLE_STAGES)
    assert [s.users for s in staged.stages] == [s.users for s in ARTICLE_STAGES]
    assert staged.stages == build_load_plan("staged", time_scale=0.5).stages
    path = tmp_path / "shape.json"
    path.write_text('[{"duration": 3, "users": 2, "spawn_rate": 1}, {"duration": 6, "users": 4, "spawn_rate": 1}]')
    assert build_load_plan(f"file:{path}", duration_s=12).stages[-1].end_s == pytest.approx(12)
    with pytest.raises(MmeError, match="not both"):
        build_load_plan("staged", duration_s=170, time_scale=0.5)
    with pytest.raises(MmeError, match="sets its own users"):
        build_load_plan("staged", users=3)


def test_a_peak_scales_the_articles_stages_and_keeps_their_times():
    stages = peak_stages(20)
    assert [s.users for s in stages] == [1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20]
    assert [s.end_s for s in stages] == [s.end_s for s in ARTICLE_STAGES]
    # each ramp takes as long as the article's: +2 users at 0.2/s where it adds 20 at 2/s
    assert [s.spawn_rate for s in stages] == pytest.approx([s.spawn_rate / 10 for s in ARTICLE_STAGES])
    assert peak_stages(200) == ARTICLE_STAGES
    plan = build_load_plan("staged", peak_users=60, time_scale=0.5)
    assert plan.max_users == 60 and plan.duration_s == 170 and plan.stages[0] == Stage(15, 3, 3.0)
    with pytest.raises(UsageError, match="multiple of 20"):
        peak_stages(30)
    with pytest.raises(UsageError, match="scales the staged shape"):
        build_load_plan("ramp", users=3, duration_s=4, peak_users=20)


def test_the_peak_offers_twice_the_measured_rate_in_steps_of_20_users():
    wait = (0.05, 0.5)  # a user waits 0.275 s on average
    # 2 x 100 requests/s x (0.05 + 0.275) s = 65 users -> 80
    assert peak_users_for(100.0, 0.05, wait) == 80
    assert peak_users_for(80.0, 0.125, wait) == 80  # 2 x 80 x 0.4 = 64
    assert peak_users_for(200.0, 0.125, wait) == 160  # exactly 160: no step more
    # the host: distilbert 3.7 requests/s in-process, 270 ms a request -> the smallest peak
    assert peak_users_for(3.7, 0.27, wait) == 20
    assert peak_users_for(5000.0, 0.01, wait) == 200  # never past the article's
    assert peak_users_for(100.0, 0.05, wait, multiple=4.0) == 140  # 130 -> 140
    with pytest.raises(MmeError, match="rate above 0"):
        peak_users_for(0.0, 0.1, wait)
