"""Torch-TensorRT: the model compiled with Torch-TensorRT and saved as TorchScript, served
by Triton's ``pytorch_libtorch`` backend (which links the Torch-TensorRT runtime of the NGC
PyTorch image of its release).

Its engines load only in a runtime of the same engine ABI, and Torch-TensorRT is built for
one torch and one TensorRT, so this format is built with the release's own stack: in the
builder image (``make docker-package``). Elsewhere it refuses to start, naming the versions
that differ. The manifest records the Torch-TensorRT version and its engine ABI.
"""

from __future__ import annotations

import dataclasses

from mme.errors import ExportError, GpuRequiredError
from mme.versions import Release, installed_stack, stack_mismatches
from packager.formats.base import ExportContext, ExportedModel, Runner, package_version
from packager.formats.gpu import (
    GpuFormat,
    gpu_details,
    hardware_compatibility,
    profile_shapes,
    require_gpu,
    torch_tensorrt_precision_args,
)
from packager.formats.tensorrt_plan import installed_tensorrt
from packager.formats.torchscript import run_torchscript


def settings_fields(torch_tensorrt) -> set[str]:
    """The keyword arguments this Torch-TensorRT's dynamo compiler knows."""
    from torch_tensorrt.dynamo import CompilationSettings

    return {f.name for f in dataclasses.fields(CompilationSettings)}


def engine_abi() -> str | None:
    """The engine ABI of the installed Torch-TensorRT runtime (core/runtime ABI_VERSION)."""
    import torch

    try:
        return str(torch.ops.tensorrt.ABI_VERSION())
    except (AttributeError, RuntimeError):
        return None


def check_release_stack(release) -> None:
    """Refuse before any work when this environment's torch / Torch-TensorRT / TensorRT are
    not the release's: the module would not load in that release's Triton."""
    problems = stack_mismatches(release, installed_stack())
    if problems:
        raise GpuRequiredError(
            f"format 'torch-tensorrt' must be built with release {release.name}'s own stack "
            f"({'; '.join(problems)}); build it in the builder image: make docker-package DOCKER_FORMATS=torch-tensorrt "
            f"TRITON_RELEASE={release.name}"
        )


class TorchTensorRTFormat(GpuFormat):
    name = "torch-tensorrt"
    description = "Torch-TensorRT compiled TorchScript (GPU only, builder image) for Triton's pytorch_libtorch backend"
    platform = "pytorch_libtorch"
    model_file = "model.pt"
    libtorch_names = True
    engine = "Torch-TensorRT module"
    torch_tensorrt_engine = True
    saved_by_torch = True

    def check_available(self, release: Release) -> None:
        require_gpu(self.name, ("tensorrt", "torch_tensorrt"))
        self.check_release(release)

    def check_release(self, release: Release) -> None:
        check_release_stack(release)

    def export(self, ctx: ExportContext) -> ExportedModel:
        import torch
        import torch_tensorrt

        spec = ctx.model.spec
        module = ctx.model.module.cuda().eval()
        dtypes = {"float32": torch.float32, "int64": torch.int64, "int32": torch.int32, "float16": torch.float16}
        inputs = [
            torch_tensorrt.Input(min_shape=lo, opt_shape=opt, max_shape=hi, dtype=dtypes[t.dtype])
            for t, lo, opt, hi in profile_shapes(spec, ctx.max_batch_size)
        ]
        precision_args = torch_tensorrt_precision_args(settings_fields(torch_tensorrt), ctx.options.precision, torch)
        if ctx.options.hardware_compatible:
            precision_args["hardware_compatible"] = True
        example = ctx.model.make_inputs(min(2, ctx.max_batch_size), spec.axes, 1234)
        example_tensors = [torch.from_numpy(example[t.name]).cuda() for t in spec.inputs]
        path = self.work_path(ctx)
        try:
            compiled = torch_tensorrt.compile(module, ir="dynamo", inputs=inputs, **precision_args)
            torch_tensorrt.save(compiled, str(path), output_format="torchscript", arg_inputs=example_tensors)
        except Exception as exc:
            raise ExportError(f"Torch-TensorRT compilation failed: {str(exc).splitlines()[0]}") from None
        finally:
            ctx.model.module.cpu()
        recorded = {k: sorted(str(p) for p in v) if isinstance(v, set) else str(v) for k, v in precision_args.items()}
        return self.exported(ctx, {self.model_file: path}, {
            "tensorrt": installed_tensorrt() or "unknown",
            "torch_tensorrt": torch_tensorrt.__version__,
            "torch_tensorrt_abi": engine_abi(),
            "precision": ctx.options.precision,
            "builder_settings": recorded,
            "hardware_compatibility": hardware_compatibility(ctx.options),
            **gpu_details(),
        })

    def runner(self, exported: ExportedModel, ctx: ExportContext) -> Runner:
        import torch
        import torch_tensorrt  # noqa: F401  registers the TensorRT runtime ops

        module = torch.jit.load(str(exported.files[self.model_file]), map_location="cuda")
        return run_torchscript(module, exported, device="cuda")

    def versions(self) -> dict[str, str]:
        return {
            "torch": package_version("torch") or "unknown",
            "torch_tensorrt": package_version("torch-tensorrt") or "unknown",
            "tensorrt": installed_tensorrt() or "unknown",
        }
