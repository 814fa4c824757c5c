"""Validation catches wrong exports: names, then shapes, then values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mme.errors import OutputNamesMismatchError, OutputShapeMismatchError, OutputValuesMismatchError
from mme.progress import Reporter
from packager.formats import FORMATS, ExportContext, ExportOptions
from packager.model import ModelRequest
from packager.sources import timm_source
from packager.validate import reference_cases, validate


@pytest.fixture(scope="module")
def exported_pair(tmp_path_factory):
    """A real ONNX export of test_resnet (seed 0) and the same architecture with other weights."""
    reporter = Reporter(quiet=True)
    model = timm_source.load(ModelRequest("test_resnet", weights="random", seed=0), reporter)
    other = timm_source.load(ModelRequest("test_resnet", weights="random", seed=1), reporter)
    ctx = ExportContext(model, ExportOptions(), tmp_path_factory.mktemp("work"), reporter, max_batch_size=4)
    fmt = FORMATS["onnx"]
    exported = fmt.export(ctx)
    return model, other, fmt, exported, ctx


def test_good_export_passes_with_small_diffs(exported_pair):
    model, _, fmt, exported, ctx = exported_pair
    report = validate(model, exported, fmt.runner(exported, ctx), reference_cases(model, 4), 1e-4, Reporter(quiet=True))
    assert report.max_abs_diff < 1e-4
    assert [c.batch for c in report.cases] == [2, 1]


def test_export_of_other_weights_is_caught(exported_pair):
    model, other, fmt, exported, ctx = exported_pair
    with pytest.raises(OutputValuesMismatchError, match=r"\[onnx\] output logits differs from PyTorch by up to"):
        validate(other, exported, fmt.runner(exported, ctx), reference_cases(other, 4), 1e-4, Reporter(quiet=True))


def test_wrong_names_and_shapes_are_caught(exported_pair):
    model, _, fmt, exported, ctx = exported_pair
    run = fmt.runner(exported, ctx)
    refs = reference_cases(model, 4)

    def renamed(inputs):
        return {f"{k}_x": v for k, v in run(inputs).items()}

    def truncated(inputs):
        return {k: v[:, :-1] for k, v in run(inputs).items()}

    def nan(inputs):
        return {k: np.full_like(v, np.nan) for k, v in run(inputs).items()}

    with pytest.raises(OutputNamesMismatchError):
        validate(model, exported, renamed, refs, 1e-4, Reporter(quiet=True))
    with pytest.raises(OutputShapeMismatchError):
        validate(model, exported, truncated, refs, 1e-4, Reporter(quiet=True))
    with pytest.raises(OutputValuesMismatchError):
        validate(model, exported, nan, refs, 1e-4, Reporter(quiet=True))


def test_validation_cases_exercise_dynamic_axes():
    from packager.spec import IOSpec, TensorSpec

    spec = IOSpec("t", (TensorSpec("input_ids", "int64", ("sequence",)),), (), (("sequence", 128),))
    assert spec.validation_cases(16) == ((2, {"sequence": 128}), (1, {"sequence": 33}))
    assert spec.validation_cases(1)[0][0] == 1


def test_reference_outputs_come_from_pytorch(exported_pair):
    model, *_ = exported_pair
    (first, _) = reference_cases(model, 4)
    with torch.no_grad():
        want = model.module(torch.from_numpy(first.inputs["pixel_values"])).numpy()
    np.testing.assert_array_equal(first.outputs["logits"], want)
