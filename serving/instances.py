"""SageMaker instance types and their GPUs (``serving/instances.toml``): the single-GPU types
``mme capacity`` projects onto, and the GPU (compute capability) of every instance family,
which decides where a TensorRT plan can load."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from mme.errors import UsageError


@dataclass(frozen=True)
class InstanceGpu:
    gpu: str
    compute_capability: str | None  # None: a CPU instance type, or a family the table lacks

    def describe(self, instance_type: str) -> str:
        return f"{instance_type} ({self.gpu})"


def _table(path: Path | None = None) -> dict:
    text = path.read_text() if path else resources.files("serving").joinpath("instances.toml").read_text()
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path or 'serving/instances.toml'}: not valid TOML ({exc}); see serving/instances.toml") from None


def load_instances(path: Path | None = None) -> dict[str, dict]:
    """The ``[instances]`` table (instance type -> gpu, gpu_memory_gib, compute_capability)."""
    table = _table(path)
    if "instances" not in table:
        raise UsageError(f"{path}: not an instance table (no [instances]); see serving/instances.toml for the format")
    return table["instances"]


def family_of(instance_type: str) -> str:
    """``ml.g5.2xlarge`` -> ``ml.g5``."""
    return instance_type.rsplit(".", 1)[0] if instance_type.count(".") >= 2 else instance_type


def instance_gpu(instance_type: str) -> InstanceGpu:
    """The GPU of an instance type, from its family; CPU and unknown families give no
    compute capability (nothing to check a plan against)."""
    table = _table()
    row = table.get("instances", {}).get(instance_type) or table.get("families", {}).get(family_of(instance_type))
    if row is None:
        return InstanceGpu("no GPU known for this family; add it to serving/instances.toml", None)
    return InstanceGpu(str(row["gpu"]), str(row["compute_capability"]))
