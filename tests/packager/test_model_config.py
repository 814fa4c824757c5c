"""packager.model_config: tritonclient's generated schema where it imports, else the same schema
built from model_config.desc, which must stay tritonclient's byte for byte; configs written by
either read back the same through the other."""

from __future__ import annotations

import subprocess
import sys

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from packager.model_config import DESCRIPTOR_FILE, SCHEMA_SOURCE, mc, schema_from_descriptor
from tests.docker.conftest import REPO


def test_the_kept_descriptor_is_tritonclients_own():
    assert DESCRIPTOR_FILE.read_bytes() == model_config_pb2.DESCRIPTOR.serialized_pb, (
        "tritonclient's model_config.proto changed: run python -m packager.model_config --refresh")


def test_with_tritonclient_grpc_importable_its_module_is_used():
    assert mc is model_config_pb2 and SCHEMA_SOURCE == "tritonclient.grpc.model_config_pb2"


def test_the_fallback_schema_writes_what_the_generated_one_reads_and_back():
    fallback = schema_from_descriptor(DESCRIPTOR_FILE.read_bytes())
    config = fallback.ModelConfig(max_batch_size=8, platform="onnxruntime_onnx")
    tensor = config.input.add(name="input_ids", data_type=fallback.DataType.Value("TYPE_INT64"))
    tensor.dims.extend([-1])
    config.instance_group.add(kind=fallback.ModelInstanceGroup.Kind.Value("KIND_GPU"), count=1)
    config.dynamic_batching.max_queue_delay_microseconds = 100
    config.parameters["device"].string_value = "cuda"
    text = text_format.MessageToString(config)
    generated = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert generated.input[0].data_type == model_config_pb2.TYPE_INT64 == fallback.TYPE_INT64
    assert generated.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    assert text_format.Parse(text_format.MessageToString(generated), fallback.ModelConfig()) == config


def test_without_grpc_the_fallback_is_chosen_and_config_pbtxt_still_round_trips(tmp_path):
    """A host whose gRPC is missing (or too old: tritonclient.grpc raises either way)."""
    code = (
        "import sys; sys.modules['grpc'] = None\n"  # import grpc -> ImportError, as on such a host
        "from packager.model_config import SCHEMA_SOURCE, mc\n"
        "from packager.triton_config import parse_config, to_text\n"
        "c = mc.ModelConfig(max_batch_size=4, backend='python')\n"
        "c.input.add(name='TEXT', data_type=mc.TYPE_STRING, dims=[1])\n"
        "assert parse_config(to_text(c)) == c\n"
        "print(SCHEMA_SOURCE)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("model_config.desc (tritonclient.grpc:")
