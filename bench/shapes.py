"""The load shapes as Locust ``LoadTestShape`` classes: ``tick()`` is the seam Locust (and
``bench.run``'s driver) call to learn the user count and spawn rate at the current run time.

Importing this module imports Locust, which monkey-patches the standard library: only
load-generator processes (``bench.run``, ``bench.worker``) import it.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from locust import LoadTestShape

from bench.stages import ARTICLE_STAGES, LoadPlan, Stage, constant_stages, load_shape_file, ramp_stages, scaled


class PlanShape(LoadTestShape):
    """A shape that follows a :class:`LoadPlan`'s stages."""

    abstract = True

    def __init__(self, plan: LoadPlan) -> None:
        super().__init__()
        self.plan = plan

    def tick(self):
        return self.plan.tick(self.get_run_time())

    def stage_index(self) -> int | None:
        return self.plan.stage_index(self.get_run_time())


class StagedShape(PlanShape):
    """The first article's shape: (30 s, 10 users, 5/s), (60, 20, 1), (90, 40, 2) ... (340, 200, 2);
    ``time_scale`` 0.1 runs it in 34 s with spawn rates 10 times higher."""

    def __init__(self, time_scale: float | None = None, stages: tuple[Stage, ...] = ARTICLE_STAGES) -> None:
        super().__init__(LoadPlan("staged", scaled(stages, time_scale) if time_scale else stages))


class RampShape(PlanShape):
    """0 to ``users`` at a steady spawn rate over ``duration_s``, reported in ``steps`` stages."""

    def __init__(self, users: int, duration_s: float, steps: int | None = None) -> None:
        super().__init__(LoadPlan("ramp", ramp_stages(users, duration_s, steps)))


class ConstantShape(PlanShape):
    def __init__(self, users: int, duration_s: float) -> None:
        super().__init__(LoadPlan("constant", constant_stages(users, duration_s)))


class FileShape(PlanShape):
    """Stages from a JSON list of {"duration": cumulative_end_s, "users": n, "spawn_rate": r}."""

    def __init__(self, path: Path, time_scale: float | None = None) -> None:
        stages = load_shape_file(Path(path))
        super().__init__(LoadPlan(f"file:{path}", scaled(stages, time_scale) if time_scale else stages))


class OpenLoopShape(PlanShape):
    """One arrival scheduler per generator process for ``duration_s``: requests leave at
    ``rate`` per second in total whatever the endpoint does (see ``bench.users``)."""

    def __init__(self, rate: float, duration_s: float, schedulers: int = 1) -> None:
        super().__init__(LoadPlan("open-loop", (Stage(duration_s, 0, 1.0),), rate))
        self.schedulers = schedulers

    def tick(self):
        if self.plan.tick(self.get_run_time()) is None:
            return None
        return self.schedulers, float(self.schedulers)


def shape_for(plan: LoadPlan, schedulers: int = 1) -> PlanShape:
    """The shape class for an already-checked plan (what ``mme bench`` sends the runner)."""
    if plan.open_loop:
        assert plan.rate is not None
        return OpenLoopShape(plan.rate, plan.duration_s, schedulers)
    cls = _PLAN_CLASSES.get(plan.kind.split(":", 1)[0], PlanShape)
    shape = cast(PlanShape, object.__new__(cls))  # the subclass (its name shows in Locust), set up from the plan
    PlanShape.__init__(shape, plan)
    return shape


_PLAN_CLASSES: dict[str, type[PlanShape]] = {"staged": StagedShape, "ramp": RampShape, "constant": ConstantShape, "file": FileShape}
