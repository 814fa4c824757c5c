"""What the GPU-only formats share: the availability check, the optimisation profile, and the
precision an engine is built in.

Precision is what it says:

* ``fp32``: FP32 arithmetic. TensorRT's ``BuilderFlag.TF32`` is on by default (TensorRT 10
  and 11), so it is cleared; Torch-TensorRT gets ``disable_tf32=True``.
* ``tf32``: FP32 tensors, matrix products in TF32 on Ampere and newer (faster, ~1e-3 error
  on transformer layers): its own, looser default tolerances.
* ``fp16``: half precision. TensorRT 10 takes ``BuilderFlag.FP16``; TensorRT 11 has no such
  flag (networks are strongly typed), so the ONNX graph is converted to FP16 first.
  Torch-TensorRT up to 2.9 honours ``enabled_precisions``; 2.10-2.12 need
  ``use_explicit_typing=False`` for it; from 2.13 the dynamo path ignores it and
  ``enable_autocast=True, autocast_low_precision_type=torch.float16`` asks for FP16.

The manifest records the precision asked for, the builder settings used, and (TensorRT
plans) the precisions the engine's layers actually run in, read with the engine inspector.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any, Iterator, Mapping

from mme.errors import GpuRequiredError, UsageError
from packager.formats.base import ExportedModel, ExportOptions, ModelFormat
from packager.spec import IOSpec, TensorSpec

PRECISIONS = ("fp32", "tf32", "fp16")
TF32_ATOL = 1e-2  # TF32 rounding emulated on CPU: 2.6e-4 (test_resnet), 1.7e-3 (distilbert)
FP16_ATOL = 5e-2
# Relative tolerances of the reduced precisions: TF32 and FP16 both keep a 10-bit mantissa
# (unit roundoff 2^-11 = 4.9e-4 per rounding, against fp32's 6e-8), and errors of that order
# compound over a network's layers to about 1e-2 of an output's size; fp32 engines take the
# family's (packager.spec.IOSpec.default_rtol, 1e-3).
TF32_RTOL = 1e-2
FP16_RTOL = 1e-2
HARDWARE_COMPATIBLE = "ampere_plus"  # TensorRT HardwareCompatibilityLevel.AMPERE_PLUS


def require_gpu(format_name: str, packages: tuple[str, ...]) -> None:
    """Raise the one-line GPU message unless a CUDA GPU and ``packages`` are present."""
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    reason = None
    try:
        import torch

        if not torch.cuda.is_available():
            reason = "no CUDA GPU is visible on this host"
    except ImportError:  # pragma: no cover - torch is a core dependency
        reason = "torch is not installed"
    if reason is None and missing:
        reason = f"the {', '.join(missing)} package is not installed ({install_hint(missing[0])})"
    if reason is not None:
        raise GpuRequiredError(
            f"format '{format_name}' needs an NVIDIA GPU and TensorRT ({reason}); "
            "run it on a GPU host, or in the builder image (make docker-package)"
        )


def install_hint(package: str) -> str:
    if package == "torch_tensorrt":
        return ("Torch-TensorRT must match the release's torch and libtorch, so it is built in the builder image: "
                "make docker-package DOCKER_FORMATS=torch-tensorrt")
    return "make install-gpu, i.e. pip install --extra-index-url https://pypi.nvidia.com -e '.[gpu]'"


def precision_atol(spec_atol: float, precision: str) -> float:
    """A GPU engine's validation tolerance when --atol is not given: the family's for FP32,
    looser for TF32 and FP16."""
    if precision == "fp32":
        return spec_atol
    return max(spec_atol, TF32_ATOL if precision == "tf32" else FP16_ATOL)


def precision_rtol(spec_rtol: float, precision: str) -> float:
    """A GPU engine's relative validation tolerance when --rtol is not given: the family's for
    FP32, looser for TF32 and FP16."""
    if precision == "fp32":
        return spec_rtol
    return max(spec_rtol, TF32_RTOL if precision == "tf32" else FP16_RTOL)


def hardware_compatibility(options: ExportOptions) -> str:
    """The engine's hardware compatibility level as the manifest records it."""
    return HARDWARE_COMPATIBLE if options.hardware_compatible else "none"


class GpuFormat(ModelFormat):
    """A format that builds TensorRT engines on this host's GPU: its precision sets the default
    tolerance, and the manifest records the TensorRT (and Torch-TensorRT) the build reported."""

    requires_gpu = True
    instance_kind = "KIND_GPU"
    BUILT_VERSIONS = ("tensorrt", "torch_tensorrt")  # read back from the export's details

    def default_atol(self, spec_atol: float, precision: str) -> float:
        return precision_atol(spec_atol, precision)

    def default_rtol(self, spec_rtol: float, precision: str) -> float:
        return precision_rtol(spec_rtol, precision)

    def recorded_versions(self, exported: ExportedModel) -> dict[str, str]:
        built = {key: str(exported.details[key]) for key in self.BUILT_VERSIONS if key in exported.details}
        return self.versions() | built


def opt_batch(max_batch: int) -> int:
    """The batch size engines are optimised (and Torch-TensorRT traced) for: half the max,
    but at least 2 when the max allows, since an example of batch 1 makes torch.export
    specialise the batch dimension to 1 (Torch-TensorRT then fails for max batch 2 or 3)."""
    if max_batch <= 1:
        return 1
    return max(2, max_batch // 2)


def profile_shapes(spec: IOSpec, max_batch: int) -> Iterator[tuple[TensorSpec, tuple, tuple, tuple]]:
    """(tensor, min, opt, max) per input: batch 1..max_batch, dynamic axes 1..their max,
    optimised for :func:`opt_batch` at the full axis length."""
    axes_max = spec.axes
    axes_min = {name: 1 for name in axes_max}
    for tensor in spec.inputs:
        yield (
            tensor,
            tensor.concrete_shape(1, axes_min),
            tensor.concrete_shape(opt_batch(max_batch), axes_max),
            tensor.concrete_shape(max_batch, axes_max),
        )


def gpu_details() -> dict[str, str]:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return {"gpu": torch.cuda.get_device_name(), "compute_capability": f"{major}.{minor}"}


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise UsageError(f"--precision {precision!r}: choose one of {', '.join(PRECISIONS)}")


# -- TensorRT -----------------------------------------------------------------------------

def tensorrt_major(version: str | None) -> int | None:
    """The major version of a TensorRT version string ("10.13.3.9" -> 10); None if it has none."""
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


def fp16_needs_fp16_graph(trt: Any) -> bool:
    """TensorRT 11 removed BuilderFlag.FP16: FP16 engines come from an FP16 ONNX graph."""
    return not hasattr(trt.BuilderFlag, "FP16")


def configure_builder(trt: Any, config: Any, precision: str, hardware_compatible: bool) -> dict[str, Any]:
    """Set ``config`` (an IBuilderConfig) for ``precision``; return what was set, for the manifest."""
    check_precision(precision)
    settings: dict[str, Any] = {}
    if precision == "fp32":
        config.clear_flag(trt.BuilderFlag.TF32)
        settings["tf32"] = False
    else:
        settings["tf32"] = bool(config.get_flag(trt.BuilderFlag.TF32))
    if precision == "fp16":
        if fp16_needs_fp16_graph(trt):
            settings["fp16"] = "fp16 ONNX graph (strongly typed network)"
        else:
            config.set_flag(trt.BuilderFlag.FP16)
            settings["fp16"] = "BuilderFlag.FP16"
    if hardware_compatible:
        config.hardware_compatibility_level = trt.HardwareCompatibilityLevel.AMPERE_PLUS
        settings["hardware_compatibility"] = HARDWARE_COMPATIBLE
    # Layer details in the engine, so the inspector can say which precision each layer runs in.
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    return settings


_DTYPE_WORDS = (("FP32", "fp32"), ("FLOAT", "fp32"), ("FP16", "fp16"), ("HALF", "fp16"), ("BF16", "bf16"),
                ("BFLOAT16", "bf16"), ("INT8", "int8"), ("FP8", "fp8"), ("INT64", "int64"), ("INT32", "int32"),
                ("BOOL", "bool"))


def _dtype_of(entry: Mapping[str, Any]) -> str | None:
    text = str(entry.get("Format/Datatype") or entry.get("DataType") or entry.get("Datatype") or "").upper()
    for word, name in sorted(_DTYPE_WORDS, key=lambda item: -len(item[0])):
        if word in text:
            return name
    return None


def layer_precisions(engine_information: str) -> dict[str, int]:
    """Count the engine's layers by the datatype of their outputs, from
    ``IEngineInspector.get_engine_information(LayerInformationFormat.JSON)`` with detailed
    profiling verbosity (TensorRT 10 writes ``"Format/Datatype"`` per tensor, 11 a separate
    ``"DataType"``). Layers without a readable datatype count as "unknown"."""
    try:
        info = json.loads(engine_information)
    except ValueError:
        return {}
    counts: dict[str, int] = {}
    for layer in info.get("Layers", []) if isinstance(info, dict) else []:
        if not isinstance(layer, dict):
            continue
        kinds = {kind for out in layer.get("Outputs", []) if isinstance(out, dict) and (kind := _dtype_of(out)) is not None}
        key = "/".join(sorted(kinds)) if kinds else "unknown"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def engine_precision(counts: Mapping[str, int], requested: str) -> str:
    """One word for the manifest: the float precision most layers compute in, or the
    requested one when the engine did not say."""
    floats = {k: v for k, v in counts.items() if k in ("fp32", "fp16", "bf16", "fp8", "int8")}
    if not floats:
        return requested
    best = max(floats, key=lambda k: floats[k])
    if best == "fp32" and requested == "tf32":
        return "tf32"  # TF32 is FP32 storage; the inspector cannot tell them apart
    return best


# -- Torch-TensorRT -------------------------------------------------------------------------

def torch_tensorrt_precision_args(settings_fields: set[str], precision: str, torch: Any) -> dict[str, Any]:
    """``torch_tensorrt.compile`` keyword arguments for ``precision``, chosen by what this
    Torch-TensorRT's dynamo ``CompilationSettings`` has (``settings_fields``)."""
    check_precision(precision)
    kwargs: dict[str, Any] = {"disable_tf32": precision == "fp32"}
    if precision != "fp16":
        kwargs["enabled_precisions"] = {torch.float32}
        return kwargs
    if "enable_autocast" in settings_fields and "use_explicit_typing" not in settings_fields:
        # 2.13+: enabled_precisions is ignored on the dynamo path.
        kwargs.update(enable_autocast=True, autocast_low_precision_type=torch.float16)
    else:
        kwargs["enabled_precisions"] = {torch.float16, torch.float32}
        if "use_explicit_typing" in settings_fields:  # 2.6-2.12; True by default from 2.10
            kwargs["use_explicit_typing"] = False
    return kwargs
