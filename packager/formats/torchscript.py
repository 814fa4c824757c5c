"""TorchScript for Triton's ``pytorch_libtorch`` backend (INPUT__0 / OUTPUT__0 naming).

An artifact served on the GPU (instance kind KIND_GPU, the default) is validated on the GPU
when torch sees one, else on the CPU as before; the manifest records which. On the GPU it runs
in full FP32: cuDNN convolutions default to TF32 on Ampere and newer
(``torch.backends.cudnn.conv.fp32_precision`` reads "tf32" in torch 2.14), which would be
checked against FP32 tolerances. Triton's libtorch backend keeps libtorch's defaults, so a
served conv net on such a GPU may differ from these figures by TF32's ~1e-3 relative.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from mme.errors import ExportError, ValidationError
from mme.progress import library_output_captured
from packager.formats.base import (
    CPU,
    CUDA,
    DeviceRunner,
    ExportContext,
    ExportedModel,
    ModelFormat,
    Runner,
    exception_summary,
    package_version,
    validation_device,
)


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


def torchscript_device(instance_kind: str, cuda_available: bool | None = None) -> str:
    """Where a TorchScript artifact served with ``instance_kind`` is validated: "cuda" for a
    GPU one when CUDA is usable (``cuda_available``; None: ask torch), else "cpu"."""
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    return validation_device(instance_kind, cuda_available)


@contextlib.contextmanager
def fp32_math(tf32: bool = False) -> Iterator[dict[str, str]]:
    """fp32 matrix products, convolutions and RNNs on the GPU in TF32 (``tf32``) or in full FP32
    ("ieee"), restored afterwards; yields the settings in force. The one home of TF32 control:
    validation runs in full FP32, the GPU check times both."""
    import torch

    backends: Any = torch.backends  # torch's stubs lack the per-operator fp32_precision flags (torch 2.9+)
    value = "tf32" if tf32 else "ieee"
    if hasattr(backends.cuda.matmul, "fp32_precision") and hasattr(backends.cudnn, "conv"):
        flags = {"matmul": backends.cuda.matmul, "conv": backends.cudnn.conv, "rnn": backends.cudnn.rnn}
        before = {op: flag.fp32_precision for op, flag in flags.items()}
        for flag in flags.values():
            flag.fp32_precision = value
        try:
            yield {op: value for op in flags}
        finally:
            for op, flag in flags.items():
                flag.fp32_precision = before[op]
        return
    saved = (backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32)  # older torch: the legacy flags
    backends.cuda.matmul.allow_tf32 = backends.cudnn.allow_tf32 = tf32
    try:
        yield {"matmul": value, "conv": value, "rnn": value}
    finally:
        backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32 = saved


# What "none" (torch 2.9+: not set) means per operator: the legacy flags' defaults.
LEGACY_DEFAULTS = {"matmul": "ieee", "conv": "tf32", "rnn": "tf32"}


def fp32_settings() -> dict[str, str]:
    """What this PyTorch does with fp32 matrix products, convolutions and RNNs on the GPU now
    (PyTorch's defaults differ per operator: products in full FP32, cuDNN in TF32)."""
    import torch

    backends: Any = torch.backends
    if hasattr(backends.cuda.matmul, "fp32_precision") and hasattr(backends.cudnn, "conv"):
        flags = {"matmul": backends.cuda.matmul, "conv": backends.cudnn.conv, "rnn": backends.cudnn.rnn}
        return {op: LEGACY_DEFAULTS[op] if flag.fp32_precision == "none" else str(flag.fp32_precision)
                for op, flag in flags.items()}
    conv = "tf32" if backends.cudnn.allow_tf32 else "ieee"
    return {"matmul": "tf32" if backends.cuda.matmul.allow_tf32 else "ieee", "conv": conv, "rnn": conv}


def run_torchscript(module, exported: ExportedModel, device: str = "cpu", fp32: bool = False) -> Runner:
    """A runner of ``module`` on ``device``; ``fp32``: with TF32 off (:func:`fp32_math`)."""
    import torch

    def run(inputs):
        args = [torch.from_numpy(inputs[t.name]).to(device) for t in exported.inputs]
        with torch.no_grad(), (fp32_math() if fp32 else contextlib.nullcontext()):
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
    saved_by_torch = True

    def export(self, ctx: ExportContext) -> ExportedModel:
        import torch

        path = self.work_path(ctx)
        torch.jit.save(traced_module(ctx), str(path))
        return self.exported(ctx, {self.model_file: path})

    def runner(self, exported: ExportedModel, ctx: ExportContext) -> Runner:
        """On the GPU for a GPU artifact where torch sees one (in FP32), else on the CPU."""
        import torch

        device = torchscript_device(self.served_instance_kind(ctx))
        module = torch.jit.load(str(exported.files[self.model_file]), map_location=device)
        if device == CPU:
            return DeviceRunner(run_torchscript(module, exported), CPU)
        detail = f"torch {torch.__version__} on {torch.cuda.get_device_name()}, FP32 (TF32 off)"
        run = run_torchscript(module, exported, CUDA, fp32=True)

        def on_gpu(inputs):
            try:
                return run(inputs)
            except RuntimeError as exc:  # e.g. a tensor the trace pinned to the CPU meets CUDA ones
                raise ValidationError(
                    f"[{self.name}] the traced module fails on the GPU it is marked for ({exception_summary(exc)}); "
                    "tracing can fix a device inside the model (a tensor made on 'cpu'): make the model create "
                    "tensors on its input's device, or serve it on the CPU with --instance-kind cpu") from None

        return DeviceRunner(on_gpu, CUDA, detail)

    def versions(self) -> dict[str, str]:
        return {"torch": package_version("torch") or "unknown"}
