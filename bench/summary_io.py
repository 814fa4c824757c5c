"""Writing a run's summary next to its results: ``summary.csv`` (one row per stage,
``STAGE_COLUMNS``) and ``summary.json`` (``RunSummary.to_json``), both atomically."""

from __future__ import annotations

import csv
import io
from dataclasses import asdict
from pathlib import Path

from bench.summary_records import STAGE_COLUMNS, SUMMARY_CSV, SUMMARY_JSON, RunSummary, rounded
from mme.fsutil import write_bytes_atomic, write_json_atomic


def summary_csv_text(summary: RunSummary) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(STAGE_COLUMNS)
    for s in summary.stages:
        row = rounded(asdict(s))
        writer.writerow(["" if row[c] is None else int(row[c]) if isinstance(row[c], bool) else row[c]
                         for c in STAGE_COLUMNS])
    return buffer.getvalue()


def write_summary(summary: RunSummary, out_dir: Path | None = None) -> tuple[Path, Path]:
    """(Re)write summary.csv and summary.json (atomically) in ``out_dir`` (default: the run dir)."""
    target = out_dir or summary.run_dir
    csv_path, json_path = target / SUMMARY_CSV, target / SUMMARY_JSON
    write_bytes_atomic(csv_path, summary_csv_text(summary).encode())
    write_json_atomic(json_path, summary.to_json())
    return csv_path, json_path
