"""ONNX for Triton's ``onnxruntime_onnx`` backend: opset >= 17, dynamic batch and sequence.

An artifact that backend serves on the GPU (instance kind KIND_GPU, the default) is validated
with ONNX Runtime's CUDAExecutionProvider where this ONNX Runtime has it (the onnxruntime-gpu
build on a GPU host), else on the CPU as before; the manifest records which. The CUDA provider
runs with ``use_tf32`` 0 (its option, onnxruntime/core/providers/cuda/cuda_execution_provider_info.cc)
so FP32 is checked against FP32 tolerances. The cpu-local format (the python backend's ONNX
Runtime, CPU provider only) is always validated on the CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from mme.errors import ExportError
from mme.progress import library_output_captured
from packager.formats.base import (
    CPU,
    CUDA,
    DeviceRunner,
    ExportContext,
    ExportedModel,
    ExportOptions,
    ModelFormat,
    Runner,
    exception_summary,
    package_version,
    validation_device,
)

MIN_OPSET = 17
CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"


def exported_onnx(ctx: ExportContext) -> Path:
    """Export the model to ONNX once per run (shared by onnx, cpu-local and tensorrt)."""
    if "onnx" not in ctx.cache:
        ctx.cache["onnx"] = _export(ctx)
    return ctx.cache["onnx"]


def _export(ctx: ExportContext) -> Path:
    import onnx
    import torch

    spec = ctx.model.spec
    path = ctx.workdir / "onnx" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    # Batch 2 even when max_batch_size is 1: torch.export specialises dimensions of size 1.
    example = ctx.model.make_inputs(2, spec.axes, 1234)
    args = tuple(torch.from_numpy(example[t.name]) for t in spec.inputs)
    # One Dim object per axis name so tensors sharing an axis share the symbol.
    dims = {"batch": torch.export.Dim("batch", min=1, max=max(2, ctx.max_batch_size))}
    for axis, size in spec.axis_max:
        dims[axis] = torch.export.Dim(axis, min=1, max=max(2, size))
    # Positional, in spec order: forward's parameter names differ between models (x, input_ids...).
    dynamic_shapes = tuple({index: dims[axis] for index, axis in t.dynamic_axes().items()} for t in spec.inputs)
    try:
        with library_output_captured():
            torch.onnx.export(
                ctx.model.module,
                args,
                str(path),
                input_names=[t.name for t in spec.inputs],
                output_names=[t.name for t in spec.outputs],
                opset_version=ctx.options.opset,
                dynamo=True,
                dynamic_shapes=dynamic_shapes,
                external_data=False,
                verbose=False,
            )
    except Exception as exc:
        raise ExportError(f"ONNX export failed for {ctx.model.request.name}: {exception_summary(exc)}") from None
    model = onnx.load(str(path), load_external_data=False)
    onnx.checker.check_model(model)
    opset = max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < MIN_OPSET:
        raise ExportError(f"ONNX export produced opset {opset}; Triton's ONNX Runtime needs {MIN_OPSET} or newer")
    return path


def onnx_session(path: Path, threads: int = 0, providers: Sequence[Any] = (CPU_PROVIDER,)):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=options, providers=list(providers))


def onnx_providers(instance_kind: str, available: Sequence[str] | None = None) -> list[Any]:
    """ONNX Runtime providers to validate an artifact served with ``instance_kind``: the CUDA
    provider (FP32: TF32 off), then the CPU, for a GPU one when ``available`` (None: this ONNX
    Runtime's providers) has it; else the CPU provider alone."""
    if available is None:
        import onnxruntime as ort

        available = ort.get_available_providers()
    if validation_device(instance_kind, CUDA_PROVIDER in available) == CUDA:
        return [(CUDA_PROVIDER, {"use_tf32": "0"}), CPU_PROVIDER]
    return [CPU_PROVIDER]


def run_onnx(session, exported: ExportedModel) -> Runner:
    def run(inputs):
        feeds = {t.name: inputs[t.name] for t in exported.inputs}
        values = session.run(list(exported.output_names), feeds)
        return dict(zip(exported.output_names, values))

    return run


class OnnxFormat(ModelFormat):
    """The ONNX export, served by Triton's ONNX Runtime backend; :class:`packager.formats.cpu_local.CpuLocalFormat`
    serves the same file from the python backend."""

    name = "onnx"
    description = "ONNX (opset >= 17, dynamic axes) for Triton's onnxruntime_onnx backend"
    platform: str | None = "onnxruntime_onnx"
    model_file = "model.onnx"
    onnx_model = True

    def export(self, ctx: ExportContext) -> ExportedModel:
        return self.exported(ctx, {self.model_file: exported_onnx(ctx)}, {"opset": ctx.options.opset})

    def session_threads(self, options: ExportOptions) -> int:
        """ONNX Runtime intra-op threads of the validation session (0: ONNX Runtime's default)."""
        return 0

    def validation_providers(self, instance_kind: str, available: Sequence[str] | None = None) -> list[Any]:
        """The providers the validation session asks for: as Triton's ONNX Runtime backend serves
        ``instance_kind`` (:func:`onnx_providers`); a python-backend format runs its own CPU session."""
        if self.platform != "onnxruntime_onnx":
            return [CPU_PROVIDER]
        return onnx_providers(instance_kind, available)

    def runner(self, exported: ExportedModel, ctx: ExportContext) -> Runner:
        """On the GPU for a GPU artifact where ONNX Runtime has the CUDA provider, else on the CPU."""
        providers = self.validation_providers(self.served_instance_kind(ctx))
        session = onnx_session(exported.files[self.model_file], self.session_threads(ctx.options), providers)
        ran = session.get_providers()
        if ran and ran[0] == CUDA_PROVIDER:
            return DeviceRunner(run_onnx(session, exported), CUDA, f"ONNX Runtime {CUDA_PROVIDER}, FP32 (use_tf32 0)")
        detail = (f"ONNX Runtime {CPU_PROVIDER} ({CUDA_PROVIDER} was asked for but did not start)"
                  if len(providers) > 1 else "")
        return DeviceRunner(run_onnx(session, exported), CPU, detail)

    def versions(self) -> dict[str, str]:
        return onnx_versions()


def onnx_versions() -> dict[str, str]:
    return {name: package_version(name) or "unknown" for name in ("torch", "onnx", "onnxruntime")}
