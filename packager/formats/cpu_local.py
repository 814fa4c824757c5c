"""The CPU-local format: a Triton python-backend model running the ONNX export with ONNX
Runtime. It is what the GPU-less Triton server (the one inside the nvidia-pytriton wheel,
python backend only) can serve, with the same inputs and outputs as the ``onnx`` format."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from mme.versions import Release
from packager.formats.base import ExportContext, ExportedModel, Runner
from packager.formats.onnx_format import exported_onnx, onnx_session, onnx_versions, run_onnx

MODEL_PY = "onnxruntime_model.py"


def model_py_source() -> Path:
    return Path(str(resources.files("packager.backends").joinpath(MODEL_PY)))


class CpuLocalFormat:
    name = "cpu-local"
    description = "Triton python backend running the ONNX file with ONNX Runtime (serves without a GPU)"
    requires_gpu = False
    platform = None
    backend = "python"
    instance_kind = "KIND_CPU"
    model_file = "model.onnx"

    def check_available(self, release: Release) -> None:
        return None

    def export(self, ctx: ExportContext) -> ExportedModel:
        spec = ctx.model.spec
        return ExportedModel(
            format=self.name,
            files={"model.py": model_py_source(), self.model_file: exported_onnx(ctx)},
            inputs=spec.inputs,
            outputs=spec.outputs,
            details={"opset": ctx.options.opset, "intra_op_num_threads": ctx.options.cpu_threads},
        )

    def runner(self, exported: ExportedModel, ctx: ExportContext) -> Runner:
        # The same session settings model.py uses inside Triton.
        return run_onnx(onnx_session(exported.files[self.model_file], ctx.options.cpu_threads), exported)

    def versions(self) -> dict[str, str]:
        return onnx_versions()
