"""``mme package --catalogue``'s results: one :class:`EntryResult` per entry, each packaged
format's figures read back from its manifest (:func:`format_rows`), and the summary files
``catalogue-summary.{json,csv,md}`` under ``--out`` (:func:`write_catalogue_summary`)."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mme.fsutil import write_bytes_atomic, write_json_atomic
from packager.catalogue import Catalogue, CatalogueEntry
from packager.manifest import Manifest
from packager.model import triton_model_name
from packager.request import PackageRequest

CATALOGUE_SUMMARY_SCHEMA = 1
SUMMARY_NAME = "catalogue-summary"
STAGES = ("load", "reference", "tokenizer", "export", "validate", "layout", "tarball")


@dataclass
class EntryResult:
    entry: CatalogueEntry
    status: str = "pending"  # packaged | up to date | failed
    seconds: float = 0.0
    peak_rss_mib: float = 0.0
    error: str = ""
    log: str = ""
    formats: list[dict[str, Any]] = field(default_factory=list)
    job: str = ""  # the SageMaker training job that packaged it (--on sagemaker)

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.entry.index, "name": self.entry.name, "status": self.status,
                "options": dict(self.entry.options), "seconds": round(self.seconds, 2),
                "peak_rss_mib": round(self.peak_rss_mib, 1), "error": self.error, "log": self.log,
                "formats": self.formats, "job": self.job}


def format_rows(request: PackageRequest, out: Path) -> list[dict[str, Any]]:
    """Per format of a packaged entry: tarball size, validation max diff and seconds per stage."""
    rows = []
    for fmt in request.formats:
        directory = out / triton_model_name(request.model.name) / fmt
        try:
            manifest = Manifest.load(directory)
        except Exception:  # a format the entry did not get to
            continue
        tarball = directory / manifest.tarball
        rows.append({"format": fmt, "directory": str(directory),
                     "tarball_mb": round(tarball.stat().st_size / 1e6, 2) if tarball.is_file() else None,
                     "max_abs_diff": manifest.validation.max_abs_diff, "weights": manifest.weights,
                     "parameters": manifest.parameters,
                     "stages_s": {s: manifest.timings_s[s] for s in STAGES if s in manifest.timings_s}})
    return rows


def write_catalogue_summary(out: Path, catalogue: Catalogue, results: list[EntryResult], jobs: int, wall_s: float,
                  where: str = "local") -> list[Path]:
    counts = {s: sum(r.status == s for r in results) for s in ("packaged", "up to date", "failed")}
    document = {"schema_version": CATALOGUE_SUMMARY_SCHEMA, "catalogue": str(catalogue.path), "out": str(out),
                "jobs": jobs, "where": where, "wall_s": round(wall_s, 2), "counts": counts,
                "entries": [r.to_dict() for r in results]}
    json_path = out / f"{SUMMARY_NAME}.json"
    write_json_atomic(json_path, document)
    header = ["index", "name", "status", "format", "tarball_mb", "max_abs_diff", *[f"{s}_s" for s in STAGES],
              "entry_seconds", "peak_rss_mib", "options", "error", "job"]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    md = [f"# Catalogue {catalogue.path.name}: {counts['packaged']} packaged, {counts['up to date']} up to date, "
          f"{counts['failed']} failed", "", f"{len(results)} entries, --jobs {jobs}, on {where}, {wall_s:.1f} s wall.", "",
          "| # | model | status | format | tarball MB | max abs diff | " + " | ".join(f"{s} s" for s in STAGES)
          + " | entry s | peak RSS MiB | options |", "|" + " --- |" * (10 + len(STAGES))]
    for r in results:
        options = " ".join(f"{k}={v}" for k, v in r.entry.options.items())
        for row in r.formats or [{"format": "", "tarball_mb": None, "max_abs_diff": None, "stages_s": {}}]:
            stages = [row["stages_s"].get(s, "") for s in STAGES]
            writer.writerow([r.entry.index, r.entry.name, r.status, row["format"], row["tarball_mb"],
                             row["max_abs_diff"], *stages, round(r.seconds, 2), round(r.peak_rss_mib, 1), options,
                             r.error, r.job])
            diff = "" if row["max_abs_diff"] is None else f"{row['max_abs_diff']:.2e}"
            status = r.status + (f" (job {r.job})" if r.job else "") + (f": {r.error}" if r.error else "")
            cells = [str(r.entry.index), r.entry.name, status, row["format"],
                     "" if row["tarball_mb"] is None else f"{row['tarball_mb']:.1f}", diff,
                     *[str(v) for v in stages], f"{r.seconds:.1f}", f"{r.peak_rss_mib:.0f}", options]
            md.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    csv_path, md_path = out / f"{SUMMARY_NAME}.csv", out / f"{SUMMARY_NAME}.md"
    write_bytes_atomic(csv_path, buffer.getvalue().encode())
    write_bytes_atomic(md_path, ("\n".join(md) + "\n").encode())
    return [json_path, csv_path, md_path]
