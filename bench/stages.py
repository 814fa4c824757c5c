"""Load plans: the stages a bench run goes through, without Locust.

A plan is a list of :class:`Stage` rows in the first article's form (cumulative end time,
users, spawn rate). ``bench.shapes`` wraps plans in Locust ``LoadTestShape`` classes; the
``mme bench`` process parses and checks them here, before anything imports Locust (whose
import monkey-patches the standard library).
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

from mme.errors import MmeError, UsageError


@dataclass(frozen=True)
class Stage:
    end_s: float  # cumulative: the stage runs until this many seconds after the start
    users: int  # target concurrent users
    spawn_rate: float  # users started (or stopped) per second on the way to ``users``


# The first article's staged shape: 10 users to warm up, then +20 users every 30 s up to 200.
ARTICLE_STAGES = (
    Stage(30, 10, 5), Stage(60, 20, 1), Stage(90, 40, 2), Stage(120, 60, 2), Stage(150, 80, 2),
    Stage(180, 100, 2), Stage(210, 120, 2), Stage(240, 140, 2), Stage(270, 160, 2), Stage(300, 180, 2),
    Stage(340, 200, 2),
)

SHAPE_KINDS = ("staged", "ramp", "constant", "file:PATH", "open-loop")
ARTICLE_PEAK_USERS = ARTICLE_STAGES[-1].users  # 200
# A peak that is a multiple of 20 keeps every stage of the article's shape a whole number of users
# (its levels are multiples of 10 out of 200): 20 -> 1, 2, 4, 6, ... 20.
PEAK_USERS_STEP = 20
# How far past what was measured the demos' staged shape goes: its peak offers twice the measured
# requests/s, so the stages below the middle run under the endpoint's capacity and those above over it.
PEAK_LOAD_MULTIPLE = 2.0


@dataclass(frozen=True)
class LoadPlan:
    kind: str  # "staged" | "ramp" | "constant" | "file:<path>" | "open-loop"
    stages: tuple[Stage, ...]
    rate: float | None = None  # open-loop arrivals per second (all generators together)

    @property
    def duration_s(self) -> float:
        return self.stages[-1].end_s

    @property
    def max_users(self) -> int:
        return max(s.users for s in self.stages)

    @property
    def open_loop(self) -> bool:
        return self.kind == "open-loop"

    def stage_index(self, run_time: float) -> int | None:
        """The stage running ``run_time`` seconds after the start; None once the plan is over."""
        if run_time < 0:
            return 0
        index = bisect_right([s.end_s for s in self.stages], run_time)
        return index if index < len(self.stages) else None

    def tick(self, run_time: float) -> tuple[int, float] | None:
        """What a Locust shape's tick() returns: (users, spawn_rate), or None to stop."""
        index = self.stage_index(run_time)
        if index is None:
            return None
        stage = self.stages[index]
        return stage.users, stage.spawn_rate

    def to_json(self) -> dict:
        """The plan as run.json records it (``extra["plan"]``): stages in the shape file's form."""
        return {"kind": self.kind, "rate": self.rate,
                "stages": [{"duration": s.end_s, "users": s.users, "spawn_rate": s.spawn_rate} for s in self.stages]}


def scaled(stages: tuple[Stage, ...], factor: float) -> tuple[Stage, ...]:
    """The same shape ``factor`` times as long: durations scale, spawn rates scale inversely."""
    return tuple(Stage(round(s.end_s * factor, 6), s.users, round(s.spawn_rate / factor, 6)) for s in stages)


def peak_stages(peak_users: int, stages: tuple[Stage, ...] = ARTICLE_STAGES) -> tuple[Stage, ...]:
    """The article's staged shape with every stage's users (and spawn rate, so that each ramp takes
    as long) scaled by ``peak_users`` / 200: the same stages, times and proportions, peaking at
    ``peak_users``. ``peak_users`` is a multiple of 20 (every stage a whole number of users)."""
    if peak_users < PEAK_USERS_STEP or peak_users % PEAK_USERS_STEP:
        raise UsageError(f"--peak-users must be a multiple of {PEAK_USERS_STEP} (got {peak_users}): the staged "
                         "shape's levels are its 200 users' shares, whole users only at those peaks")
    factor = peak_users / ARTICLE_PEAK_USERS
    return tuple(Stage(s.end_s, round(s.users * factor), round(s.spawn_rate * factor, 6)) for s in stages)


def peak_users_for(requests_per_s: float, latency_s: float, wait_s: tuple[float, float],
                   multiple: float = PEAK_LOAD_MULTIPLE, most: int = ARTICLE_PEAK_USERS) -> int:
    """The staged shape's peak users for an endpoint measured to serve ``requests_per_s`` with
    ``latency_s`` per request when not queued: the demos' rule.

    A closed-loop user sends its next request a wait (``wait_s``, mean taken) after the answer, so
    answered at ``latency_s`` it offers 1 / (latency + mean wait) requests/s. The peak is the users
    that offer ``multiple`` x ``requests_per_s`` that way: users = multiple x requests/s x (latency +
    mean wait), rounded up to a multiple of 20, at least 20 and at most ``most`` (the article's 200).
    Past the measured rate the endpoint queues: at the peak a request waits about multiple x
    (latency + wait) - wait, seconds where the article's 200 users would be minutes on a slow host."""
    if not requests_per_s > 0 or latency_s < 0:
        raise MmeError(f"a peak needs a measured rate above 0 and a latency of 0 or more "
                       f"(got {requests_per_s:g} requests/s, {latency_s:g} s)")
    users = multiple * requests_per_s * (latency_s + sum(wait_s) / 2)
    peak = PEAK_USERS_STEP * math.ceil(users / PEAK_USERS_STEP - 1e-9)
    return max(PEAK_USERS_STEP, min(most, peak))


def ramp_stages(users: int, duration_s: float, steps: int | None = None) -> tuple[Stage, ...]:
    """A linear ramp from 0 to ``users`` over ``duration_s``, cut into ``steps`` stages so each
    stage's latency is reported on its own. Users start at a steady rate over the whole ramp."""
    steps = steps or max(1, min(users, 10))
    rate = users / duration_s
    stages = []
    for i in range(1, steps + 1):
        stages.append(Stage(round(duration_s * i / steps, 6), max(1, round(users * i / steps)), round(rate, 6)))
    return tuple(stages)


def constant_stages(users: int, duration_s: float) -> tuple[Stage, ...]:
    return (Stage(duration_s, users, float(max(users, 1))),)


def load_shape_file(path: Path) -> tuple[Stage, ...]:
    """A JSON list of {"duration": cumulative_end_s, "users": n, "spawn_rate": r}."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise MmeError(f"shape file {path} does not exist") from None
    except OSError as exc:
        raise MmeError(f"cannot read shape file {path} ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise MmeError(f"shape file {path} is not valid JSON ({exc.msg}, line {exc.lineno})") from None
    example = '[{"duration": 30, "users": 10, "spawn_rate": 5}, ...]'
    if not isinstance(data, list) or not data:
        raise MmeError(f"shape file {path} must hold a non-empty JSON list like {example}")
    stages: list[Stage] = []
    previous_end = 0.0
    for i, row in enumerate(data):
        where = f"shape file {path}, stage {i}"
        if not isinstance(row, dict) or set(row) - {"duration", "users", "spawn_rate"} or not {"duration", "users"} <= set(row):
            raise MmeError(f"{where}: expected an object with duration, users and spawn_rate, like {example}")
        end, users, rate = row["duration"], row["users"], row.get("spawn_rate", 1)
        if not _number(end) or not end > previous_end:
            raise MmeError(f"{where}: duration is the cumulative end time in seconds and must increase "
                           f"(got {end!r} after {previous_end:g})")
        if isinstance(users, bool) or not isinstance(users, int) or users < 0:
            raise MmeError(f"{where}: users must be a non-negative integer (got {users!r})")
        if not _number(rate) or not rate > 0:
            raise MmeError(f"{where}: spawn_rate must be a positive number of users per second (got {rate!r})")
        stages.append(Stage(float(end), users, float(rate)))
        previous_end = float(end)
    if not any(s.users for s in stages):
        raise MmeError(f"shape file {path}: every stage has 0 users; nothing would be sent")
    return tuple(stages)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def build_load_plan(shape: str, *, users: int | None = None, duration_s: float | None = None, rate: float | None = None,
               time_scale: float | None = None, steps: int | None = None, peak_users: int | None = None) -> LoadPlan:
    """The plan for ``--shape`` and its options; every mistake is a one-line UsageError/MmeError.
    ``peak_users``: the staged shape scaled to peak there (:func:`peak_stages`)."""
    if peak_users is not None and shape != "staged":
        raise UsageError("--peak-users scales the staged shape; give ramp and constant --users instead")
    if time_scale is not None and not (shape == "staged" or shape.startswith("file:")):
        raise UsageError("--time-scale compresses the staged and file shapes; give ramp, constant and open-loop "
                         "a shorter --duration instead")
    if shape == "staged" or shape.startswith("file:"):
        if users is not None:
            raise UsageError(f"--shape {shape} sets its own users per stage; --users goes with ramp and constant")
        if duration_s is not None and time_scale is not None:
            raise UsageError("give --duration (the whole shape's length) or --time-scale (a factor on it), not both")
    if shape == "staged":
        stages: tuple[Stage, ...] = ARTICLE_STAGES if peak_users is None else peak_stages(peak_users)
    elif shape in ("ramp", "constant"):
        if users is None or duration_s is None:
            raise UsageError(f"--shape {shape} needs --users and --duration")
        stages = ramp_stages(users, duration_s, steps) if shape == "ramp" else constant_stages(users, duration_s)
    elif shape == "open-loop":
        if rate is None or duration_s is None:
            raise UsageError("--shape open-loop needs --rate (requests per second) and --duration")
        return LoadPlan("open-loop", (Stage(duration_s, 0, 1.0),), rate)
    elif shape.startswith("file:") and len(shape) > len("file:"):
        stages = load_shape_file(Path(shape[len("file:"):]))
    else:
        raise UsageError(f"unknown --shape {shape!r}; choose one of {', '.join(SHAPE_KINDS)}")
    if steps is not None and shape != "ramp":
        raise UsageError("--steps applies to --shape ramp only")
    if duration_s is not None:  # staged and file shapes: the same stages, stretched to this length
        time_scale = duration_s / stages[-1].end_s
    if time_scale is not None:
        stages = scaled(stages, time_scale)
    return LoadPlan(shape, stages)
