"""``mme capacity``: the articles' copy-counting loop, done locally and checked.

Start an empty server, measure its baseline, load copies one by one through the container
API measuring after each, predict how many fit under the threshold, then load to the
threshold to check the prediction. ``cycles`` loads and unloads one copy repeatedly and
reports whether memory returns to where it started (users see memory not released).

The report is shared with ``mme capacity --endpoint`` (``serving.capacity_remote``): each
loop only takes readings into :class:`Readings` (baseline, then memory after each copy);
:func:`build_report` turns them into the per-copy footprint, the prediction, the copies that
fit and the projections onto other instance types.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from mme.errors import UsageError
from mme.fsutil import write_json_atomic
from mme.progress import Reporter
from serving.cache import ModelCache
from serving.container import ContainerClient
from serving.copies import CopiesSource, copy_name
from serving.instances import load_instances
from serving.store import LocalDirSource

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class CapacityStep:
    copies: int
    memory_bytes: int
    delta_bytes: int
    load_seconds: float


@dataclass(frozen=True)
class Projection:
    instance_type: str
    gpu: str
    memory_bytes: int
    copies: int


@dataclass(frozen=True)
class CapacityReport:
    model: str
    format: str
    memory_kind: str  # "host RSS of the Triton process tree" or "GPU memory (NVML)"
    limit_bytes: int
    threshold: float
    baseline_bytes: int
    steps: tuple[CapacityStep, ...]
    footprint_mean_bytes: int
    footprint_min_bytes: int
    footprint_max_bytes: int
    predicted_copies: int
    actual_copies: int | None
    projections: tuple[Projection, ...]
    leak_check: dict | None
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        return asdict(self)


def predict(baseline: int, footprint: float, limit: int, threshold: float) -> int:
    if footprint <= 0:
        return 0
    return max(0, math.floor((threshold * limit - baseline) / footprint))


@dataclass(frozen=True)
class Footprint:
    """What one copy adds to memory: the mean, min and max of the steps' deltas."""

    mean_bytes: float
    min_bytes: int
    max_bytes: int

    @classmethod
    def of(cls, steps: Sequence[CapacityStep]) -> "Footprint":
        deltas = [s.delta_bytes for s in steps]
        if not deltas:
            raise ValueError("a footprint needs at least one step")
        return cls(statistics.fmean(deltas), min(deltas), max(deltas))

    def line(self) -> str:
        return f"per copy {self.mean_bytes / 2**20:.0f} MiB (min {self.min_bytes / 2**20:.0f}, max {self.max_bytes / 2**20:.0f})"


@dataclass
class Readings:
    """What a capacity loop reads: the server's memory before any copy, then after each copy
    it loads (:meth:`record`). The local loop reads a meter on this host, the remote one the
    gpu-metrics model on the endpoint."""

    model: str
    format: str
    memory_kind: str
    limit_bytes: int
    threshold: float
    baseline_bytes: int
    steps: list[CapacityStep] = field(default_factory=list)

    @property
    def budget_bytes(self) -> float:
        return self.threshold * self.limit_bytes

    @property
    def memory_bytes(self) -> int:
        """The latest reading (the baseline before any copy)."""
        return self.steps[-1].memory_bytes if self.steps else self.baseline_bytes

    def record(self, memory_bytes: int, load_seconds: float) -> CapacityStep:
        """The next copy is loaded and memory reads ``memory_bytes``."""
        step = CapacityStep(len(self.steps) + 1, memory_bytes, memory_bytes - self.memory_bytes, round(load_seconds, 3))
        self.steps.append(step)
        return step

    def fitted(self) -> int:
        """How many copies were loaded with memory still under the threshold."""
        return len([s for s in self.steps if s.memory_bytes <= self.budget_bytes])


def project(baseline: int, footprint: Footprint, threshold: float,
            instances: dict[str, dict] | None = None) -> tuple[Projection, ...]:
    """The copies that would fit under ``threshold`` of each instance type's GPU memory."""
    rows = instances or load_instances()
    return tuple(
        Projection(name, row.get("gpu", ""), int(row["gpu_memory_gib"] * 2**30),
                   predict(baseline, footprint.mean_bytes, int(row["gpu_memory_gib"] * 2**30), threshold))
        for name, row in rows.items()
    )


def build_report(readings: Readings, footprint_steps: Sequence[CapacityStep] | None = None, *, verified: bool = True,
                 leak_check: dict | None = None, instances: dict[str, dict] | None = None) -> CapacityReport:
    """Readings -> per-copy footprint (over ``footprint_steps``, default all steps) ->
    prediction -> copies that fit (when the loop went on to the threshold: ``verified``) ->
    projections onto instance types -> the report both loops write."""
    footprint = Footprint.of(readings.steps if footprint_steps is None else footprint_steps)
    return CapacityReport(
        model=readings.model, format=readings.format, memory_kind=readings.memory_kind, limit_bytes=readings.limit_bytes,
        threshold=readings.threshold, baseline_bytes=readings.baseline_bytes, steps=tuple(readings.steps),
        footprint_mean_bytes=int(footprint.mean_bytes), footprint_min_bytes=footprint.min_bytes,
        footprint_max_bytes=footprint.max_bytes,
        predicted_copies=predict(readings.baseline_bytes, footprint.mean_bytes, readings.limit_bytes, readings.threshold),
        actual_copies=readings.fitted() if verified else None,
        projections=project(readings.baseline_bytes, footprint, readings.threshold, instances), leak_check=leak_check,
    )


def measure_capacity(artifact: Path, *, threshold: float, limit_bytes: int | None, probe_copies: int = 3,
                     verify: bool = True, cycles: int = 0, max_copies: int = 500,
                     instances: dict[str, dict] | None = None, reporter: Reporter | None = None,
                     cache_dir: Path | None = None, server_kind: str = "local", memory: str = "auto",
                     triton_network: str | None = None) -> CapacityReport:
    """``server_kind`` as ``mme serve --server`` takes it, ``triton_network`` as its ``--triton-network``
    (None: ``$MME_TRITON_NETWORK``, else private); ``memory``: what is counted, "gpu"
    (NVML, the whole device), "host" (RSS of the server's process tree) or "auto" (the GPU
    whenever one is visible and the artifact is not a CPU one)."""
    import os
    import tempfile

    from packager.manifest import MANIFEST_NAME, Manifest
    from serving.memory import choose_meter
    from serving.triton.config import TritonServerConfig, default_network
    from serving.triton.factory import choose_cache_root, choose_kind, create_server, server_class
    from serving.triton.sagemaker_serve import sagemaker_settings_from_environ

    reporter = reporter or Reporter(quiet=True)
    if not (artifact / MANIFEST_NAME).is_file():
        raise UsageError(f"{artifact} has no manifest.json; point at artifacts/<model>/<format> made by 'mme package'")
    manifest = Manifest.load(artifact)
    tarball = manifest.tarball
    kind = choose_kind(server_kind)
    root = choose_cache_root(cache_dir, server_class(kind).required_model_root())
    with tempfile.TemporaryDirectory(prefix="mme-capacity-") as tmp:
        cache = ModelCache(root or Path(tmp), CopiesSource(LocalDirSource(artifact), max_copies + cycles + 1))
        # Triton as SageMaker's image runs it (python shared memory, namespacing; SAGEMAKER_TRITON_*
        # of this environment honoured): what a copy costs there is what is counted here.
        config = TritonServerConfig(sagemaker_port=0, http_port=None, grpc_port=None, metrics_port=None,
                                    sagemaker_env=sagemaker_settings_from_environ(os.environ),
                                    network=triton_network or default_network())
        server = create_server(kind, config, model_root=cache.root)
        meter = choose_meter(memory, server.pids, instance_kind=manifest.triton.instance_kind)
        limit = limit_bytes or meter.total()
        server.start()
        try:
            control = ContainerClient(server.sagemaker_url)

            def used() -> int:
                time.sleep(0.2)  # let the stub settle
                return meter.used()

            def load(target: str) -> float:
                cached = cache.fetch(target)
                started = time.perf_counter()
                control.load(cached.container_name, server.model_url(cached.model_dir), target=target)
                return time.perf_counter() - started

            baseline = used()
            reporter.info(f"==> capacity of {manifest.model} ({manifest.format}): baseline {baseline / 2**20:.0f} MiB, "
                          f"limit {limit / 2**20:.0f} MiB, threshold {threshold:.0%}; counting {meter.description}")
            readings = Readings(manifest.model, manifest.format, meter.description, limit, threshold, baseline)

            def load_next() -> CapacityStep:
                seconds = load(copy_name(tarball, len(readings.steps) + 1))
                step = readings.record(used(), seconds)
                reporter.info(f"  copy {step.copies:>3}: {step.memory_bytes / 2**20:8.0f} MiB (+{step.delta_bytes / 2**20:.0f} MiB, "
                              f"loaded in {seconds:.2f} s, {step.memory_bytes / limit:.1%} of the limit)")
                return step

            for _ in range(probe_copies):
                load_next()
            probes = tuple(readings.steps)
            footprint = Footprint.of(probes)
            predicted = predict(baseline, footprint.mean_bytes, limit, threshold)
            reporter.info(f"  {footprint.line()}: predicted {predicted} copies under {threshold:.0%}")
            if verify:
                if predicted > max_copies:
                    raise UsageError(f"{predicted} copies predicted: more than --max-copies {max_copies}; "
                                     "pass a smaller --memory-limit or --no-verify")
                while readings.memory_bytes <= readings.budget_bytes and len(readings.steps) < max_copies:
                    load_next()
                reporter.info(f"  actual: {readings.fitted()} copies fit (predicted {predicted})")
            leak = (_leak_check(control, cache, server, tarball, len(readings.steps), cycles, used, reporter)
                    if cycles else None)
        finally:
            server.stop()
    return build_report(readings, probes, verified=verify, leak_check=leak, instances=instances)


def _leak_check(control, cache, server, tarball, loaded, cycles, used, reporter) -> dict:
    target = copy_name(tarball, loaded + 1)
    cached = cache.fetch(target)
    start = used()
    readings = []
    for _ in range(cycles):
        control.load(cached.container_name, server.model_url(cached.model_dir), target=target)
        control.unload(cached.container_name, target=target)
        time.sleep(0.5)  # the stub process exits after the unload returns
        readings.append(used())
    growth = readings[-1] - start
    returned = growth <= max(16 * 2**20, 0.05 * start)
    reporter.info(f"  leak check: {cycles} load/unload cycles, memory {start / 2**20:.0f} -> {readings[-1] / 2**20:.0f} MiB "
                  f"({'returns to where it started' if returned else 'does NOT return to where it started'})")
    return {"cycles": cycles, "start_bytes": start, "after_each_bytes": readings, "growth_bytes": growth,
            "returned_to_baseline": returned}


def write_report(report: CapacityReport, out: Path) -> Path:
    path = out / f"capacity_{report.model}_{report.format}.json"
    write_json_atomic(path, report.to_dict())
    return path


def format_table(report: CapacityReport) -> str:
    mib = 2**20
    lines = [
        f"model {report.model} ({report.format}); memory measured as {report.memory_kind}",
        f"baseline {report.baseline_bytes / mib:.0f} MiB; per copy mean {report.footprint_mean_bytes / mib:.0f} MiB "
        f"(min {report.footprint_min_bytes / mib:.0f}, max {report.footprint_max_bytes / mib:.0f})",
        f"this host: limit {report.limit_bytes / mib:.0f} MiB at {report.threshold:.0%}: predicted {report.predicted_copies}"
        + (f", actual {report.actual_copies}" if report.actual_copies is not None else ""),
        f"{'instance':<18}{'GPU':<6}{'memory':>10}{'copies':>8}",
    ]
    lines += [f"{p.instance_type:<18}{p.gpu:<6}{p.memory_bytes / 2**30:>7.0f} GiB{p.copies:>8}" for p in report.projections]
    if report.memory_kind.startswith("host"):
        lines.append("(projection applies this host-memory footprint to GPU memory: measure the GPU format on a GPU "
                     "host for the real figure)")
    return "\n".join(lines)
