"""Torch-TensorRT: the model compiled with Torch-TensorRT and saved as TorchScript, served
by Triton's ``pytorch_libtorch`` backend (which links the Torch-TensorRT runtime)."""

from __future__ import annotations

from mme.errors import ExportError
from packager.formats.base import ExportContext, ExportedModel, Runner, package_version, positional_names
from packager.formats.gpu import gpu_details, profile_shapes, require_gpu
from packager.formats.torchscript import run_torchscript


class TorchTensorRTFormat:
    name = "torch-tensorrt"
    description = "Torch-TensorRT compiled TorchScript (GPU only) for Triton's pytorch_libtorch backend"
    requires_gpu = True
    platform = "pytorch_libtorch"
    backend = None
    instance_kind = "KIND_GPU"
    model_file = "model.pt"

    def check_available(self) -> None:
        require_gpu(self.name, ("tensorrt", "torch_tensorrt"))

    def export(self, ctx: ExportContext) -> ExportedModel:
        import torch
        import torch_tensorrt

        spec = ctx.model.spec
        module = ctx.model.module.cuda().eval()
        dtypes = {"float32": torch.float32, "int64": torch.int64, "int32": torch.int32, "float16": torch.float16}
        inputs = [
            torch_tensorrt.Input(min_shape=lo, opt_shape=opt, max_shape=hi, dtype=dtypes[t.dtype])
            for t, lo, opt, hi in profile_shapes(spec, ctx.options.max_batch_size)
        ]
        precisions = {torch.float32} | ({torch.float16} if ctx.options.precision == "fp16" else set())
        example = ctx.model.make_inputs(min(2, ctx.options.max_batch_size), spec.axes, 1234)
        example_tensors = [torch.from_numpy(example[t.name]).cuda() for t in spec.inputs]
        path = ctx.workdir / "torch-tensorrt" / self.model_file
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            compiled = torch_tensorrt.compile(module, ir="dynamo", inputs=inputs, enabled_precisions=precisions)
            torch_tensorrt.save(compiled, str(path), output_format="torchscript", arg_inputs=example_tensors)
        except Exception as exc:
            raise ExportError(f"Torch-TensorRT compilation failed: {str(exc).splitlines()[0]}") from None
        finally:
            ctx.model.module.cpu()
        return ExportedModel(
            format=self.name,
            files={self.model_file: path},
            inputs=positional_names(spec.inputs, "INPUT"),
            outputs=positional_names(spec.outputs, "OUTPUT"),
            details={
                "tensorrt": package_version("tensorrt") or package_version("tensorrt-cu13") or "unknown",
                "torch_tensorrt": torch_tensorrt.__version__,
                "precision": ctx.options.precision,
                **gpu_details(),
            },
        )

    def runner(self, exported: ExportedModel, ctx: ExportContext) -> Runner:
        import torch
        import torch_tensorrt  # noqa: F401  registers the TensorRT runtime ops

        module = torch.jit.load(str(exported.files[self.model_file]), map_location="cuda")
        return run_torchscript(module, exported, device="cuda")

    def versions(self) -> dict[str, str]:
        return {
            "torch": package_version("torch") or "unknown",
            "torch_tensorrt": package_version("torch-tensorrt") or "unknown",
            "tensorrt": package_version("tensorrt") or package_version("tensorrt-cu13") or "unknown",
        }
