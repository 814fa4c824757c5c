"""TorchScript for Triton's ``pytorch_libtorch`` backend (INPUT__0 / OUTPUT__0 naming)."""

from __future__ import annotations

from mme.errors import ExportError
from mme.progress import library_output_captured
from packager.formats.base import ExportContext, ExportedModel, ModelFormat, Runner, exception_summary, package_version


def traced_module(ctx: ExportContext):
    """Trace the model once per run (shared with torch-tensorrt)."""
    if "torchscript" not in ctx.cache:
        import torch

        spec = ctx.model.spec
        example = ctx.model.make_inputs(2, spec.axes, 1234)
        tensors = tuple(torch.from_numpy(example[t.name]) for t in spec.inputs)
        try:
            with torch.no_grad(), library_output_captured():
                ctx.cache["torchscript"] = torch.jit.trace(ctx.model.module, tensors, check_trace=False)
        except Exception as exc:
            raise ExportError(f"TorchScript tracing failed for {ctx.model.request.name}: {exception_summary(exc)}") from None
    return ctx.cache["torchscript"]


def run_torchscript(module, exported: ExportedModel, device: str = "cpu") -> Runner:
    import torch

    def run(inputs):
        args = [torch.from_numpy(inputs[t.name]).to(device) for t in exported.inputs]
        with torch.no_grad():
            out = module(*args)
        out = out if isinstance(out, (tuple, list)) else (out,)
        return {t.name: o.detach().float().cpu().numpy() for t, o in zip(exported.outputs, out)}

    return run


class TorchScriptFormat(ModelFormat):
    name = "torchscript"
    description = "TorchScript (traced) for Triton's pytorch_libtorch backend"
    platform = "pytorch_libtorch"
    model_file = "model.pt"
    libtorch_names = True

    def export(self, ctx: ExportContext) -> ExportedModel:
        import torch

        path = self.work_path(ctx)
        torch.jit.save(traced_module(ctx), str(path))
        return self.exported(ctx, {self.model_file: path})

    def runner(self, exported: ExportedModel, ctx: ExportContext) -> Runner:
        import torch

        return run_torchscript(torch.jit.load(str(exported.files[self.model_file]), map_location="cpu"), exported)

    def versions(self) -> dict[str, str]:
        return {"torch": package_version("torch") or "unknown"}
