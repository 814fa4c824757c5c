"""The GPU check's record: every step with its status, time, note and figures, written as
gpu_check.json (for machines) and gpu_check.md (for people), next to facts.json."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu_check.detect import HostFacts
from mme.fsutil import write_bytes_atomic, write_json_atomic

SCHEMA_VERSION = 1
STEP_MARKS = {"ran": "RAN    ", "skipped": "SKIPPED", "failed": "FAILED "}


@dataclass
class Step:
    name: str
    status: str = "skipped"  # ran | skipped | failed
    seconds: float = 0.0
    note: str = ""
    figures: dict[str, Any] = field(default_factory=dict)  # JSON-ready: written as they are


@dataclass
class GpuCheckReport:
    facts: HostFacts
    device: str  # "cuda" | "cpu" (the dry run)
    model: str
    batches: list[int]
    threshold: float
    seconds: float
    steps: list[Step]
    created_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "created_at": self.created_at, "facts": self.facts.to_dict(),
                "device": self.device, "model": self.model, "batches": self.batches, "threshold": self.threshold,
                "seconds": self.seconds, "steps": [asdict(s) for s in self.steps]}


def markdown(report: GpuCheckReport) -> str:
    facts = report.facts
    where = (f"{facts.gpu_name} (compute capability {facts.compute_capability})" if report.device == "cuda"
             else "CPU dry run (--device cpu): every step's code, no GPU figures")
    lines = [f"# GPU check: {where}", "",
             f"torch {facts.torch}, Python {facts.python}, TensorRT {facts.tensorrt or 'absent'}, "
             f"nvidia-pytriton {facts.pytriton or 'absent'}; {report.seconds} s in all", "",
             "| step | status | seconds | note |", "| --- | --- | --- | --- |"]
    lines += [f"| {s.name} | {s.status} | {s.seconds} | {s.note or ''} |" for s in report.steps]
    for s in report.steps:
        latency_ms = s.figures.get("latency_ms")
        if latency_ms:
            lines += ["", f"{s.name}: latency", "", "| batch | p50 ms | p90 ms | p99 ms | items/s |",
                      "| --- | --- | --- | --- | --- |"]
            lines += [f"| {b} | {v['p50_ms']} | {v['p90_ms']} | {v['p99_ms']} | {v['items_per_s']} |"
                      for b, v in latency_ms.items()]
        rest = {k: v for k, v in s.figures.items() if k != "latency_ms"}
        if rest:
            lines += ["", f"{s.name}: " + "; ".join(f"{k} {v}" for k, v in rest.items())]
    return "\n".join(lines) + "\n"


def write_facts(facts: HostFacts, out: Path) -> Path:
    path = out / "facts.json"
    write_json_atomic(path, facts.to_dict())
    return path


def write_report(report: GpuCheckReport, out: Path) -> tuple[Path, Path]:
    """gpu_check.json and gpu_check.md in ``out``."""
    json_path, md_path = out / "gpu_check.json", out / "gpu_check.md"
    write_json_atomic(json_path, report.to_dict())
    write_bytes_atomic(md_path, markdown(report).encode())
    return json_path, md_path
