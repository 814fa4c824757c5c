"""SageMaker instance types and their GPUs (``mme/instances.toml``): the single-GPU types
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
    text = path.read_text() if path else resources.files("mme").joinpath("instances.toml").read_text()
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path or 'mme/instances.toml'}: not valid TOML ({exc}); see mme/instances.toml") from None


def load_instances(path: Path | None = None) -> dict[str, dict]:
    """The ``[instances]`` table (instance type -> gpu, gpu_memory_gib, gpu_memory_usable_mib,
    compute_capability), each row's memory checked."""
    table = _table(path)
    if "instances" not in table:
        raise UsageError(f"{path}: not an instance table (no [instances]); see mme/instances.toml for the format")
    where = path or "mme/instances.toml"
    for name, row in table["instances"].items():
        if not _positive(row.get("gpu_memory_gib") if isinstance(row, dict) else None):
            raise UsageError(f"{where}: [instances.\"{name}\"] needs gpu_memory_gib, the GPU's nominal memory as a "
                             "positive number (e.g. gpu_memory_gib = 24); see mme/instances.toml")
        if "gpu_memory_usable_mib" in row and not _positive(row["gpu_memory_usable_mib"]):
            raise UsageError(f"{where}: [instances.\"{name}\"] gpu_memory_usable_mib must be a positive number of MiB "
                             "(the total nvidia-smi shows on that GPU, e.g. 23028 for an A10G), or left out")
    return table["instances"]


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


NOMINAL = "nominal"  # an instance row's memory as its gpu_memory_gib (no usable figure given)
USABLE = "usable"  # as its gpu_memory_usable_mib: the total the driver reports


def gpu_memory(row: dict) -> tuple[int, str]:
    """(bytes, basis) of an ``[instances]`` row: the usable total the driver reports
    (``gpu_memory_usable_mib``, basis USABLE) where the row has it, else the nominal size
    (``gpu_memory_gib``, basis NOMINAL), which overstates what copies can fill."""
    if "gpu_memory_usable_mib" in row:
        return int(row["gpu_memory_usable_mib"] * 2**20), USABLE
    return int(row["gpu_memory_gib"] * 2**30), NOMINAL


def family_of(instance_type: str) -> str:
    """``ml.g5.2xlarge`` -> ``ml.g5``."""
    return instance_type.rsplit(".", 1)[0] if instance_type.count(".") >= 2 else instance_type


def instance_gpu(instance_type: str) -> InstanceGpu:
    """The GPU of an instance type, from its family; CPU and unknown families give no
    compute capability (nothing to check a plan against)."""
    table = _table()
    row = table.get("instances", {}).get(instance_type) or table.get("families", {}).get(family_of(instance_type))
    if row is None:
        return InstanceGpu("no GPU known for this family; add it to mme/instances.toml", None)
    return InstanceGpu(str(row["gpu"]), str(row["compute_capability"]))


def memory_of_gpu(instance_type: str) -> tuple[int, str] | None:
    """(bytes, basis) of one GPU of ``instance_type``: its own ``[instances]`` row, else the row
    of another type with the same GPU (every type of a family has the same GPU, e.g. ml.g5.xlarge
    to ml.g5.48xlarge an A10G each); None for CPU types and GPUs the table lacks."""
    rows = load_instances()
    row = rows.get(instance_type)
    if row is None:
        gpu = instance_gpu(instance_type)
        if gpu.compute_capability is None:
            return None
        row = next((r for r in rows.values() if r.get("gpu") == gpu.gpu), None)
        if row is None:
            return None
    return gpu_memory(row)
