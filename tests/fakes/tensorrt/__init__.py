"""A stand-in for the TensorRT Python bindings, for CPU hosts: the names the packager and the
remote-compile entry script use, with TensorRT's contract where it matters to them.

* ``__version__`` from ``$FAKE_TENSORRT_VERSION`` (default 10.13.3.9). On 11.x, as in
  TensorRT 11, ``BuilderFlag`` has no FP16 (nor BF16/INT8) member: networks are strongly typed.
* ``BuilderFlag.TF32`` is set in a new builder config (on by default in TensorRT 10 and 11).
* Builder configs record every flag set and cleared; ``build_serialized_network`` returns
  bytes describing the config, and appends it as JSON to ``$FAKE_TENSORRT_LOG`` if set.

Nothing here runs a network: it checks what the callers ask TensorRT for.
"""

from __future__ import annotations

import enum
import json
import os

__version__ = os.environ.get("FAKE_TENSORRT_VERSION", "10.13.3.9")
_MAJOR = int(__version__.split(".")[0])


class Logger:
    WARNING = 2
    INFO = 3

    def __init__(self, severity: int = 2) -> None:
        self.severity = severity


_FLAGS = ["TF32", "REFIT", "STRIP_PLAN", "VERSION_COMPATIBLE"]
if _MAJOR < 11:
    _FLAGS += ["FP16", "BF16", "INT8", "OBEY_PRECISION_CONSTRAINTS", "PREFER_PRECISION_CONSTRAINTS"]
BuilderFlag = enum.Enum("BuilderFlag", _FLAGS)
NetworkDefinitionCreationFlag = enum.Enum("NetworkDefinitionCreationFlag", ["STRONGLY_TYPED"])


class MemoryPoolType(enum.Enum):
    WORKSPACE = 0


class HardwareCompatibilityLevel(enum.Enum):
    NONE = 0
    AMPERE_PLUS = 1


class ProfilingVerbosity(enum.Enum):
    LAYER_NAMES_ONLY = 0
    NONE = 1
    DETAILED = 2


class DataType(enum.Enum):
    FLOAT = 0
    HALF = 1


class _Tensor:
    def __init__(self, name: str) -> None:
        self.name = name
        self.dtype = DataType.FLOAT


class _Network:
    def __init__(self, flags: int) -> None:
        self.flags = flags
        self._inputs: list[_Tensor] = []
        self._outputs: list[_Tensor] = []

    @property
    def num_inputs(self) -> int:
        return len(self._inputs)

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    def get_input(self, index: int) -> _Tensor:
        return self._inputs[index]

    def get_output(self, index: int) -> _Tensor:
        return self._outputs[index]


class OnnxParser:
    num_errors = 0

    def __init__(self, network: _Network, logger: Logger) -> None:
        self.network = network

    def parse_from_file(self, path: str) -> bool:
        self.network.parsed = str(path)
        self.network._inputs = [_Tensor("x")]
        self.network._outputs = [_Tensor("y")]
        return True

    def get_error(self, index: int) -> str:
        return ""


class _Profile:
    def __init__(self) -> None:
        self.shapes: dict[str, list] = {}

    def set_shape(self, name, lo, opt, hi) -> None:
        self.shapes[name] = [list(lo), list(opt), list(hi)]


class IBuilderConfig:
    def __init__(self) -> None:
        self.flags = {BuilderFlag.TF32}
        self.cleared: list[str] = []
        self.set: list[str] = []
        self.hardware_compatibility_level = HardwareCompatibilityLevel.NONE
        self.profiling_verbosity = ProfilingVerbosity.LAYER_NAMES_ONLY
        self.profiles: list[_Profile] = []
        self.pools: dict = {}

    def set_flag(self, flag) -> None:
        self.flags.add(flag)
        self.set.append(flag.name)

    def clear_flag(self, flag) -> None:
        self.flags.discard(flag)
        self.cleared.append(flag.name)

    def get_flag(self, flag) -> bool:
        return flag in self.flags

    def set_memory_pool_limit(self, pool, size: int) -> None:
        self.pools[pool.name] = size

    def add_optimization_profile(self, profile: _Profile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1

    def describe(self) -> dict:
        return {"version": __version__, "flags": sorted(f.name for f in self.flags), "set": self.set,
                "cleared": self.cleared, "hardware_compatibility_level": self.hardware_compatibility_level.name,
                "profiling_verbosity": self.profiling_verbosity.name,
                "profiles": [p.shapes for p in self.profiles], "pools": self.pools}


class Builder:
    def __init__(self, logger: Logger) -> None:
        self.logger = logger

    def create_network(self, flags: int = 0) -> _Network:
        return _Network(flags)

    def create_builder_config(self) -> IBuilderConfig:
        return IBuilderConfig()

    def create_optimization_profile(self) -> _Profile:
        return _Profile()

    def build_serialized_network(self, network: _Network, config: IBuilderConfig) -> bytes:
        record = {**config.describe(), "network_flags": network.flags, "onnx": getattr(network, "parsed", None)}
        log = os.environ.get("FAKE_TENSORRT_LOG")
        if log:
            with open(log, "a") as fh:
                fh.write(json.dumps(record) + "\n")
        return json.dumps(record).encode()
