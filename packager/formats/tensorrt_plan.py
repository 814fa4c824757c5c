"""TensorRT plans for Triton's ``tensorrt_plan`` platform, built from the ONNX export.

A plan runs only on the TensorRT version and GPU architecture it was built with; both
are recorded in the manifest. TensorRT 11 dropped the weak-typing FP16 builder flag, so
fp16 converts the ONNX graph to half precision (inputs and outputs kept fp32) and builds a
strongly typed network; on TensorRT 10 the FP16 flag is used.
"""

from __future__ import annotations

from pathlib import Path

from mme.errors import ExportError
from packager.formats.base import ExportContext, ExportedModel, Runner, package_version
from packager.formats.gpu import gpu_details, profile_shapes, require_gpu
from packager.formats.onnx_format import exported_onnx


def _fp16_onnx(src: Path, workdir: Path) -> Path:
    import onnx
    from onnxconverter_common import float16

    dest = workdir / "tensorrt" / "model_fp16.onnx"
    dest.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(float16.convert_float_to_float16(onnx.load(str(src)), keep_io_types=True), str(dest))
    return dest


def build_plan(ctx: ExportContext, onnx_path: Path, dest: Path) -> None:
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    legacy_fp16 = hasattr(trt.BuilderFlag, "FP16")
    if ctx.options.precision == "fp16" and not legacy_fp16:
        onnx_path = _fp16_onnx(onnx_path, ctx.workdir)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ExportError(f"TensorRT could not parse the ONNX export: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(ctx.options.workspace_gib * (1 << 30)))
    if ctx.options.precision == "fp16" and legacy_fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    profile = builder.create_optimization_profile()
    for tensor, lo, opt, hi in profile_shapes(ctx.model.spec, ctx.options.max_batch_size):
        profile.set_shape(tensor.name, lo, opt, hi)
    config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ExportError("TensorRT failed to build the engine; rerun with a smaller --max-batch-size or --workspace-gib")
    dest.write_bytes(bytes(serialized))


class TensorRTPlanFormat:
    name = "tensorrt"
    description = "TensorRT plan (GPU only) for Triton's tensorrt_plan platform"
    requires_gpu = True
    platform = "tensorrt_plan"
    backend = None
    instance_kind = "KIND_GPU"
    model_file = "model.plan"

    def check_available(self) -> None:
        require_gpu(self.name, ("tensorrt",))

    def export(self, ctx: ExportContext) -> ExportedModel:
        import tensorrt as trt

        path = ctx.workdir / "tensorrt" / self.model_file
        path.parent.mkdir(parents=True, exist_ok=True)
        build_plan(ctx, exported_onnx(ctx), path)
        spec = ctx.model.spec
        return ExportedModel(
            format=self.name,
            files={self.model_file: path},
            inputs=spec.inputs,
            outputs=spec.outputs,
            details={"tensorrt": trt.__version__, "precision": ctx.options.precision, **gpu_details()},
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
        return {"tensorrt": package_version("tensorrt") or package_version("tensorrt-cu13") or "unknown"}
