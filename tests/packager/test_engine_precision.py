"""The precision a TensorRT plan runs in, read from TensorRT's engine inspector
(``IEngineInspector.get_engine_information(LayerInformationFormat.JSON)``, detailed profiling
verbosity): the per-layer histograms and the one word the manifest records, and how the
manifest reads them, old manifests included. TensorRT is not needed: the inspector's JSON is
built here in the shape TensorRT writes it."""

from __future__ import annotations

import json

import pytest

from packager.formats.tensorrt_plan import engine_information, engine_layers, precision_warning, tensor_datatype
from packager.manifest_records import BuildDetails


def tensor(name: str, datatype: str, key: str = "Format/Datatype") -> dict:
    return {"Name": name, "Location": "Device", "Dimensions": [8, 64, 56, 56], key: datatype}


def layer(name: str, layer_type: str, parameter_type: str, out: str, *, inp: str = "Row major linear FP32",
          key: str = "Format/Datatype") -> dict:
    """One entry of the inspector's "Layers", as TensorRT 10 writes it with DETAILED verbosity."""
    return {"Name": name, "LayerType": layer_type, "Inputs": [tensor(f"{name}_in", inp, key)],
            "Outputs": [tensor(f"{name}_out", out, key)], "ParameterType": parameter_type,
            "TacticValue": "0x0000000000000000", "StreamId": 0, "Metadata": ""}


def inspector(*layers: dict) -> str:
    return json.dumps({"Layers": list(layers), "Bindings": ["pixel_values", "logits"]})


FP16 = "Channel major FP16 format where channel % 8 == 0"
# A resnet-like FP16 engine: FP32 input and output (the model's I/O) reformatted at both ends,
# convolutions and a pointwise layer in FP16, a shape computation in Int32, a folded no-op.
FP16_ENGINE = (
    layer("Reformatting CopyNode for Input Tensor 0 to conv1", "Reformat", "Reformat", FP16),
    layer("conv1 + relu", "CaskConvolution", "Convolution", FP16, inp=FP16),
    layer("layer1.0.conv1", "CaskConvolution", "Convolution", FP16, inp=FP16),
    layer("layer1.0.add + relu", "PointWiseV2", "PointWise", "Row major linear FP16 format", inp=FP16),
    layer("global_pool", "CaskPooling", "Pooling", FP16, inp=FP16),
    layer("shape_of_pool", "Shape", "Shape", "Row major linear Int32", inp=FP16),
    layer("flatten", "NoOp", "NoOp", FP16, inp=FP16),
    layer("fc", "CaskGemmConvolution", "Convolution", "Row major linear FP16 format", inp=FP16),
    layer("Reformatting CopyNode for Output Tensor 0 to fc", "Reformat", "Reformat", "Row major linear FP32", inp=FP16),
)


def test_an_fp16_engine_is_fp16_when_every_compute_layer_is():
    details = engine_layers(inspector(*FP16_ENGINE), "fp16")
    assert details == {
        "layer_precisions": {"fp16": 7, "fp32": 1, "int32": 1},  # every layer, by its outputs
        "compute_layer_precisions": {"fp16": 5},  # less reformats, no-ops and integer layers
        "engine_precision": "fp16",
    }
    assert precision_warning("fp16", details) is None


def test_one_compute_layer_in_another_precision_makes_it_mixed_and_the_histogram_says_how_many():
    softmax = layer("softmax", "CaskSoftMax", "SoftMax", "Row major linear FP32", inp=FP16)
    details = engine_layers(inspector(*FP16_ENGINE, softmax), "fp16")
    assert details["compute_layer_precisions"] == {"fp16": 5, "fp32": 1}
    assert details["engine_precision"] == "mixed"  # a majority vote would have said fp16
    assert precision_warning("fp16", details) is None  # TensorRT keeps layers in FP32 in FP16 builds
    # Asked for FP32, a layer in FP16 is news.
    warning = precision_warning("fp32", details)
    assert warning is not None and warning.startswith("the TensorRT engine computes in mixed, not the fp32 asked for "
                                                      "(compute layers: fp16 5, fp32 1)")


def test_a_layer_with_outputs_of_two_float_types_counts_under_both():
    two = {**layer("split", "Myelin", "Myelin", "Half"), "Outputs": [tensor("a", "Half"), tensor("b", "Float")]}
    details = engine_layers(inspector(two), "fp16")
    assert details["layer_precisions"] == details["compute_layer_precisions"] == {"fp16/fp32": 1}
    assert details["engine_precision"] == "mixed"


def test_fp16_asked_for_but_every_layer_in_fp32_says_fp32_and_warns():
    fp32 = [layer(f"conv{i}", "CaskConvolution", "Convolution", "Row major linear FP32") for i in range(3)]
    details = engine_layers(inspector(*fp32), "fp16")
    assert details["engine_precision"] == "fp32" and details["compute_layer_precisions"] == {"fp32": 3}
    assert precision_warning("fp16", details) == (
        "the TensorRT engine computes in fp32, not the fp16 asked for (compute layers: fp32 3); "
        "details.compute_layer_precisions in the manifest says which")
    # TF32 stores FP32: the inspector cannot tell them apart, so the request names it.
    tf32 = engine_layers(inspector(*fp32), "tf32")
    assert tf32["engine_precision"] == "tf32" and precision_warning("tf32", tf32) is None
    assert precision_warning("fp32", engine_layers(inspector(*fp32), "fp32")) is None


def test_tensorrt_11_datatype_field_and_myelin_layers():
    layers = [layer("{ForeignNode[/encoder/...]}", "Myelin", "Myelin", "Half", key="DataType"),
              layer("output cast", "Cast", "Cast", "Float", key="DataType"),
              layer("argmax", "kgen", "TopK", "Int64", key="DataType")]
    details = engine_layers(inspector(*layers), "fp16")
    assert details["layer_precisions"] == {"fp16": 1, "fp32": 1, "int64": 1}
    assert details["compute_layer_precisions"] == {"fp16": 1} and details["engine_precision"] == "fp16"


@pytest.mark.parametrize(("text", "expected"), [
    ("Row major linear FP32", "fp32"), ("Channel major FP16 format where channel % 8 == 0", "fp16"),
    ("Row major linear BFloat16 format", "bf16"), ("Row major linear Int64 format", "int64"),
    ("Row major linear UInt8 format", "uint8"), ("Thirty-two wide channel vectorized row major Int8 format", "int8"),
    ("Row major linear FP8 format", "fp8"), ("Row major linear BOOL", "bool"), ("Half", "fp16"), ("Float", "fp32"),
    ("N/A due to dynamic shapes", None), ("Unknown format", None),
])
def test_tensor_datatypes_as_the_inspector_words_them(text, expected):
    assert tensor_datatype({"Format/Datatype": text}) == expected


def test_without_an_execution_context_the_inspector_gives_no_formats_and_the_word_is_unknown():
    """What the packager recorded before it set an execution context: an engine with a dynamic
    batch gives "N/A due to dynamic shapes" for every tensor. The word says so instead of
    repeating the precision asked for."""
    dynamic = [layer(f"conv{i}", "CaskConvolution", "Convolution", "N/A due to dynamic shapes") for i in range(4)]
    details = engine_layers(inspector(*dynamic), "fp16")
    assert details == {"layer_precisions": {"unknown": 4}, "compute_layer_precisions": {}, "engine_precision": "unknown"}
    assert precision_warning("fp16", details) is None
    # Built without DETAILED verbosity, layers are names only; not JSON at all: the same.
    assert engine_layers(json.dumps({"Layers": ["conv1", "fc"]}), "fp32")["engine_precision"] == "unknown"
    assert engine_layers("not json", "fp32") == {"layer_precisions": {}, "compute_layer_precisions": {},
                                                 "engine_precision": "unknown"}


class FakeContext:
    def __init__(self) -> None:
        self.shapes: dict[str, tuple] = {}

    def set_input_shape(self, name: str, shape: tuple) -> bool:
        self.shapes[name] = shape
        return True


class FakeInspector:
    execution_context = None

    def get_engine_information(self, fmt: str) -> str:
        assert fmt == "JSON"
        context = self.execution_context
        # As TensorRT: formats only once an execution context with every input shape is set.
        datatype = FP16 if context is not None and context.shapes.get("pixel_values") == (8, 3, 224, 224) \
            else "N/A due to dynamic shapes"
        return inspector(layer("conv1", "CaskConvolution", "Convolution", datatype))


class FakeEngine:
    def create_engine_inspector(self) -> FakeInspector:
        return FakeInspector()

    def create_execution_context(self) -> FakeContext:
        return FakeContext()


class FakeTrt:
    class LayerInformationFormat:
        JSON = "JSON"


def test_the_inspector_reads_the_engine_through_an_execution_context_at_the_profiles_shapes():
    text = engine_information(FakeTrt, FakeEngine(), {"pixel_values": [8, 3, 224, 224]})
    assert engine_layers(text, "fp16")["engine_precision"] == "fp16"


def test_the_manifest_reads_old_and_new_engine_precision_details():
    new = BuildDetails.from_dict({"precision": "fp16", **engine_layers(inspector(*FP16_ENGINE), "fp16")})
    assert new.engine_precision == "fp16"
    assert new.layer_precisions == {"fp16": 7, "fp32": 1, "int32": 1}
    assert new.compute_layer_precisions == {"fp16": 5}
    # Before compute_layer_precisions: a majority word (or the request), every layer "unknown".
    old = BuildDetails.from_dict({"precision": "fp16", "engine_precision": "fp16", "layer_precisions": {"unknown": 60}})
    assert old.engine_precision == "fp16" and old.layer_precisions == {"unknown": 60}
    assert old.compute_layer_precisions is None
    # Not a plan (or a hand-edited manifest): absent, or counts only.
    onnx = BuildDetails.from_dict({"opset": 18})
    assert onnx.engine_precision is None and onnx.layer_precisions is None and onnx.compute_layer_precisions is None
    odd = BuildDetails.from_dict({"layer_precisions": {"fp16": 3, "note": "x", "flag": True}})
    assert odd.layer_precisions == {"fp16": 3}
