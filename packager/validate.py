"""Check an export against the PyTorch model on the same inputs.

As optimum's exporter does: output names first, then shapes, then values; one line per
output; a typed error on the first mismatch. Values pass where
``|export - PyTorch| <= atol + rtol x |PyTorch|`` elementwise (numpy.allclose's test): the
line shows the max absolute difference and the max excess over the relative part,
``max(|diff| - rtol x |PyTorch|)``, which passes when it is at most ``atol``. Cases cover a
batch above one at the full axis lengths and batch one at shorter lengths, so the dynamic
axes are exercised too. The report records where the export ran (``device``: GPU-marked
TorchScript and ONNX run on the GPU when one is visible, see packager.formats).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from mme.errors import OutputNamesMismatchError, OutputShapeMismatchError, OutputValuesMismatchError
from mme.progress import Reporter
from packager.formats.base import ExportedModel, Runner
from packager.model import LoadedModel


@dataclass(frozen=True)
class OutputCheck:
    name: str
    shape: tuple[int, ...]
    max_abs_diff: float
    max_excess: float = 0.0  # max(|diff| - rtol x |PyTorch|, 0): at most atol where the output passes

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "max_abs_diff": self.max_abs_diff,
                "max_excess": self.max_excess}


@dataclass(frozen=True)
class ValidationCase:
    batch: int
    axes: Mapping[str, int]
    outputs: tuple[OutputCheck, ...]

    def to_dict(self) -> dict:
        return {"batch": self.batch, "axes": dict(self.axes), "outputs": [o.to_dict() for o in self.outputs]}


@dataclass(frozen=True)
class ValidationReport:
    format: str
    atol: float
    cases: tuple[ValidationCase, ...]
    rtol: float = 0.0
    device: str = "cpu"  # where the export ran: "cpu" | "cuda"
    device_detail: str = ""  # the GPU, execution provider and arithmetic, where it ran on one

    @property
    def max_abs_diff(self) -> float:
        return max((o.max_abs_diff for c in self.cases for o in c.outputs), default=0.0)

    def to_dict(self) -> dict:
        data = {
            "passed": True,
            "atol": self.atol,
            "rtol": self.rtol,
            "max_abs_diff": self.max_abs_diff,
            "device": self.device,
        }
        if self.device_detail:
            data["device_detail"] = self.device_detail
        return data | {"cases": [c.to_dict() for c in self.cases]}


WRONG_EXPORT_RTOL = 0.1  # an output this far off relatively is not rounding: no --rtol is suggested for it


@dataclass(frozen=True)
class Comparison:
    """One output against PyTorch's, under ``|have - want| <= atol + rtol x |want|``."""

    max_abs_diff: float
    # max(|have - want| - rtol x |want|, 0): what the relative part leaves uncovered, the smallest
    # atol that passes with this rtol; nan when some value is not finite
    max_excess: float
    rtol_needed: float  # the smallest rtol that passes with this atol (inf: an element near zero is off by > atol)

    @property
    def finite(self) -> bool:
        return math.isfinite(self.max_excess)

    def passes(self, atol: float) -> bool:
        return self.finite and self.max_excess <= atol


def compare(have: np.ndarray, want: np.ndarray, atol: float, rtol: float) -> Comparison:
    """numpy.allclose's test, with the figures that say how far off an output is and how the
    tolerance would have to widen for it to pass."""
    if not want.size:
        return Comparison(0.0, 0.0, 0.0)
    have64, want64 = have.astype(np.float64), want.astype(np.float64)
    diff = np.abs(have64 - want64)
    scale = np.abs(want64)
    if not (np.all(np.isfinite(diff)) and np.all(np.isfinite(scale))):
        return Comparison(float(np.max(diff)), math.nan, math.inf)
    excess = diff - rtol * scale
    over = diff > atol
    if not np.any(over):
        rtol_needed = 0.0
    elif np.any(over & (scale == 0)):
        rtol_needed = math.inf
    else:
        rtol_needed = float(np.max((diff[over] - atol) / scale[over]))
    return Comparison(float(np.max(diff)), max(0.0, float(np.max(excess))), rtol_needed)


def round_up(value: float) -> float:
    """``value`` rounded up to one significant digit (3.2e-3 -> 4e-3), for a suggested tolerance."""
    if not math.isfinite(value) or value <= 0:
        return value
    exponent = math.floor(math.log10(value))
    digit = math.ceil(value / 10**exponent - 1e-9)
    return float(f"{digit}e{exponent}") if digit < 10 else float(f"1e{exponent + 1}")


@dataclass(frozen=True)
class ReferenceCase:
    """Inputs and PyTorch outputs for one case, computed once and reused by every format."""

    batch: int
    axes: Mapping[str, int]
    inputs: Mapping[str, np.ndarray]  # by spec input name
    outputs: Mapping[str, np.ndarray]  # by spec output name


def reference_cases(model: LoadedModel, max_batch: int) -> tuple[ReferenceCase, ...]:
    import torch

    cases = []
    for index, (batch, axes) in enumerate(model.spec.validation_cases(max_batch)):
        inputs = model.make_inputs(batch, axes, 100 + index)
        args = [torch.from_numpy(inputs[t.name]) for t in model.spec.inputs]
        with torch.no_grad():
            out = model.module(*args)
        out = out if isinstance(out, (tuple, list)) else (out,)
        outputs = {t.name: o.detach().float().numpy() for t, o in zip(model.spec.outputs, out)}
        cases.append(ReferenceCase(batch, dict(axes), inputs, outputs))
    return tuple(cases)


def validate(
    model: LoadedModel,
    exported: ExportedModel,
    run: Runner,
    references: tuple[ReferenceCase, ...],
    atol: float,
    reporter: Reporter,
    rtol: float = 0.0,
    device: str = "cpu",
    device_detail: str = "",
) -> ValidationReport:
    """``run`` (the export, on ``device``) against PyTorch's ``references``: names, shapes, then
    values within ``atol + rtol x |PyTorch|`` elementwise (rtol 0: absolute only)."""
    spec = model.spec
    in_names = {s.name: e.name for s, e in zip(spec.inputs, exported.inputs)}
    out_names = {e.name: s.name for s, e in zip(spec.outputs, exported.outputs)}
    cases = []
    for ref in references:
        got = run({in_names[name]: value for name, value in ref.inputs.items()})
        expected_names = set(exported.output_names)
        if set(got) != expected_names:
            raise OutputNamesMismatchError(
                f"[{exported.format}] output names {sorted(got)} differ from the expected {sorted(expected_names)}"
            )
        checks = []
        for name in exported.output_names:
            want = ref.outputs[out_names[name]]
            have = np.asarray(got[name])
            if have.shape != want.shape:
                raise OutputShapeMismatchError(
                    f"[{exported.format}] output {name} has shape {have.shape}, PyTorch gives {want.shape} "
                    f"(batch {ref.batch}, axes {dict(ref.axes)})"
                )
            found = compare(have, want, atol, rtol)
            where = f"batch {ref.batch}, axes {dict(ref.axes)}, on {device}"
            if not found.finite:
                whose = ("PyTorch's own output has nan or inf on this input, so it cannot be compared"
                         if not np.all(np.isfinite(want.astype(np.float64))) else
                         "the export gives nan or inf where PyTorch's values are finite; no tolerance covers that")
                raise OutputValuesMismatchError(f"[{exported.format}] output {name}: {whose} ({where})")
            if not found.passes(atol):
                widen = f"--atol {round_up(found.max_excess):g}"
                if found.rtol_needed < WRONG_EXPORT_RTOL:
                    widen = f"--rtol {round_up(found.rtol_needed):g} or {widen}"
                    why = "only if this is expected (e.g. another device's arithmetic), widen the tolerance"
                else:
                    why = (f"some elements are off by {WRONG_EXPORT_RTOL:.0%} of PyTorch's value or more, which is not "
                           "rounding: the export computes something else; widen the tolerance only if you know why")
                raise OutputValuesMismatchError(
                    f"[{exported.format}] output {name} differs from PyTorch beyond atol {atol:g} + rtol {rtol:g} x "
                    f"|PyTorch|: max |diff| {found.max_abs_diff:.3g}, max |diff| - rtol x |PyTorch| "
                    f"{found.max_excess:.3g} > atol ({where}); {why}: {widen}"
                )
            reporter.info(
                f"    [{exported.format}] {name} {tuple(have.shape)}: max |diff| {found.max_abs_diff:.2e}, "
                f"max |diff| - rtol x |want| {found.max_excess:.2e} <= atol {atol:g} (rtol {rtol:g}, {device})  ok"
            )
            checks.append(OutputCheck(name, tuple(have.shape), found.max_abs_diff, found.max_excess))
        cases.append(ValidationCase(ref.batch, ref.axes, tuple(checks)))
    return ValidationReport(exported.format, atol, tuple(cases), rtol, device, device_detail)
