"""TensorRT plans for Triton's ``tensorrt_plan`` platform, built from the ONNX export.

A plan runs only on the TensorRT version and GPU architecture it was built with (any
Ampere-or-newer GPU with ``--hardware-compatible``); the manifest records both. Precision
follows :mod:`packager.formats.gpu`: FP32 clears TF32, FP16 uses the builder flag on
TensorRT 10 and an FP16 ONNX graph (inputs and outputs kept FP32) on TensorRT 11. The
engine inspector then says which precision its layers actually run in.
"""

from __future__ import annotations

from pathlib import Path

from mme.errors import ExportError
from mme.versions import Release
from packager.formats.base import ExportContext, ExportedModel, Runner, package_version
from packager.formats.gpu import (
    configure_builder,
    engine_precision,
    fp16_needs_fp16_graph,
    gpu_details,
    layer_precisions,
    profile_shapes,
    require_gpu,
)
from packager.formats.onnx_format import exported_onnx


def fp16_onnx(src: Path, dest: Path) -> Path:
    """The ONNX graph with FP16 weights and arithmetic, FP32 inputs and outputs (what
    TensorRT 11 builds an FP16 engine from)."""
    import warnings

    import onnx
    from onnxconverter_common import float16

    dest.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # one line per weight clipped to FP16's range: expected, not news
        warnings.simplefilter("ignore", UserWarning)
        converted = float16.convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    onnx.save(converted, str(dest))
    return dest


def build_plan(ctx: ExportContext, onnx_path: Path, dest: Path) -> dict:
    """Build and write the plan; return the builder settings and the engine's layer precisions."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    precision = ctx.options.precision
    if precision == "fp16" and fp16_needs_fp16_graph(trt):
        onnx_path = fp16_onnx(onnx_path, ctx.workdir / "tensorrt" / "model_fp16.onnx")
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ExportError(f"TensorRT could not parse the ONNX export: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(ctx.options.workspace_gib * (1 << 30)))
    settings = configure_builder(trt, config, precision, ctx.options.hardware_compatible)
    profile = builder.create_optimization_profile()
    for tensor, lo, opt, hi in profile_shapes(ctx.model.spec, ctx.options.max_batch_size):
        profile.set_shape(tensor.name, lo, opt, hi)
    config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ExportError("TensorRT failed to build the engine; rerun with a smaller --max-batch-size or --workspace-gib")
    dest.write_bytes(bytes(serialized))
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(dest.read_bytes())
    counts = layer_precisions(engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON))
    return {"builder_settings": settings, "layer_precisions": counts,
            "engine_precision": engine_precision(counts, precision)}


class TensorRTPlanFormat:
    name = "tensorrt"
    description = "TensorRT plan (GPU only) for Triton's tensorrt_plan platform"
    requires_gpu = True
    platform = "tensorrt_plan"
    backend = None
    instance_kind = "KIND_GPU"
    model_file = "model.plan"

    def check_available(self, release: Release) -> None:
        require_gpu(self.name, ("tensorrt",))
        check_release_tensorrt(release)

    def export(self, ctx: ExportContext) -> ExportedModel:
        import tensorrt as trt

        path = ctx.workdir / "tensorrt" / self.model_file
        path.parent.mkdir(parents=True, exist_ok=True)
        built = build_plan(ctx, exported_onnx(ctx), path)
        spec = ctx.model.spec
        return ExportedModel(
            format=self.name,
            files={self.model_file: path},
            inputs=spec.inputs,
            outputs=spec.outputs,
            details={"tensorrt": trt.__version__, "precision": ctx.options.precision,
                     "hardware_compatibility": "ampere_plus" if ctx.options.hardware_compatible else "none",
                     **built, **gpu_details()},
        )

    def runner(self, exported: ExportedModel, ctx: ExportContext) -> Runner:
        import numpy as np
        import tensorrt as trt
        import torch

        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        engine = runtime.deserialize_cuda_engine(exported.files[self.model_file].read_bytes())
        context = engine.create_execution_context()

        def run(inputs):
            keep = []
            for t in exported.inputs:
                tensor = torch.from_numpy(np.ascontiguousarray(inputs[t.name])).cuda()
                keep.append(tensor)
                context.set_input_shape(t.name, tuple(tensor.shape))
                context.set_tensor_address(t.name, tensor.data_ptr())
            outputs = {}
            for t in exported.outputs:
                dtype = torch.from_numpy(np.zeros(0, dtype=trt.nptype(engine.get_tensor_dtype(t.name)))).dtype
                out = torch.empty(tuple(context.get_tensor_shape(t.name)), dtype=dtype, device="cuda")
                context.set_tensor_address(t.name, out.data_ptr())
                outputs[t.name] = out
            stream = torch.cuda.current_stream()
            if not context.execute_async_v3(stream.cuda_stream):
                raise ExportError("TensorRT execution failed during validation")
            stream.synchronize()
            return {name: out.float().cpu().numpy() for name, out in outputs.items()}

        return run

    def versions(self) -> dict[str, str]:
        return {"tensorrt": installed_tensorrt() or "unknown"}


def check_release_tensorrt(release: Release) -> None:
    """Refuse before any work when the installed TensorRT is not the release's: the plan
    would never load in that release's Triton."""
    from mme.errors import GpuRequiredError
    from mme.versions import same_tensorrt

    installed = installed_tensorrt()
    if installed and release.tensorrt and not same_tensorrt(installed, release.tensorrt):
        raise GpuRequiredError(
            f"TensorRT {installed} is installed but Triton {release.name} runs TensorRT {release.tensorrt}, and a plan "
            f"loads only on the TensorRT it was built with: install the release's (make install-gpu installs the "
            f"default release's), build in the builder image (make docker-package TRITON_RELEASE={release.name}), "
            f"or pick the release that runs {installed} with --triton-release"
        )


def installed_tensorrt() -> str | None:
    """The TensorRT Python package's version, whichever CUDA flavour of it is installed."""
    for name in ("tensorrt", "tensorrt-cu13", "tensorrt-cu12"):
        found = package_version(name)
        if found:
            return found
    return None
