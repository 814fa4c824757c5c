"""Check an export against the PyTorch model on the same inputs.

As optimum's exporter does: output names first, then shapes, then values within
``atol``; one line per output with its max absolute difference; a typed error on the
first mismatch. Cases cover a batch above one at the full axis lengths and batch one at
shorter lengths, so the dynamic axes are exercised too.
"""

from __future__ import annotations

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

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "max_abs_diff": self.max_abs_diff}


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

    @property
    def max_abs_diff(self) -> float:
        return max((o.max_abs_diff for c in self.cases for o in c.outputs), default=0.0)

    def to_dict(self) -> dict:
        return {
            "passed": True,
            "atol": self.atol,
            "max_abs_diff": self.max_abs_diff,
            "cases": [c.to_dict() for c in self.cases],
        }


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
) -> ValidationReport:
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
            diff = float(np.max(np.abs(have.astype(np.float64) - want.astype(np.float64)))) if want.size else 0.0
            if not np.isfinite(diff) or diff > atol:
                raise OutputValuesMismatchError(
                    f"[{exported.format}] output {name} differs from PyTorch by up to {diff:.3g} > atol {atol:g} "
                    f"(batch {ref.batch}, axes {dict(ref.axes)}); pass a larger --atol only if this is expected"
                )
            reporter.info(
                f"    [{exported.format}] {name} {tuple(have.shape)}: max |diff| {diff:.2e} <= atol {atol:g}  ok"
            )
            checks.append(OutputCheck(name, tuple(have.shape), diff))
        cases.append(ValidationCase(ref.batch, ref.axes, tuple(checks)))
    return ValidationReport(exported.format, atol, tuple(cases))
