"""The CPU-local format: a Triton python-backend model running the ONNX export with ONNX
Runtime. It is what the GPU-less Triton server (the one inside the nvidia-pytriton wheel,
python backend only) can serve, with the same inputs and outputs as the ``onnx`` format."""

from __future__ import annotations

import dataclasses
from importlib import resources
from pathlib import Path

from packager.formats.base import ExportContext, ExportedModel, ExportOptions
from packager.formats.onnx_format import OnnxFormat

MODEL_PY = "onnxruntime_model.py"


def model_py_source() -> Path:
    return Path(str(resources.files("packager.backends").joinpath(MODEL_PY)))


class CpuLocalFormat(OnnxFormat):
    """The ONNX export plus the python-backend model.py that runs it (see packager/backends)."""

    name = "cpu-local"
    description = "Triton python backend running the ONNX file with ONNX Runtime (serves without a GPU)"
    platform = None
    backend = "python"
    instance_kind = "KIND_CPU"
    runs_on_sagemaker_image = False  # SageMaker's Triton image has no ONNX Runtime for the python backend

    def export(self, ctx: ExportContext) -> ExportedModel:
        onnx = super().export(ctx)
        return dataclasses.replace(
            onnx,
            files={"model.py": model_py_source(), **onnx.files},
            details={**onnx.details, "intra_op_num_threads": ctx.options.cpu_threads},
        )

    def session_threads(self, options: ExportOptions) -> int:
        return options.cpu_threads  # the same session settings model.py uses inside Triton

    def triton_parameters(self, options: ExportOptions) -> dict[str, str]:
        """What model.py reads from its config.pbtxt."""
        return {"intra_op_num_threads": str(options.cpu_threads), "onnx_file": self.model_file}
