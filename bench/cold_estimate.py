"""Which requests waited for a model load, where the endpoint does not say per request
(SageMaker): an estimate from the run's latencies and the endpoint's CloudWatch
``ModelLoadingWaitTime``, whose SampleCount per period is the number of invocations that
waited for their model to be downloaded or loaded.

In each CloudWatch period, the requests of the run that finished in it are ranked by
latency and the N slowest successful ones are taken as cold, N being that period's
SampleCount (at most the requests there are). A load wait adds to the latency of the request
that waits, so the cold ones are among the slowest; the estimate can be wrong where warm
requests are as slow as cold ones (a saturated endpoint), and it counts every invocation
CloudWatch saw, so other clients of the endpoint in the same minutes inflate it. The report
names the method next to the figures.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from pathlib import Path

from bench.cloudwatch_data import CLOUDWATCH_FILE, read_cloudwatch, utc_time
from bench.results import RunInfo, readable_requests

COLD_ESTIMATE_METHOD = (
    "estimated: in each CloudWatch period, the N slowest successful requests that finished in it, N = the "
    "endpoint's ModelLoadingWaitTime SampleCount (requests that waited for a load) then")
WAITED = ("ModelLoadingWaitTime", "SampleCount")


def estimate_cold(run_dir: Path, run: RunInfo, warnings: list[str]) -> frozenset[int] | None:
    """Row numbers (0 = the first request of requests.csv) of the requests estimated cold;
    None when there is nothing to estimate from (no saved CloudWatch metrics, no
    ModelLoadingWaitTime) or nothing to estimate (the endpoint said which requests were cold)."""
    try:
        saved = read_cloudwatch(run_dir)
    except (OSError, ValueError):
        return None  # the report names the unusable file where it would draw it
    if saved is None:
        return None
    period, waited = saved.period_s, saved.series.get(WAITED)
    if waited is None:
        warnings.append(f"{CLOUDWATCH_FILE} has no ModelLoadingWaitTime SampleCount: cold requests not estimated")
        return None
    try:
        origin = utc_time(run.started_at or "")
    except ValueError:
        warnings.append("run.json has no start time: cold requests not estimated from CloudWatch")
        return None
    rows = readable_requests(run_dir)  # bench.run_reader reports an unreadable row
    if any(r.cold is not None for r in rows):
        return None  # the endpoint told them apart itself
    starts = [(moment - origin).total_seconds() for moment, _ in waited]
    finished: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for row, r in enumerate(rows):
        if r.cut_off or not r.ok:
            continue
        end = r.t + r.latency_ms / 1000.0
        k = bisect_right(starts, end) - 1
        if k >= 0 and end < starts[k] + period:
            finished[k].append((r.latency_ms, row))
    cold: set[int] = set()
    for k, (_, count) in enumerate(waited):
        slowest = sorted(finished[k], reverse=True)[:max(0, round(count))]
        cold.update(row for _, row in slowest)
    return frozenset(cold)
