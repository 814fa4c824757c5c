"""One readiness-polling loop for every stage: a SageMaker endpoint reaching InService, a
training job completing, Triton answering /ping, the demo's local endpoint coming up.

``poll_until(check, ...)`` calls ``check(elapsed)`` until it returns something other than
None. ``check`` raises for a terminal failure (a failed job, a process that exited); when
the next wait would pass ``timeout_s``, ``on_timeout(elapsed)`` builds the error raised.
The clock and sleep are injectable so tests run without waiting.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def poll_until(check: Callable[[Callable[[], float]], T | None], *, timeout_s: float, interval_s: float,
               on_timeout: Callable[[float], BaseException], sleep: Callable[[float], None] = time.sleep,
               clock: Callable[[], float] = time.monotonic) -> T:
    """The first non-None result of ``check(elapsed)``, polled every ``interval_s`` seconds.

    ``elapsed()`` gives the seconds since polling started (for progress lines). Raises
    ``on_timeout(elapsed)`` instead of sleeping past ``timeout_s``.
    """
    start = clock()

    def elapsed() -> float:
        return clock() - start

    while True:
        result = check(elapsed)
        if result is not None:
            return result
        waited = elapsed()
        if waited + interval_s > timeout_s:
            raise on_timeout(waited)
        sleep(interval_s)
