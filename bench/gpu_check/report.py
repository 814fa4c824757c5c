"""The GPU check's record: the preflight, every step with its status, time, note and figures,
and headlines that say what was measured and what was NOT, written as gpu_check.json (for
machines) and gpu_check.md (for people), next to facts.json.

Both are rewritten after every step with ``complete: false`` until the last one, so a run
killed at a call's time limit still leaves every figure measured before it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu_check.detect import HostFacts
from mme.fsutil import write_bytes_atomic, write_json_atomic

SCHEMA_VERSION = 2
STEP_MARKS = {"ran": "RAN    ", "skipped": "SKIPPED", "failed": "FAILED ", "not measured": "NOT MEASURED"}


@dataclass
class Step:
    name: str
    status: str = "skipped"  # ran | skipped (not needed here: the CPU dry run) | not measured | failed
    seconds: float = 0.0
    note: str = ""
    figures: dict[str, Any] = field(default_factory=dict)  # JSON-ready: written as they are
    headline: str = ""  # one line for the top of the report: the step's figure, or why there is none


@dataclass
class GpuCheckReport:
    facts: HostFacts
    preflight: list[str]
    device: str  # "cuda" | "cpu" (the dry run)
    model: str
    batches: list[int]
    threshold: float
    seconds: float
    steps: list[Step]
    complete: bool = False  # every step was run or decided: false in the files written along the way
    exit_code: int | None = None
    created_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    schema_version: int = SCHEMA_VERSION

    def headlines(self) -> list[str]:
        lines = [] if self.device == "cuda" else ["NO GPU: a CPU dry run of every step's code; no figure is a GPU's"]
        return lines + [s.headline for s in self.steps if s.headline]

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "created_at": self.created_at, "complete": self.complete,
                "exit_code": self.exit_code, "device": self.device, "model": self.model, "batches": self.batches,
                "threshold": self.threshold, "seconds": self.seconds, "headlines": self.headlines(),
                "preflight": self.preflight, "facts": self.facts.to_dict(), "steps": [asdict(s) for s in self.steps]}


def markdown(report: GpuCheckReport) -> str:
    facts = report.facts
    where = (f"{facts.gpu_name} (compute capability {facts.compute_capability})" if report.device == "cuda"
             else "CPU dry run (--device cpu): every step's code, no GPU figures")
    state = "complete" if report.complete else "INCOMPLETE (written after a step; the run did not finish)"
    lines = [f"# GPU check: {where}", "", f"{state}; {report.seconds} s; {report.created_at}", ""]
    lines += [f"- **{h}**" for h in report.headlines()]
    lines += ["", "## Host", ""] + [f"- {line}" for line in report.preflight]
    lines += ["", "## Steps", "", "| step | status | seconds | note |", "| --- | --- | --- | --- |"]
    lines += [f"| {s.name} | {s.status} | {s.seconds} | {s.note or ''} |" for s in report.steps]
    for s in report.steps:
        for key, value in s.figures.items():
            if key.startswith("latency_ms") and isinstance(value, dict) and value:
                lines += ["", f"{s.name}: {key}", "", "| batch | p50 ms | p90 ms | p99 ms | items/s |",
                          "| --- | --- | --- | --- | --- |"]
                lines += [f"| {b} | {v['p50_ms']} | {v['p90_ms']} | {v['p99_ms']} | {v['items_per_s']} |"
                          for b, v in value.items()]
        rest = {k: v for k, v in s.figures.items() if not k.startswith("latency_ms")}
        if rest:
            lines += ["", f"{s.name}:", ""] + [f"- {k}: {v}" for k, v in rest.items()]
    return "\n".join(lines) + "\n"


def write_facts(facts: HostFacts, out: Path) -> Path:
    path = out / "facts.json"
    write_json_atomic(path, facts.to_dict())
    return path


def write_report(report: GpuCheckReport, out: Path) -> tuple[Path, Path]:
    """gpu_check.json and gpu_check.md in ``out`` (each replaced whole: a reader sees the old
    file or the new one)."""
    json_path, md_path = out / "gpu_check.json", out / "gpu_check.md"
    write_json_atomic(json_path, report.to_dict())
    write_bytes_atomic(md_path, markdown(report).encode())
    return json_path, md_path
