"""config.pbtxt is built and read through Triton's protobuf schema."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from mme.errors import UsageError
from packager.formats import FORMATS
from packager.formats.base import ExportedModel, positional_names
from packager.spec import TensorSpec
from packager.triton_config import ModelConfigError, build_config, read_config, to_text, write_config
from packager.triton_options import TritonOptions

TEXT_INPUTS = (TensorSpec("input_ids", "int64", ("sequence",)), TensorSpec("attention_mask", "int64", ("sequence",)))
TEXT_OUTPUTS = (TensorSpec("last_hidden_state", "float32", ("sequence", 768)),)


def exported(fmt: str) -> ExportedModel:
    if fmt in ("torchscript", "torch-tensorrt"):
        return ExportedModel(fmt, {}, positional_names(TEXT_INPUTS, "INPUT"), positional_names(TEXT_OUTPUTS, "OUTPUT"))
    return ExportedModel(fmt, {}, TEXT_INPUTS, TEXT_OUTPUTS)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_round_trip(tmp_path, fmt):
    options = TritonOptions(max_batch_size=32, preferred_batch_sizes=(8, 16), max_queue_delay_us=500,
                            instance_count=2, warmup=True)
    config = build_config(FORMATS[fmt], exported(fmt), options, {"sequence": 128}, {"k": "v"})
    write_config(config, tmp_path / "config.pbtxt")
    parsed = read_config(tmp_path / "config.pbtxt")
    assert parsed == config
    assert text_format.Parse(to_text(config), mc.ModelConfig()) == config
    assert list(parsed.input[0].dims) == [-1]
    assert list(parsed.output[0].dims) == [-1, 768]
    assert parsed.input[0].data_type == mc.TYPE_INT64
    assert list(parsed.dynamic_batching.preferred_batch_size) == [8, 16]
    assert parsed.dynamic_batching.max_queue_delay_microseconds == 500
    assert parsed.instance_group[0].count == 2
    warm = parsed.model_warmup[0]
    assert warm.batch_size == 1
    assert list(warm.inputs["input_ids" if fmt not in ("torchscript", "torch-tensorrt") else "INPUT__0"].dims) == [128]
    assert all(i.zero_data for i in warm.inputs.values()), "token ids are warmed with zeros, not random ids"
    assert parsed.parameters["k"].string_value == "v"
    expected_kind = mc.ModelInstanceGroup.KIND_CPU if fmt == "cpu-local" else mc.ModelInstanceGroup.KIND_GPU
    assert parsed.instance_group[0].kind == expected_kind
    if fmt == "cpu-local":
        assert parsed.backend == "python" and not parsed.platform
    else:
        assert parsed.platform == FORMATS[fmt].platform


def test_no_dynamic_batching_and_kind_override():
    options = TritonOptions(dynamic_batching=False, instance_kind="KIND_CPU")
    config = build_config(FORMATS["onnx"], exported("onnx"), options, {"sequence": 16})
    assert not config.HasField("dynamic_batching")
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU


@pytest.mark.parametrize(
    "options, message",
    [
        (TritonOptions(max_batch_size=0), "--max-batch-size"),
        (TritonOptions(instance_count=0), "--instance-count"),
        (TritonOptions(max_batch_size=4, preferred_batch_sizes=(8,)), "--preferred-batch-sizes"),
    ],
)
def test_bad_options(options, message):
    with pytest.raises(UsageError, match=message):
        options.check()


@pytest.mark.parametrize("text", ["platform: [not valid\n", "no_such_field: 1\n"])
def test_a_bad_config_is_one_typed_error_naming_the_file(tmp_path, text):
    path = tmp_path / "config.pbtxt"
    path.write_text(text)
    with pytest.raises(ModelConfigError, match=r"^m/config\.pbtxt is not a valid Triton model config \(.+\); fix it") as caught:
        read_config(path, "m/config.pbtxt")
    assert caught.value.where == "m/config.pbtxt" and caught.value.reason
    path.write_bytes(b"platform: \"\xff\"\n")
    with pytest.raises(ModelConfigError, match=str(path)):
        read_config(path)


def test_each_format_carries_its_own_config_parameters():
    from packager.formats.base import ExportOptions

    options = ExportOptions(cpu_threads=3)
    assert FORMATS["cpu-local"].triton_parameters(options) == {"intra_op_num_threads": "3", "onnx_file": "model.onnx"}
    assert all(not FORMATS[name].triton_parameters(options) for name in FORMATS if name != "cpu-local")
