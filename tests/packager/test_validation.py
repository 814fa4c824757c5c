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
    for rtol in (0.0, model.spec.default_rtol):  # absolute only, and the relative default: both catch it
        with pytest.raises(OutputValuesMismatchError, match=r"\[onnx\] output logits differs from PyTorch beyond atol "
                           r"0.0001 \+ rtol [0-9.e-]+ x \|PyTorch\|: max \|diff\| .*not rounding.*--atol "):
            validate(other, exported, fmt.runner(exported, ctx), reference_cases(other, 4), 1e-4, Reporter(quiet=True),
                     rtol=rtol)


def test_rtol_is_numpy_allclose_and_the_report_records_it(exported_pair):
    """Large outputs off by a relative 5e-4, as pretrained logits on another device: atol alone
    fails them, atol + rtol 1e-3 passes them; the error says how far to widen, and that is enough."""
    import dataclasses
    import re

    model, _, fmt, exported, ctx = exported_pair
    run = fmt.runner(exported, ctx)
    scale = 20.0  # logits of order 10, as pretrained weights give
    refs = tuple(dataclasses.replace(r, outputs={k: v * scale for k, v in r.outputs.items()})
                 for r in reference_cases(model, 4))

    def relative_error(inputs):
        return {k: v * scale * (1 + 5e-4) for k, v in run(inputs).items()}

    assert max(float(np.max(np.abs(r.outputs["logits"]))) for r in refs) > 1.0  # 5e-4 of it is above atol
    with pytest.raises(OutputValuesMismatchError, match=r"widen the tolerance: --rtol ") as caught:
        validate(model, exported, relative_error, refs, 1e-4, Reporter(quiet=True))
    suggested = float(re.search(r"--rtol ([0-9.e-]+)", str(caught.value)).group(1))
    assert 5e-4 <= suggested <= 1e-3
    report = validate(model, exported, relative_error, refs, 1e-4, Reporter(quiet=True), rtol=suggested)
    assert report.max_abs_diff > 1e-4  # passed on the relative part, not the absolute one
    for case, ref in zip(report.cases, refs):
        (check,) = case.outputs
        have = relative_error(ref.inputs)["logits"].astype(np.float64)
        want = ref.outputs["logits"].astype(np.float64)
        assert np.allclose(have, want, atol=1e-4, rtol=suggested)
        assert check.max_excess == pytest.approx(max(0.0, float(np.max(np.abs(have - want) - suggested * np.abs(want)))),
                                                 abs=1e-12)
        assert check.max_excess <= 1e-4
    data = report.to_dict()
    assert (data["atol"], data["rtol"], data["device"]) == (1e-4, suggested, "cpu")
    assert set(data["cases"][0]["outputs"][0]) == {"name", "shape", "max_abs_diff", "max_excess"}


def test_compare_agrees_with_numpy_allclose():
    from packager.validate import compare, round_up

    rng = np.random.default_rng(0)
    for _ in range(200):
        want = (rng.standard_normal(64) * 10 ** rng.uniform(-3, 2)).astype(np.float32)
        have = want + (rng.standard_normal(64) * 10 ** rng.uniform(-7, -1)).astype(np.float32)
        atol, rtol = 10 ** rng.uniform(-6, -2), float(rng.choice([0.0, 1e-4, 1e-3, 1e-2]))
        found = compare(have, want, atol, rtol)
        assert found.passes(atol) == bool(np.allclose(have.astype(np.float64), want.astype(np.float64),
                                                      atol=atol, rtol=rtol))
        if not found.passes(atol):
            assert compare(have, want, round_up(found.max_excess), rtol).passes(round_up(found.max_excess))
            if np.isfinite(found.rtol_needed):
                wider = round_up(found.rtol_needed)
                assert compare(have, want, atol, wider).passes(atol)
    zero = np.zeros(3, dtype=np.float32)
    assert compare(zero + 1e-3, zero, 1e-4, 1.0).rtol_needed == np.inf  # no rtol covers an error at zero
    assert not compare(np.array([np.nan]), np.array([1.0]), 1.0, 1.0).passes(1.0)
    assert (round_up(3.2e-3), round_up(1e-3), round_up(0.0123), round_up(9.99e-3)) == (4e-3, 1e-3, 0.02, 0.01)


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


# -- where validation runs: GPU-marked TorchScript and ONNX on the GPU when one is visible ----------

def test_torchscript_validates_a_gpu_artifact_on_the_gpu_when_cuda_is_available():
    from packager.formats.torchscript import torchscript_device

    assert torchscript_device("KIND_GPU", cuda_available=True) == "cuda"
    assert torchscript_device("KIND_GPU", cuda_available=False) == "cpu"
    assert torchscript_device("KIND_CPU", cuda_available=True) == "cpu"  # served on the CPU: checked there
    assert torchscript_device("KIND_GPU") == ("cuda" if torch.cuda.is_available() else "cpu")  # torch's own answer


def test_onnx_asks_for_the_cuda_provider_for_a_gpu_artifact_where_onnx_runtime_has_it():
    from packager.formats.onnx_format import onnx_providers

    with_cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    fp32_cuda = [("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]
    assert onnx_providers("KIND_GPU", with_cuda) == fp32_cuda
    assert onnx_providers("KIND_GPU", ["CPUExecutionProvider"]) == ["CPUExecutionProvider"]
    assert onnx_providers("KIND_CPU", with_cuda) == ["CPUExecutionProvider"]
    assert FORMATS["onnx"].validation_providers("KIND_GPU", with_cuda) == fp32_cuda
    # cpu-local's model.py runs ONNX Runtime's CPU provider inside Triton whatever the instance kind
    assert FORMATS["cpu-local"].validation_providers("KIND_GPU", with_cuda) == ["CPUExecutionProvider"]


def test_the_runners_say_where_they_ran_and_validation_records_it(exported_pair, tmp_path):
    """On this host (no CUDA, ONNX Runtime's CPU build) GPU-marked artifacts run on the CPU, and
    a CUDA provider that was asked for but did not start is reported as the CPU it fell back to."""
    import dataclasses

    from packager.formats.base import DeviceRunner
    from packager.formats.onnx_format import OnnxFormat

    model, _, fmt, exported, ctx = exported_pair
    gpu_ctx = dataclasses.replace(ctx, instance_kind="KIND_GPU")
    run = fmt.runner(exported, gpu_ctx)
    cuda_here = "CUDAExecutionProvider" in ort_providers()
    assert isinstance(run, DeviceRunner) and fmt.validation_device(run)[0] == ("cuda" if cuda_here else "cpu")

    class AlwaysAsksForCuda(OnnxFormat):
        def validation_providers(self, instance_kind, available=None):
            return [("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]

    if not cuda_here:
        with pytest.warns(UserWarning, match="CUDAExecutionProvider"):  # ONNX Runtime falls back, with a warning
            fallback = AlwaysAsksForCuda().runner(exported, gpu_ctx)
        device, detail = fmt.validation_device(fallback)
        assert device == "cpu" and "did not start" in detail
        report = validate(model, exported, fallback, reference_cases(model, 4), 1e-4, Reporter(quiet=True),
                          rtol=1e-3, device=device, device_detail=detail)
        assert report.to_dict()["device"] == "cpu" and "did not start" in report.to_dict()["device_detail"]

    torchscript = FORMATS["torchscript"]
    ts_ctx = dataclasses.replace(gpu_ctx, workdir=tmp_path)
    ts_run = torchscript.runner(torchscript.export(ts_ctx), ts_ctx)
    assert torchscript.validation_device(ts_run)[0] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert FORMATS["tensorrt"].validation_device(lambda inputs: {}) == ("cuda", "")  # GPU-only formats run there


def test_fp32_math_turns_tf32_off_and_restores_it():
    from packager.formats.torchscript import fp32_math

    flags = (torch.backends.cuda.matmul, torch.backends.cudnn.conv, torch.backends.cudnn.rnn)
    before = [f.fp32_precision for f in flags]
    with fp32_math():
        assert [f.fp32_precision for f in flags] == ["ieee"] * 3
    assert [f.fp32_precision for f in flags] == before


def ort_providers() -> list[str]:
    import onnxruntime

    return onnxruntime.get_available_providers()
