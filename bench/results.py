"""The saved results of one bench run: the contract between the load generator
(``bench.run``) and the analysis and reports (``bench.analysis``, ``bench.report``), so
reports rebuild from files without re-running.

A run directory holds::

    run.json                 RunInfo: what was tested and how (schema-versioned)
    requests.csv             one row per request (REQUEST_FIELDS), exact latencies
    stages.csv               one row per load stage (StageRecord): timing, users, generator CPU
    endpoint_metrics.jsonl   where the endpoint exposes /metrics.json: a baseline before the first stage,
                             one every 10 s within a stage and one at each stage end
    locust_stats.csv, locust_stats_history.csv, locust_failures.csv   Locust's own CSVs
    summary.csv, summary.json, report.html, report.md, *.png          written by the analysis/report

Latencies are milliseconds; times ``t`` are seconds since the run started.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Iterator

from mme.fsutil import read_versioned_json, write_json_atomic

SCHEMA_VERSION = 1
RUN_FILE = "run.json"
REQUESTS_FILE = "requests.csv"
STAGES_FILE = "stages.csv"
ENDPOINT_METRICS_FILE = "endpoint_metrics.jsonl"


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    endpoint: str  # endpoint name
    endpoint_url: str | None  # None: AWS's own URL for the region
    region: str
    mode: str  # "multi" (TargetModel per request) | "single" (real-time endpoint)
    model: str | None
    format: str | None
    instance_type: str | None  # e.g. ml.g5.2xlarge, or "local"
    copies: int  # distinct target models requests were spread over (0 for single)
    target_distribution: str  # "uniform" | "zipf:<s>"
    client: str  # "fast" (SigV4 over geventhttpclient) | "boto3"
    workers: int  # generator processes (1 = local runner)
    shape: str  # "staged" | "ramp" | "constant" | "file:<path>" | "open-loop"
    content_type: str
    payload_bytes: int
    started_at: str  # ISO 8601 UTC
    ended_at: str | None = None
    stopped_reason: str | None = None  # "completed" | "stop-on-failure" | "max-p95-ms" | "interrupted" | ...
    models_loaded: int | None = None  # from capacity or the endpoint's metrics
    extra: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def write(self, run_dir: Path) -> None:
        write_json_atomic(run_dir / RUN_FILE, asdict(self))

    @classmethod
    def read(cls, run_dir: Path) -> "RunInfo":
        data = read_versioned_json(
            run_dir / RUN_FILE, SCHEMA_VERSION,
            missing=f"{run_dir} is not a bench run (no {RUN_FILE}); pass directories written by 'mme bench'",
            remedy="re-run 'mme bench'",
        )
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class RequestRecord:
    t: float  # seconds since the run started, when the request was sent
    stage: int  # index into stages.csv
    users: int  # users running when it was sent
    target: str  # TargetModel ("" for single-model endpoints)
    latency_ms: float  # client-side end to end
    ok: int  # 1 success, 0 failure
    status: int  # HTTP status; 0 when no response (connection error, timeout)
    error: str  # "" when ok; the error code (ValidationError, ModelError...) or exception name
    worker: str  # generator process id (host:pid)
    message: str = ""  # on failure: the server's message or the exception's text
    cut_off: int = 0  # 1: still in flight when the drain timeout ended the run (no answer, not a failure)
    cold: int | None = None  # 1: waited for its model to load; 0: warm; empty: the endpoint does not say


@dataclass(frozen=True)
class StageRecord:
    stage: int
    start_t: float
    end_t: float
    users: int  # target user count of the stage
    spawn_rate: float
    generator_cpu_max: float  # percent of one core, highest sample of any worker during the stage
    generator_cpu_mean: float
    saturated: int  # 1 when a generator was above the saturation threshold (90%): results unreliable


REQUEST_FIELDS = tuple(f.name for f in fields(RequestRecord))
REQUIRED_REQUEST_FIELDS = REQUEST_FIELDS[:9]  # runs saved before message and cut_off still read
STAGE_FIELDS = tuple(f.name for f in fields(StageRecord))


class RequestWriter:
    """Appends request rows as they come (flushes so an interrupted run keeps what it measured)."""

    def __init__(self, run_dir: Path) -> None:
        self._file = open(run_dir / REQUESTS_FILE, "w", newline="")
        self._writer = csv.writer(self._file)
        self._writer.writerow(REQUEST_FIELDS)

    def write(self, records: Iterable[RequestRecord]) -> None:
        self._writer.writerows(
            (round(r.t, 6), r.stage, r.users, r.target, round(r.latency_ms, 4), r.ok, r.status, r.error, r.worker,
             r.message, r.cut_off, "" if r.cold is None else r.cold)
            for r in records
        )
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def write_stages(run_dir: Path, stages: Iterable[StageRecord]) -> None:
    with open(run_dir / STAGES_FILE, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(STAGE_FIELDS)
        writer.writerows(tuple(asdict(s).values()) for s in stages)


def read_requests(run_dir: Path) -> Iterator[RequestRecord]:
    with open(run_dir / REQUESTS_FILE, newline="") as fh:
        for row in csv.DictReader(fh):
            yield RequestRecord(
                t=float(row["t"]), stage=int(row["stage"]), users=int(row["users"]), target=row["target"],
                latency_ms=float(row["latency_ms"]), ok=int(row["ok"]), status=int(row["status"]),
                error=row["error"], worker=row["worker"], message=row.get("message") or "",
                cut_off=int(row.get("cut_off") or 0), cold=int(row["cold"]) if row.get("cold") else None,
            )


def readable_requests(run_dir: Path) -> list[RequestRecord]:
    """requests.csv's rows up to the first unreadable one ([] without the file): for figures that
    leave the checking to ``bench.run_reader``, which says what is wrong with the file or leaves out
    a last row cut short by an interrupted write."""
    rows: list[RequestRecord] = []
    try:
        for record in read_requests(run_dir):
            rows.append(record)
    except (ValueError, TypeError, KeyError, csv.Error, UnicodeDecodeError, OSError):
        return rows  # those before the unreadable one
    return rows


def read_stages(run_dir: Path) -> list[StageRecord]:
    with open(run_dir / STAGES_FILE, newline="") as fh:
        return [
            StageRecord(
                stage=int(r["stage"]), start_t=float(r["start_t"]), end_t=float(r["end_t"]), users=int(r["users"]),
                spawn_rate=float(r["spawn_rate"]), generator_cpu_max=float(r["generator_cpu_max"]),
                generator_cpu_mean=float(r["generator_cpu_mean"]), saturated=int(r["saturated"]),
            )
            for r in csv.DictReader(fh)
        ]


def append_endpoint_metrics(run_dir: Path, stage: int, t: float, snapshot: dict, at: str = "end") -> None:
    """One line: ``stage`` (-1 before the first), run time ``t`` and when within the stage
    (``at``: start, during or end). Appended and flushed at once, so a run that dies keeps
    every snapshot taken before."""
    with open(run_dir / ENDPOINT_METRICS_FILE, "a") as fh:
        fh.write(json.dumps({"stage": stage, "t": round(t, 3), "at": at, "snapshot": snapshot}) + "\n")


def read_endpoint_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / ENDPOINT_METRICS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
