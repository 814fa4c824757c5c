"""Triton's model configuration schema (``model_config.proto``) as protobuf classes: ``mc``.

The library made for it comes first: tritonclient's generated ``model_config_pb2``. Importing
it runs ``tritonclient.grpc``'s package, whose generated gRPC code refuses grpcio older than
the one it was generated with (1.81.1 for tritonclient 2.73) and whose protobuf code refuses an
older protobuf runtime (6.33.5). A host with an older gRPC or protobuf (a bare GPU host's
image, say) still reads and writes config.pbtxt: the same schema is then built at run time,
in a private descriptor pool, from the serialized descriptor kept beside this module
(``model_config.desc``, tritonclient's own, byte for byte: a test compares them, and
``python -m packager.model_config --refresh`` rewrites it after a tritonclient upgrade).

Every reader and writer of config.pbtxt takes ``mc`` from here. ``SCHEMA_SOURCE`` says which
one this process uses (the GPU check's preflight prints it).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal import enum_type_wrapper

DESCRIPTOR_FILE = Path(__file__).with_name("model_config.desc")


def schema_from_descriptor(data: bytes) -> Any:
    """A module-like namespace of the schema's message classes, enums and enum values, built
    from a serialized ``FileDescriptorProto`` in a pool of its own (no clash with a generated
    module of the same file in the default pool)."""
    pool = descriptor_pool.DescriptorPool()
    file = pool.Add(descriptor_pb2.FileDescriptorProto.FromString(data))
    get_class = getattr(message_factory, "GetMessageClass", None)  # protobuf >= 4.21
    if get_class is None:  # older runtimes
        get_class = message_factory.MessageFactory(pool).GetPrototype
    names: dict[str, Any] = {"DESCRIPTOR": file}
    for name, message in file.message_types_by_name.items():
        names[name] = get_class(message)
    for name, enum in file.enum_types_by_name.items():
        names[name] = enum_type_wrapper.EnumTypeWrapper(enum)
        names.update({value.name: value.number for value in enum.values})
    return SimpleNamespace(**names)


def _load() -> tuple[Any, str]:
    try:
        from tritonclient.grpc import model_config_pb2

        return model_config_pb2, "tritonclient.grpc.model_config_pb2"
    except Exception as exc:  # noqa: BLE001 - ImportError, gRPC's RuntimeError, protobuf's VersionError alike
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        return schema_from_descriptor(DESCRIPTOR_FILE.read_bytes()), f"{DESCRIPTOR_FILE.name} (tritonclient.grpc: {reason})"


mc, SCHEMA_SOURCE = _load()


def refresh(path: Path = DESCRIPTOR_FILE) -> bytes:
    """Write tritonclient's serialized schema to ``path`` (after a tritonclient upgrade)."""
    from tritonclient.grpc import model_config_pb2

    data = model_config_pb2.DESCRIPTOR.serialized_pb
    path.write_bytes(data)
    return data


if __name__ == "__main__":
    if sys.argv[1:] == ["--refresh"]:
        print(f"wrote {DESCRIPTOR_FILE} ({len(refresh())} bytes)")
    else:
        print(f"model_config schema from {SCHEMA_SOURCE}; --refresh rewrites {DESCRIPTOR_FILE.name}")
