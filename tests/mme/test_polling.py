"""mme.polling.poll_until: the one readiness loop (fake clock, no real waiting)."""

from __future__ import annotations

import pytest

from mme.polling import poll_until


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_returns_the_first_result_and_reports_elapsed_time() -> None:
    clock = FakeClock()
    seen: list[float] = []

    def check(elapsed):
        seen.append(elapsed())
        return "ready" if len(seen) == 3 else None

    result = poll_until(check, timeout_s=60, interval_s=5, on_timeout=RuntimeError, sleep=clock.sleep, clock=clock)
    assert result == "ready"
    assert seen == [0.0, 5.0, 10.0]
    assert clock.sleeps == [5, 5]


def test_times_out_before_sleeping_past_the_limit() -> None:
    clock = FakeClock()
    calls: list[int] = []

    def check(elapsed):
        calls.append(1)
        return None

    with pytest.raises(TimeoutError, match=r"after 10 s"):
        poll_until(check, timeout_s=12, interval_s=5, sleep=clock.sleep, clock=clock,
                   on_timeout=lambda waited: TimeoutError(f"after {waited:.0f} s"))
    assert len(calls) == 3  # at 0, 5, 10; a fourth wait would end at 15 > 12
    assert sum(clock.sleeps) == 10


def test_a_terminal_failure_raised_by_check_stops_polling() -> None:
    clock = FakeClock()

    def check(elapsed):
        raise ValueError("job failed")

    with pytest.raises(ValueError, match="job failed"):
        poll_until(check, timeout_s=60, interval_s=1, on_timeout=RuntimeError, sleep=clock.sleep, clock=clock)
    assert clock.sleeps == []
