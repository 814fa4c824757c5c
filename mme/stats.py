"""Statistics shared by every stage: one definition of a percentile.

Percentiles are exact and interpolated linearly between the closest ranks (numpy's "linear",
Hyndman & Fan type 7): what `mme report` prints, what `mme bench` checks `--max-p95-ms`
against while it runs, the per-model table, the in-process baseline and what the GPU check
reports. One function, so a run never stops on a p95 its own report shows under the limit.
numpy is imported when a percentile is computed, not when this module is.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def percentile(values: Iterable[float], q: float) -> float | None:
    """Exact q-th percentile (0..100) by linear interpolation; None when there are no values."""
    arr = values if isinstance(values, np.ndarray) else np.asarray(list(values), dtype=float)
    if arr.size == 0:
        return None
    return float(np.percentile(arr, q, method="linear"))
