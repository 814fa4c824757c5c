"""Reading one bench run directory for the analysis: ``run.json``, ``requests.csv`` grouped
by stage (with the first failure) and ``stages.csv``, each checked so bad input becomes a
one-line ``MmeError`` (a last ``requests.csv`` row cut short by an interrupted write is left
out with a warning instead). ``endpoint_metrics.jsonl`` is read by ``bench.endpoint_stages``."""

from __future__ import annotations

import csv
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.results import (
    REQUIRED_REQUEST_FIELDS,
    REQUESTS_FILE,
    RUN_FILE,
    STAGE_FIELDS,
    STAGES_FILE,
    RunInfo,
    StageRecord,
    read_requests,
    read_stages,
)
from mme.errors import MmeError


@dataclass(frozen=True)
class StageRequests:
    latencies: np.ndarray  # successful requests' latencies, ms
    requests: int  # answered or failed (cut-offs not included)
    failures: int
    errors: Counter  # error code -> failures
    first_t: float
    last_end_t: float
    max_users: int
    cut_off: int = 0  # still in flight when the drain ended the run
    reasons: Counter = field(default_factory=Counter)  # (error, message, target) -> failures
    cold: int | None = None  # requests that waited for their model to load; None: the endpoint did not say
    warm_latencies: np.ndarray = field(default_factory=lambda: np.empty(0))  # successful warm requests, ms
    cold_latencies: np.ndarray = field(default_factory=lambda: np.empty(0))  # successful cold requests, ms


class _Accumulator:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.requests = 0
        self.failures = 0
        self.errors: Counter = Counter()
        self.first_t = math.inf
        self.last_end_t = -math.inf
        self.max_users = 0
        self.cut_off = 0
        self.reasons: Counter = Counter()
        self.cold: int | None = None
        self.warm_latencies: list[float] = []
        self.cold_latencies: list[float] = []

    def freeze(self) -> StageRequests:
        return StageRequests(np.asarray(self.latencies, dtype=float), self.requests, self.failures, self.errors,
                             self.first_t, self.last_end_t, self.max_users, self.cut_off, self.reasons, self.cold,
                             np.asarray(self.warm_latencies, dtype=float), np.asarray(self.cold_latencies, dtype=float))


@dataclass(frozen=True)
class FirstFailure:
    t: float
    users: int
    error: str


def reason(exc: BaseException) -> str:
    """An exception as a short lower-case phrase for a one-line error or warning."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return " ".join(str(exc).split()) or type(exc).__name__


def _check_header(path: Path, expected: tuple[str, ...]) -> None:
    try:
        with open(path, newline="") as fh:
            header = next(csv.reader(fh), None)
    except FileNotFoundError:
        raise MmeError(f"{path.parent} has no {path.name}; pass a directory written by 'mme bench'") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise MmeError(f"cannot read {path}: {reason(exc)}") from None
    if header is None:
        raise MmeError(f"{path} is empty (no header row); the run wrote nothing readable")
    missing = [name for name in expected if name not in header]
    if missing:
        raise MmeError(f"{path} is not a bench {path.stem} file: missing column(s) {', '.join(missing)}")


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        if fh.tell() == 0:
            return True
        fh.seek(-1, 2)
        return fh.read(1) == b"\n"


def _line_count(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for _ in fh)


def read_stage_requests(run_dir: Path, warnings: list[str], estimated_cold: frozenset[int] | None = None,
                        ) -> tuple[dict[int, StageRequests], FirstFailure | None]:
    """Requests grouped by stage. A last row cut short (the generator was killed while
    writing it: no newline at the end of the file) is left out with a warning; any other
    unreadable row is an error. ``estimated_cold``: the rows (0 = the first request) taken as
    cold where the endpoint did not say (``bench.cold_estimate``); the others are then warm."""
    path = run_dir / REQUESTS_FILE
    _check_header(path, REQUIRED_REQUEST_FIELDS)
    acc: dict[int, _Accumulator] = {}
    first: FirstFailure | None = None
    line = 1
    try:
        for line, rec in enumerate(read_requests(run_dir), start=2):  # noqa: B007 (the handlers below name the line)
            a = acc.get(rec.stage)
            if a is None:
                a = acc[rec.stage] = _Accumulator()
            a.first_t = min(a.first_t, rec.t)
            a.last_end_t = max(a.last_end_t, rec.t + rec.latency_ms / 1000.0)
            a.max_users = max(a.max_users, rec.users)
            if rec.cut_off:
                a.cut_off += 1
                continue
            a.requests += 1
            cold = rec.cold if estimated_cold is None else int(line - 2 in estimated_cold)
            if cold is not None:
                a.cold = (a.cold or 0) + cold
            if rec.ok:
                a.latencies.append(rec.latency_ms)
                if cold is not None:
                    (a.cold_latencies if cold else a.warm_latencies).append(rec.latency_ms)
            else:
                a.failures += 1
                error = rec.error or (f"HTTP {rec.status}" if rec.status else "no response")
                a.errors[error] += 1
                a.reasons[(error, rec.message, rec.target)] += 1
                if first is None or rec.t < first.t:
                    first = FirstFailure(rec.t, rec.users, error)
    except (ValueError, TypeError, csv.Error, UnicodeDecodeError, OSError) as exc:
        bad_line = line + 1
        if not isinstance(exc, OSError) and not _ends_with_newline(path) and _line_count(path) == bad_line:
            warnings.append(f"{REQUESTS_FILE} line {bad_line} was cut short (interrupted write): left out")
        else:
            raise MmeError(f"cannot read {path} near line {bad_line}: {reason(exc)}") from None
    return {stage: a.freeze() for stage, a in acc.items()}, first


def read_stage_records(run_dir: Path) -> list[StageRecord] | None:
    """``stages.csv``'s rows; None when the run has none."""
    path = run_dir / STAGES_FILE
    if not path.exists():
        return None
    _check_header(path, STAGE_FIELDS)
    try:
        return read_stages(run_dir)
    except (ValueError, TypeError, csv.Error, UnicodeDecodeError, OSError) as exc:
        raise MmeError(f"cannot read {path}: {reason(exc)}") from None


def read_run_info(run_dir: Path) -> RunInfo:
    if not run_dir.exists():
        raise MmeError(f"{run_dir} does not exist; pass a directory written by 'mme bench'")
    if not run_dir.is_dir():
        raise MmeError(f"{run_dir} is not a directory; pass a directory written by 'mme bench'")
    try:
        return RunInfo.read(run_dir)
    except (TypeError, AttributeError) as exc:
        raise MmeError(f"{run_dir / RUN_FILE} is not a bench run description ({reason(exc)})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MmeError(f"cannot read {run_dir / RUN_FILE}: {reason(exc)}") from None
