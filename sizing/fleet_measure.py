"""A fleet measured: every catalogue model as ``mme capacity`` measures one (one copy on an empty
Triton: memory at rest and after requests at its max batch size, load and unload seconds), plus
the server's baseline and the endpoint's requests in flight (:func:`measure_fleet`). Saved as
``fleet-measurements.json`` (:class:`FleetMeasurement`), so a plan for another mix or limit is
rebuilt without measuring again."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from mme.errors import UsageError
from mme.fsutil import read_versioned_json
from mme.progress import Reporter
from packager.manifest import Manifest
from sizing.capacity import measure_capacity

SCHEMA_VERSION = 1
MEASUREMENTS = "fleet-measurements.json"
MIB = 2**20


@dataclass(frozen=True)
class ModelFootprint:
    model: str
    target: str  # the tarball name requests name
    format: str
    artifact: str
    rest_bytes: int
    loaded_bytes: int
    load_seconds: float
    unload_seconds: float = 0.0  # measurements written before it was measured read 0
    latency_seconds: float = 0.0  # one request alone, loaded (0: measured before it was recorded)


@dataclass(frozen=True)
class FleetMeasurement:
    memory_kind: str
    baseline_bytes: int
    overhead_bytes: int  # the endpoint's requests in flight (the largest measured), counted once
    models: tuple[ModelFootprint, ...]
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def load(cls, path: Path) -> "FleetMeasurement":
        data = read_versioned_json(path, SCHEMA_VERSION, missing=f"--measurements {path}: no such file",
                                   remedy="measure again without --measurements")
        try:
            return cls(str(data["memory_kind"]), int(data["baseline_bytes"]), int(data["overhead_bytes"]),
                       tuple(ModelFootprint(**m) for m in data["models"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{path} is not a fleet measurement ({exc}); measure again without --measurements") from None

    def footprint(self, target: str) -> ModelFootprint:
        return next(m for m in self.models if m.target == target)


def measure_fleet(artifacts: list[Path], reporter: Reporter, *, server_kind: str = "local", memory: str = "auto",
                  concurrency: int = 200, binary: bool = False) -> FleetMeasurement:
    """One copy of each artifact on its own empty Triton, measured as ``mme capacity`` does."""
    footprints, baselines, overheads, kinds = [], [], [], set()
    for index, artifact in enumerate(artifacts, start=1):
        manifest = Manifest.load(artifact)
        reporter.info(f"  [{index}/{len(artifacts)}] {manifest.model} ({manifest.format})")
        report = measure_capacity(artifact, threshold=0.9, limit_bytes=None, probe_copies=1, verify=False,
                                  max_copies=1, reporter=Reporter(quiet=True), server_kind=server_kind, memory=memory,
                                  concurrency=concurrency, binary=binary, measure_unload=True)
        step = report.steps[0]
        footprints.append(ModelFootprint(manifest.model, manifest.tarball, manifest.format, str(artifact),
                                         int(step.rest_delta_bytes or step.delta_bytes), int(step.delta_bytes),
                                         round(step.load_seconds, 3), report.unload_seconds or 0.0,
                                         round((report.served_latency_ms or 0.0) / 1000.0, 4)))
        baselines.append(report.baseline_bytes)
        overheads.append(report.overhead_bytes)
        kinds.add(report.memory_kind)
        reporter.info(f"      {step.delta_bytes / MIB:.0f} MiB loaded ({(step.rest_delta_bytes or 0) / MIB:.0f} at rest), "
                      f"load {step.load_seconds:.2f} s, unload {report.unload_seconds or 0:.2f} s")
    return FleetMeasurement(" / ".join(sorted(kinds)), int(statistics.median(baselines)), max(overheads),
                            tuple(footprints))
