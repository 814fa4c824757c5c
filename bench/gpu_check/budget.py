"""The GPU check's steps run in order, each timed, each held to what is left of the run's
budget, the report rewritten after every one (``after_step``)."""

from __future__ import annotations

import time
from typing import Callable

from bench.gpu_check.report import STEP_MARKS, Step


class Run:
    """Steps in order, each timed and held to what is left of the budget; ``after_step`` is
    called after every one (the report is rewritten there)."""

    def __init__(self, budget_s: float, after_step: Callable[[], None] = lambda: None) -> None:
        self.started = time.monotonic()
        self.budget_s = budget_s
        self.steps: list[Step] = []
        self.after_step = after_step

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def step(self, name: str, needs_s: float, body: Callable[[Step], None], skip: str = "",
             not_measured: str = "") -> Step:
        """``skip``: not run, and not needed here (the dry run's GPU-only steps);
        ``not_measured``: not run, and its figure is missing from this run."""
        step = Step(name)
        self.steps.append(step)
        if skip or not_measured:
            step.status, step.note = ("skipped", skip) if skip else ("not measured", not_measured)
        elif self.left() < needs_s:
            step.status = "not measured"
            step.note = f"not started: {self.left():.0f} s of the budget left, it needs about {needs_s:.0f} s"
        else:
            print(f"==> {name}", flush=True)
            start = time.monotonic()
            try:
                body(step)
                step.status = "ran"
            except Exception as exc:  # noqa: BLE001 - the check records the failure and goes on
                step.status = "failed"
                step.note = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
            step.seconds = round(time.monotonic() - start, 1)
        if step.status in ("failed", "not measured") and not step.headline:
            step.headline = f"{name.split('. ', 1)[-1]}: {step.status.upper()} ({step.note})"
        print(f"    {STEP_MARKS[step.status]} {name}{': ' + step.note if step.note else ''}", flush=True)
        self.after_step()
        return step
