"""The capacity report shared by ``mme capacity``'s local loop (:mod:`sizing.capacity`) and its
remote one (:mod:`sizing.capacity_remote`): readings (:class:`Readings`: baseline, then memory
after each copy) -> what copies cost (:class:`CopyCost`: the first copy apart, the per-copy
footprint from the copies after it) -> the prediction, the copies that fit and the projections
onto instance types with each GPU's usable memory (:func:`build_capacity_report`) -> the JSON and the
text table (:func:`write_capacity_report`, :func:`format_table`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from mme.fsutil import write_json_atomic
from mme.instances import USABLE, gpu_memory, load_instances

SCHEMA_VERSION = 1
LOADED = "loaded"  # after a warm-up at the max batch size: what a copy holds while serving
AT_REST = "at rest"  # right after its load, before any request: what the articles count
AFTER_LOAD = "after its load, no warm-up at the max batch size"  # the remote loop: loaded by one request


@dataclass(frozen=True)
class CapacityStep:
    copies: int
    memory_bytes: int  # after this copy's load and, in the local loop, its warm-up at the max batch size
    delta_bytes: int  # what this copy added, loaded (memory_bytes - the previous step's)
    load_seconds: float
    rest_bytes: int | None = None  # right after the load, before any request (None: not read apart)
    rest_delta_bytes: int | None = None  # what the load alone added: the copy at rest


@dataclass(frozen=True)
class Projection:
    instance_type: str
    gpu: str
    memory_bytes: int  # the GPU memory projected onto: usable (what the driver reports) unless memory_basis says nominal
    copies: int
    memory_basis: str = USABLE  # "usable" (gpu_memory_usable_mib) | "nominal" (gpu_memory_gib: the row has no usable figure)
    nominal_gib: float | None = None  # the GPU's nominal size, for display


@dataclass(frozen=True)
class CapacityReport:
    model: str
    format: str
    memory_kind: str  # "host RSS of the Triton process tree" or "GPU memory (NVML)"
    limit_bytes: int
    threshold: float
    baseline_bytes: int
    steps: tuple[CapacityStep, ...]
    # per copy after the first, as counted for the prediction (see ``counted``; ``per_copy_basis``
    # names the copies; with one copy measured, the first stands in)
    footprint_mean_bytes: int
    footprint_min_bytes: int
    footprint_max_bytes: int
    predicted_copies: int  # the largest n: baseline + overhead + first copy + (n - 1) x per copy <= threshold x limit
    actual_copies: int | None
    projections: tuple[Projection, ...]
    leak_check: dict | None
    schema_version: int = SCHEMA_VERSION
    counted: str = LOADED  # what a copy was counted at: LOADED (after a warm-up at max batch), AT_REST or AFTER_LOAD
    warmup_batch: int | None = None  # the largest batch of the warm-up requests (None: none sent)
    warmup_concurrency: int | None = None  # callers at once in the warm-up burst
    footprint_loaded_mean_bytes: int | None = None  # per copy (after the first) after the warm-up (None: not measured)
    footprint_rest_mean_bytes: int | None = None  # per copy (after the first) right after its load
    predicted_copies_loaded: int | None = None
    predicted_copies_rest: int | None = None
    limit_for_one_bytes: int | None = None  # the smallest limit one copy fits under at the threshold
    overhead_bytes: int = 0  # requests in flight from overhead_concurrency callers: the endpoint's, counted once
    overhead_concurrency: int | None = None
    overhead_body: str | None = None  # "json" | "binary": the request body they sent
    unload_seconds: float | None = None  # the first copy's unload until its memory is free (measure_unload)
    served_rps: float | None = None  # requests/s the first copy served to warmup_concurrency callers at once
    served_latency_ms: float | None = None  # one batch-1 request alone on the first copy
    in_flight_rounds: int | None = None  # requests each of overhead_concurrency callers sent, one after another;
    # every copy after the first was read after them too: its share of the requests in flight is in its figure
    # What the first copy added, counted as ``counted`` says: its own footprint plus the one-time
    # start-up of the first model on the device; counted once (None: copy 1 was not measured in
    # this run, e.g. loaded by an earlier one, so the start-up is in the baseline).
    first_copy_bytes: int | None = None
    first_copy_loaded_bytes: int | None = None  # the same, after the warm-up (None: not read apart)
    first_copy_rest_bytes: int | None = None  # the same, right after its load
    per_copy_basis: str = ""  # which copies the per-copy figures come from, in words
    definitions: dict[str, str] = field(default_factory=dict)  # what each figure counts (report_definitions)

    def to_dict(self) -> dict:
        return asdict(self)


def predict(baseline: int, footprint: float, limit: int, threshold: float) -> int:
    """The largest n with ``baseline + n x footprint <= threshold x limit`` (0 for a footprint
    that is not one). For copies whose first carries a start-up cost, see :func:`predict_copies`."""
    if footprint <= 0:
        return 0
    return max(0, math.floor((threshold * limit - baseline) / footprint))


def predict_copies(baseline: float, first: float, per_copy: float, limit: int, threshold: float) -> int:
    """The largest n with ``baseline + first + (n - 1) x per_copy <= threshold x limit``: the
    first copy counted once with what it alone costs, the others at ``per_copy`` (0 when even
    the first does not fit, or per_copy is not a footprint)."""
    return predict(int(baseline + first - per_copy), per_copy, limit, threshold)


def report_definitions() -> dict[str, str]:
    """What each figure of the report counts, written into its JSON (``definitions``)."""
    return {
        "baseline_bytes": "memory of the empty server before any copy",
        "overhead_bytes": "what requests in flight from overhead_concurrency callers added on the first copy: the "
                          "endpoint's (and that copy's share), counted once; each further copy was read after serving "
                          "them too (in_flight_rounds each), so its share is in its own figure",
        "first_copy_bytes": "what the first copy added (counted as 'counted' says): its own footprint plus the one-time "
                            "start-up of the first model on the device (CUDA context, cuDNN/cuBLAS handles, ONNX Runtime "
                            "arena); counted once. None: copy 1 was not measured in this run (the start-up is in the "
                            "baseline)",
        "footprint_mean_bytes": "per copy: the mean of what each copy after the first added (per_copy_basis names the "
                                "copies; with one copy measured the first stands in, an overestimate); min and max likewise",
        "predicted_copies": "the largest n with baseline + overhead + first copy + (n - 1) x per copy <= threshold x "
                            "limit_bytes",
        "actual_copies": "copies loaded with memory still under threshold x limit_bytes",
        "projections.memory_bytes": "the instance GPU's usable memory: the total its driver reports (nvidia-smi, NVML; "
                                    "mme/instances.toml gpu_memory_usable_mib), or its nominal size where "
                                    "memory_basis is 'nominal'",
        "projections.copies": "predicted_copies' formula with that memory as the limit",
    }


@dataclass(frozen=True)
class Footprint:
    """What one copy adds to memory: the mean, min and max of the steps' deltas."""

    mean_bytes: float
    min_bytes: int
    max_bytes: int

    @classmethod
    def of(cls, steps: Sequence[CapacityStep], at_rest: bool = False) -> "Footprint":
        """Over the loaded deltas, or the at-rest ones (``at_rest``; steps that have them)."""
        deltas = ([s.rest_delta_bytes for s in steps if s.rest_delta_bytes is not None] if at_rest
                  else [s.delta_bytes for s in steps])
        if not deltas:
            raise ValueError("a footprint needs at least one step")
        return cls(statistics.fmean(deltas), min(deltas), max(deltas))

    def line(self) -> str:
        return f"per copy {self.mean_bytes / 2**20:.0f} MiB (min {self.min_bytes / 2**20:.0f}, max {self.max_bytes / 2**20:.0f})"


@dataclass(frozen=True)
class CopyCost:
    """What copies add: the first once (``first_bytes``, with the one-time start-up), each
    further one ``per_copy`` (over the copies after the first; the first itself when it is the
    only one measured). ``first_measured`` is False when copy 1 is not among the steps (it was
    loaded before the readings began): every step is then a further copy and the first costs
    what they cost."""

    first_bytes: float
    per_copy: Footprint
    first_measured: bool
    basis: str  # which copies per_copy comes from, in words

    @classmethod
    def of(cls, steps: Sequence[CapacityStep], at_rest: bool = False) -> "CopyCost":
        """Over the loaded deltas, or the at-rest ones (``at_rest``; steps that have them)."""
        usable = [s for s in steps if not at_rest or s.rest_delta_bytes is not None]
        if not usable:
            raise ValueError("a footprint needs at least one step")
        first = next((s for s in usable if s.copies == 1), None)
        further = [s for s in usable if s.copies > 1]
        if further:
            per_copy = Footprint.of(further, at_rest=at_rest)
            numbers = [s.copies for s in further]
            span = (f"copy {numbers[0]}" if len(numbers) == 1 else
                    f"copies {numbers[0]}-{numbers[-1]}" if numbers == list(range(numbers[0], numbers[-1] + 1))
                    else "copies " + ", ".join(map(str, numbers)))
            basis = (f"{span}, after the first" if first is not None else
                     f"{span}; copy 1 was loaded before this run, so the one-time start-up is in the baseline")
        else:
            per_copy = Footprint.of(usable, at_rest=at_rest)
            basis = ("the first copy, the only one measured: it carries the one-time start-up, so the per-copy figure "
                     "overstates further copies (measure 2 or more)")
        if first is None:
            return cls(per_copy.mean_bytes, per_copy, False, basis)
        delta = first.rest_delta_bytes if at_rest else first.delta_bytes
        return cls(float(delta if delta is not None else first.delta_bytes), per_copy, True, basis)

    def predict(self, baseline: float, limit: int, threshold: float) -> int:
        return predict_copies(baseline, self.first_bytes, self.per_copy.mean_bytes, limit, threshold)

    def line(self) -> str:
        first = f"first copy {self.first_bytes / 2**20:.0f} MiB, then " if self.first_measured else ""
        return f"{first}{self.per_copy.line()} [{self.basis}]"


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
    overhead_bytes: int = 0  # what requests in flight added, once for the endpoint (note_overhead)
    _after_overhead: int | None = None  # the reading that measured it, until the next copy
    _overhead_copies: int = 0  # copies loaded when it was measured: their readings lack it

    @property
    def budget_bytes(self) -> float:
        return self.threshold * self.limit_bytes

    @property
    def memory_bytes(self) -> int:
        """The latest reading (the baseline before any copy)."""
        if self._after_overhead is not None:
            return self._after_overhead
        return self.steps[-1].memory_bytes if self.steps else self.baseline_bytes

    def note_overhead(self, memory_bytes: int) -> int:
        """Requests from many callers at once ran on the copies loaded so far and memory reads
        ``memory_bytes``: what they added is the endpoint's, counted once, not a copy's."""
        self.overhead_bytes = max(0, memory_bytes - self.memory_bytes)
        self._after_overhead = memory_bytes
        self._overhead_copies = len(self.steps)
        return self.overhead_bytes

    def record(self, memory_bytes: int, load_seconds: float, rest_bytes: int | None = None) -> CapacityStep:
        """The next copy is loaded and memory reads ``memory_bytes`` (``rest_bytes`` right
        after the load, before its warm-up, where that was read)."""
        before = self.memory_bytes
        self._after_overhead = None
        step = CapacityStep(len(self.steps) + 1, memory_bytes, memory_bytes - before, round(load_seconds, 3),
                            rest_bytes, None if rest_bytes is None else rest_bytes - before)
        self.steps.append(step)
        return step

    def fitted(self) -> int:
        """How many copies were loaded with memory still under the threshold, counting the
        endpoint's requests in flight with copies read before they were measured."""
        return len([s for s in self.steps
                    if s.memory_bytes + (self.overhead_bytes if s.copies <= self._overhead_copies else 0)
                    <= self.budget_bytes])


def project(baseline: int, cost: CopyCost, threshold: float,
            instances: dict[str, dict] | None = None) -> tuple[Projection, ...]:
    """The copies that would fit under ``threshold`` of each instance type's usable GPU memory
    (its nominal size where the row lacks a usable figure): the first copy once, then per copy."""
    rows = load_instances() if instances is None else instances  # {}: no projections
    projections = []
    for name, row in rows.items():
        memory, basis = gpu_memory(row)
        nominal = row.get("gpu_memory_gib")
        projections.append(Projection(name, row.get("gpu", ""), memory, cost.predict(baseline, memory, threshold),
                                      basis, float(nominal) if nominal is not None else None))
    return tuple(projections)


def limit_for_one(baseline: int, first_copy: float, threshold: float) -> int:
    """The smallest memory limit under whose threshold the baseline and the first copy fit."""
    return math.ceil((baseline + first_copy) / threshold)


def build_capacity_report(readings: Readings, footprint_steps: Sequence[CapacityStep] | None = None, *, verified: bool = True,
                 leak_check: dict | None = None, instances: dict[str, dict] | None = None, at_rest: bool = False,
                 warmup_batch: int | None = None, warmup_concurrency: int | None = None,
                 overhead_concurrency: int | None = None, overhead_body: str | None = None) -> CapacityReport:
    """Readings -> what copies cost (:class:`CopyCost` over ``footprint_steps``, default all
    steps: the first copy apart, per copy over the ones after it; loaded, or ``at_rest``) ->
    prediction -> copies that fit (when the loop went on to the threshold: ``verified``) ->
    projections onto instance types -> the report both loops write. Where the steps were read
    at rest and after a warm-up (``warmup_batch``), both figures are kept."""
    steps = readings.steps if footprint_steps is None else footprint_steps
    has_rest = warmup_batch is not None and all(s.rest_delta_bytes is not None for s in steps)
    at_rest = at_rest and has_rest
    cost = CopyCost.of(steps, at_rest=at_rest)
    loaded = CopyCost.of(steps) if has_rest else None
    rest = CopyCost.of(steps, at_rest=True) if has_rest else None

    base = readings.baseline_bytes + readings.overhead_bytes  # the endpoint's own, before any copy

    def predicted(c: CopyCost | None) -> int | None:
        return None if c is None else c.predict(base, readings.limit_bytes, readings.threshold)

    def first(c: CopyCost | None) -> int | None:
        return int(c.first_bytes) if c is not None and c.first_measured else None

    footprint = cost.per_copy
    return CapacityReport(
        model=readings.model, format=readings.format, memory_kind=readings.memory_kind, limit_bytes=readings.limit_bytes,
        threshold=readings.threshold, baseline_bytes=readings.baseline_bytes, steps=tuple(readings.steps),
        footprint_mean_bytes=int(footprint.mean_bytes), footprint_min_bytes=footprint.min_bytes,
        footprint_max_bytes=footprint.max_bytes,
        predicted_copies=cost.predict(base, readings.limit_bytes, readings.threshold),
        actual_copies=readings.fitted() if verified else None,
        projections=project(base, cost, readings.threshold, instances), leak_check=leak_check,
        counted=AT_REST if at_rest else LOADED if warmup_batch is not None else AFTER_LOAD, warmup_batch=warmup_batch,
        warmup_concurrency=warmup_concurrency,
        footprint_loaded_mean_bytes=int(loaded.per_copy.mean_bytes) if loaded else None,
        footprint_rest_mean_bytes=int(rest.per_copy.mean_bytes) if rest else None,
        predicted_copies_loaded=predicted(loaded), predicted_copies_rest=predicted(rest),
        limit_for_one_bytes=limit_for_one(base, cost.first_bytes, readings.threshold),
        overhead_bytes=readings.overhead_bytes, overhead_concurrency=overhead_concurrency,
        overhead_body=overhead_body, first_copy_bytes=first(cost), first_copy_loaded_bytes=first(loaded),
        first_copy_rest_bytes=first(rest), per_copy_basis=cost.basis, definitions=report_definitions(),
    )


def write_capacity_report(report: CapacityReport, out: Path) -> Path:
    path = out / f"capacity_{report.model}_{report.format}.json"
    write_json_atomic(path, report.to_dict())
    return path


def size_text(n: int) -> str:
    """A byte count as mme's --memory-limit takes it: 2.5G, 700M."""
    return f"{n / 2**30:.1f}G" if n >= 2**30 else f"{math.ceil(n / 2**20)}M"


def format_table(report: CapacityReport) -> str:
    mib = 2**20
    both = ""
    if report.footprint_rest_mean_bytes is not None and report.footprint_loaded_mean_bytes is not None:
        both = (f"; at rest {report.footprint_rest_mean_bytes / mib:.0f} MiB (predicts {report.predicted_copies_rest}), "
                f"loaded after requests up to batch {report.warmup_batch} and {report.warmup_concurrency} callers at once "
                f"{report.footprint_loaded_mean_bytes / mib:.0f} MiB "
                f"(predicts {report.predicted_copies_loaded})")
    first = ("first copy: not measured in this run (copy 1 was loaded before: its one-time start-up is in the baseline)"
             if report.first_copy_bytes is None else
             f"first copy {report.first_copy_bytes / mib:.0f} MiB (its own footprint plus the one-time start-up of the "
             "first model on the device: CUDA context, cuDNN/cuBLAS, ONNX Runtime arena; counted once)")
    lines = [
        f"model {report.model} ({report.format}); memory measured as {report.memory_kind}",
        f"baseline {report.baseline_bytes / mib:.0f} MiB; {first}",
        f"per copy after the first: mean {report.footprint_mean_bytes / mib:.0f} MiB "
        f"(min {report.footprint_min_bytes / mib:.0f}, max {report.footprint_max_bytes / mib:.0f}) from "
        f"{report.per_copy_basis or 'every copy'}; counted {report.counted}{both}",
        *([f"requests in flight from {report.overhead_concurrency} callers ({report.overhead_body} bodies): "
           f"{report.overhead_bytes / mib:.0f} MiB, the endpoint's, counted once"
           + ("; every further copy counted after serving them too" if report.in_flight_rounds else "")]
          if report.overhead_concurrency else []),
        *([f"the first copy served {report.served_rps:.1f} requests/s to {report.warmup_concurrency} callers at once, "
           f"{report.served_latency_ms:.0f} ms for one request alone"]
          if report.served_rps is not None and report.served_latency_ms is not None else []),
        f"this host: limit {report.limit_bytes / mib:.0f} MiB at {report.threshold:.0%}: predicted {report.predicted_copies}"
        + (f", actual {report.actual_copies}" if report.actual_copies is not None else "")
        + (f" (one copy fits under a limit of {size_text(report.limit_for_one_bytes)} or more)"
           if report.predicted_copies == 0 and report.limit_for_one_bytes else ""),
        "copies that fit = the largest n with baseline + requests in flight + first copy + (n - 1) x per copy "
        "<= threshold x memory; instance memory is the usable total its driver reports (nvidia-smi), not the nominal size",
        f"{'instance':<18}{'GPU':<6}{'nominal':>9}{'usable':>12}{'copies':>8}",
    ]
    for p in report.projections:
        nominal = f"{p.nominal_gib:>5.0f} GiB" if p.nominal_gib is not None else f"{'':>9}"
        usable = (f"{p.memory_bytes / mib:>8.0f} MiB" if p.memory_basis == USABLE else f"{'(nominal)':>12}")
        lines.append(f"{p.instance_type:<18}{p.gpu:<6}{nominal}{usable}{p.copies:>8}")
    if any(p.memory_basis != USABLE for p in report.projections):
        lines.append("(nominal: that row of the instance table has no gpu_memory_usable_mib, so its copies are counted "
                     "against the nominal size, which overstates them)")
    if report.memory_kind.startswith("host"):
        lines.append("(projection applies this host-memory footprint to GPU memory: measure the GPU format on a GPU "
                     "host for the real figure)")
    return "\n".join(lines)
