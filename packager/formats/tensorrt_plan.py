"""TensorRT plans for Triton's ``tensorrt_plan`` platform, built from the ONNX export.

A plan runs only on the TensorRT version and GPU architecture it was built with (any
Ampere-or-newer GPU with ``--hardware-compatible``); the manifest records both. Precision
follows :mod:`packager.formats.gpu`: FP32 clears TF32, FP16 uses the builder flag on
TensorRT 10 and an FP16 ONNX graph (inputs and outputs kept FP32) on TensorRT 11. The
engine inspector then says which precision its layers actually run in (:func:`engine_layers`):
the manifest's ``details`` get

* ``layer_precisions``: every layer of the engine counted by the datatype of its outputs
  (``{"fp16": 120, "fp32": 9, "int32": 3}``; a layer with outputs of two float types counts
  under both joined, ``"fp16/fp32"``; ``"unknown"`` where the inspector gave none);
* ``compute_layer_precisions``: the same over the layers that compute in floating point or
  int8: less those that only reformat, cast, hold a constant or do nothing, and less those
  whose outputs are all integers or booleans (shape and index arithmetic);
* ``engine_precision``: one word for those: ``fp32``, ``tf32``, ``fp16``, ``bf16``, ``fp8`` or
  ``int8`` when every compute layer runs in it (``tf32`` when TF32 was asked for and every
  compute layer is FP32: the inspector cannot tell the two apart), ``mixed`` when they run in
  more than one (the histogram says how many in each), ``unknown`` when the inspector said
  nothing. Manifests written before ``compute_layer_precisions`` existed hold the precision
  most layers ran in here (a majority vote), read with the inspector without an execution
  context, so mostly ``unknown`` layers and the requested precision as the word.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from mme.errors import ExportError, GpuRequiredError
from mme.versions import Release, same_tensorrt
from packager.formats.base import ExportContext, ExportedModel, Runner, package_version
from packager.formats.gpu import (
    GpuFormat,
    configure_builder,
    fp16_needs_fp16_graph,
    gpu_details,
    hardware_compatibility,
    profile_shapes,
    require_gpu,
)
from packager.formats.onnx_format import exported_onnx


def fp16_onnx(src: Path, dest: Path) -> Path:
    """The ONNX graph with FP16 weights and arithmetic, FP32 inputs and outputs (what
    TensorRT 11 builds an FP16 engine from)."""

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
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, ctx.options.workspace_mib << 20)
    settings = configure_builder(trt, config, precision, ctx.options.hardware_compatible)
    profile = builder.create_optimization_profile()
    for tensor, lo, opt, hi in profile_shapes(ctx.model.spec, ctx.max_batch_size):
        profile.set_shape(tensor.name, lo, opt, hi)
    config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ExportError("TensorRT failed to build the engine; rerun with a smaller --max-batch-size or a larger --workspace-mib")
    dest.write_bytes(bytes(serialized))
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(dest.read_bytes())
    opt_shapes = {tensor.name: opt for tensor, _lo, opt, _hi in profile_shapes(ctx.model.spec, ctx.max_batch_size)}
    return {"builder_settings": settings, **engine_layers(engine_information(trt, engine, opt_shapes), precision)}


# -- what the engine runs in: TensorRT's engine inspector ---------------------------------------

# Layers that move, convert or hold data: their outputs' datatype says nothing of the arithmetic
# (matched against the inspector's "LayerType" and "ParameterType").
NOT_COMPUTE = frozenset({"Reformat", "NoOp", "Constant", "Cast"})
# Datatype words of the inspector's "Format/Datatype" (TensorRT 10: "Row major linear FP32",
# "Channel major FP16 format where channel % 8 == 0", "Half" for Myelin layers) and "DataType"
# (TensorRT 11: "Half", "Float"): the names TensorRT's engine explorer (trex, activations.py) reads.
_DATATYPES = {"FP32": "fp32", "FLOAT": "fp32", "FP16": "fp16", "HALF": "fp16", "BF16": "bf16", "BFLOAT16": "bf16",
              "FP8": "fp8", "FP4": "fp4", "INT8": "int8", "INT4": "int4", "UINT8": "uint8", "INT32": "int32",
              "INT64": "int64", "BOOL": "bool", "DOUBLE": "fp64", "FP64": "fp64"}
# The precisions a layer computes in (the rest: integers of shapes and indices, booleans).
COMPUTE_PRECISIONS = ("fp32", "fp16", "bf16", "fp8", "fp4", "int8", "int4", "fp64")


def engine_information(trt: Any, engine: Any, shapes: Mapping[str, tuple]) -> str:
    """``IEngineInspector.get_engine_information(JSON)`` with an execution context whose input
    shapes are ``shapes``: without one, an engine with dynamic shapes (ours: the batch axis)
    reports no tensor formats ("N/A due to dynamic shapes"), hence no precision per layer
    (TensorRT's ``IEngineInspector::setExecutionContext``)."""
    inspector = engine.create_engine_inspector()
    context = engine.create_execution_context()
    if context is not None:
        for name, shape in shapes.items():
            context.set_input_shape(name, tuple(shape))
        # TensorRT 10 and 11 name it execution_context; 8.x named it context.
        setattr(inspector, "execution_context" if hasattr(inspector, "execution_context") else "context", context)
    return inspector.get_engine_information(trt.LayerInformationFormat.JSON)


def tensor_datatype(tensor: Mapping[str, Any]) -> str | None:
    """An inspector tensor's datatype (``fp16``, ``int32``, ...), None when it gives none."""
    text = str(tensor.get("Format/Datatype") or tensor.get("DataType") or tensor.get("Datatype") or "")
    for word in re.split(r"[^A-Za-z0-9]+", text.upper()):
        if word in _DATATYPES:
            return _DATATYPES[word]
    return None


def _layer_kind(layer: Mapping[str, Any]) -> set[str]:
    return {str(layer.get(key)) for key in ("LayerType", "ParameterType") if layer.get(key)}


def engine_layers(engine_information_json: str, requested: str) -> dict[str, Any]:
    """``layer_precisions``, ``compute_layer_precisions`` and ``engine_precision`` (the module's
    docstring defines them) from the inspector's JSON (detailed profiling verbosity; a layer
    is a dict there, its name only without it)."""
    try:
        info = json.loads(engine_information_json)
    except ValueError:
        info = {}
    every: dict[str, int] = {}
    compute: dict[str, int] = {}
    for layer in info.get("Layers", []) if isinstance(info, dict) else []:
        outputs = layer.get("Outputs", []) if isinstance(layer, dict) else []
        kinds = {kind for out in outputs if isinstance(out, dict) and (kind := tensor_datatype(out)) is not None}
        key = "/".join(sorted(kinds)) if kinds else "unknown"
        every[key] = every.get(key, 0) + 1
        computes = sorted(kinds & set(COMPUTE_PRECISIONS))
        if computes and isinstance(layer, dict) and not _layer_kind(layer) & NOT_COMPUTE:
            compute["/".join(computes)] = compute.get("/".join(computes), 0) + 1
    return {"layer_precisions": dict(sorted(every.items())), "compute_layer_precisions": dict(sorted(compute.items())),
            "engine_precision": engine_precision_word(compute, requested)}


def engine_precision_word(compute: Mapping[str, int], requested: str) -> str:
    """The one word of ``engine_precision`` from the compute layers' histogram."""
    if not compute:
        return "unknown"
    if len(compute) > 1 or "/" in next(iter(compute)):
        return "mixed"
    (only,) = compute
    return "tf32" if only == "fp32" and requested == "tf32" else only


def precision_warning(requested: str, details: Mapping[str, Any]) -> str | None:
    """A warning when the engine does not compute in the precision asked for (None: it does,
    or the inspector did not say)."""
    word = details.get("engine_precision")
    compute = details.get("compute_layer_precisions") or {}
    if word in (None, "unknown", requested):
        return None
    counts = ", ".join(f"{k} {v}" for k, v in compute.items())
    if requested == "fp16" and word == "mixed":
        if any("fp16" in key.split("/") for key in compute):
            return None  # what FP16 builds are: TensorRT keeps a layer in FP32 where that is faster or needed
    return (f"the TensorRT engine computes in {word}, not the {requested} asked for (compute layers: {counts}); "
            f"details.compute_layer_precisions in the manifest says which")


class PlanExecution:
    """A deserialized plan and one execution context, with CUDA tensors bound by name: what
    validation runs (numpy in and out) and what the GPU check times (buffers kept on the GPU)."""

    def __init__(self, plan: bytes) -> None:
        import tensorrt as trt

        self._trt = trt
        self.engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(plan)
        if self.engine is None:
            raise ExportError("TensorRT could not load the plan (built with another TensorRT version or GPU?)")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.input_names = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.output_names = [n for n in names if n not in self.input_names]

    def outputs_for(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Set the input shapes from ``inputs`` and allocate the outputs (the engine's dtypes) on the GPU."""
        import torch

        for name, tensor in inputs.items():
            self.context.set_input_shape(name, tuple(tensor.shape))
        outputs = {}
        for name in self.output_names:
            dtype = torch.from_numpy(np.zeros(0, dtype=self._trt.nptype(self.engine.get_tensor_dtype(name)))).dtype
            outputs[name] = torch.empty(tuple(self.context.get_tensor_shape(name)), dtype=dtype, device="cuda")
        return outputs

    def execute(self, tensors: Mapping[str, Any]) -> None:
        """Run on the current CUDA stream with ``tensors`` (inputs and outputs, by name) bound; asynchronous."""
        import torch

        for name in self.input_names:
            self.context.set_input_shape(name, tuple(tensors[name].shape))
        for name, tensor in tensors.items():
            self.context.set_tensor_address(name, tensor.data_ptr())
        if not self.context.execute_async_v3(torch.cuda.current_stream().cuda_stream):
            raise ExportError("TensorRT execution failed")


class TensorRTPlanFormat(GpuFormat):
    name = "tensorrt"
    description = "TensorRT plan (GPU only) for Triton's tensorrt_plan platform"
    platform = "tensorrt_plan"
    model_file = "model.plan"
    engine = "TensorRT plan"

    def check_available(self, release: Release) -> None:
        require_gpu(self.name, ("tensorrt",))
        self.check_release(release)

    def check_release(self, release: Release) -> None:
        check_release_tensorrt(release)

    def export(self, ctx: ExportContext) -> ExportedModel:
        import tensorrt as trt

        path = self.work_path(ctx)
        built = build_plan(ctx, exported_onnx(ctx), path)
        warning = precision_warning(ctx.options.precision, built)
        if warning:
            ctx.reporter.warn(warning)
        return self.exported(ctx, {self.model_file: path}, {
            "tensorrt": trt.__version__, "precision": ctx.options.precision,
            "hardware_compatibility": hardware_compatibility(ctx.options), **built, **gpu_details(),
        })

    def runner(self, exported: ExportedModel, ctx: ExportContext) -> Runner:
        import torch

        execution = PlanExecution(exported.files[self.model_file].read_bytes())

        def run(inputs):
            device = {t.name: torch.from_numpy(np.ascontiguousarray(inputs[t.name])).cuda() for t in exported.inputs}
            outputs = execution.outputs_for(device)
            execution.execute({**device, **outputs})
            torch.cuda.current_stream().synchronize()
            return {t.name: outputs[t.name].float().cpu().numpy() for t in exported.outputs}

        return run

    def versions(self) -> dict[str, str]:
        return {"tensorrt": installed_tensorrt() or "unknown"}


def check_release_tensorrt(release: Release) -> None:
    """Refuse before any work when the installed TensorRT is not the release's: the plan
    would never load in that release's Triton."""
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
