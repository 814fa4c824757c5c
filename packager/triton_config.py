"""config.pbtxt built, written and read through Triton's own protobuf schema
(:mod:`packager.model_config`) and ``text_format``, never from string templates.
This module is the one door for config.pbtxt I/O: :func:`to_text` / :func:`write_config`
out, :func:`parse_config` / :func:`read_config` in (a bad file is a :class:`ModelConfigError`).

The ``name`` field is left out on purpose: Triton then takes the model's name from its
directory, and SageMaker's MME loads each copy under its target-model name
(``resnet50-v3.tar.gz``), which a name baked into the config would contradict.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from google.protobuf import text_format
from google.protobuf.message import DecodeError

from mme.errors import MmeError
from mme.fsutil import write_bytes_atomic
from packager.formats.base import ExportedModel, ModelFormat
from packager.triton_options import TritonOptions

if TYPE_CHECKING:  # the generated module's types; at run time the schema packager.model_config chose
    from tritonclient.grpc import model_config_pb2 as mc
else:
    from packager.model_config import mc


def build_config(fmt: ModelFormat, exported: ExportedModel, options: TritonOptions, axes: dict[str, int],
                 parameters: dict[str, str] | None = None) -> mc.ModelConfig:
    config = mc.ModelConfig(max_batch_size=options.max_batch_size)
    if fmt.platform:
        config.platform = fmt.platform
    if fmt.backend:
        config.backend = fmt.backend
    for tensor in exported.inputs:
        entry = config.input.add(name=tensor.name, data_type=mc.DataType.Value(tensor.triton_dtype))
        entry.dims.extend(tensor.triton_dims)
    for tensor in exported.outputs:
        entry = config.output.add(name=tensor.name, data_type=mc.DataType.Value(tensor.triton_dtype))
        entry.dims.extend(tensor.triton_dims)
    if options.dynamic_batching:
        config.dynamic_batching.preferred_batch_size.extend(options.preferred_batch_sizes)
        config.dynamic_batching.max_queue_delay_microseconds = options.max_queue_delay_us
    kind = options.instance_kind or fmt.instance_kind
    config.instance_group.add(count=options.instance_count, kind=mc.ModelInstanceGroup.Kind.Value(kind))
    if options.warmup:
        warm = config.model_warmup.add(name="warmup_batch_1", batch_size=1)
        for tensor in exported.inputs:
            data = warm.inputs[tensor.name]
            data.data_type = mc.DataType.Value(tensor.triton_dtype)
            data.dims.extend(tensor.concrete_shape(1, axes)[1:])
            if tensor.dtype.startswith("float"):
                data.random_data = True
            else:
                data.zero_data = True  # token ids: random values could fall outside the vocabulary
    for key, value in (parameters or {}).items():
        config.parameters[key].string_value = value
    return config


class ModelConfigError(MmeError):
    """A config.pbtxt Triton's schema does not parse; ``where`` names it, ``reason`` says why."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where} is not a valid Triton model config ({reason}); fix it and re-package")
        self.where = where
        self.reason = reason


def to_text(config: mc.ModelConfig) -> str:
    return text_format.MessageToString(config)


def write_config(config: mc.ModelConfig, path: Path) -> None:
    write_bytes_atomic(path, to_text(config).encode("utf-8"))


def parse_config(text: str, where: str = "config.pbtxt") -> mc.ModelConfig:
    """A config.pbtxt's text as a ModelConfig; raises :class:`ModelConfigError` naming ``where``."""
    try:
        return text_format.Parse(text, mc.ModelConfig())
    except (text_format.ParseError, DecodeError) as exc:
        raise ModelConfigError(where, str(exc)) from None


def read_config(path: Path, label: str = "") -> mc.ModelConfig:
    """Read a config.pbtxt (UTF-8); ``label`` names it in errors (default: its path)."""
    where = label or str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ModelConfigError(where, str(exc)) from None
    return parse_config(text, where)
