"""What the GPU-only formats share: the availability check and the TensorRT profile shapes."""

from __future__ import annotations

import importlib.util
from typing import Iterator

from mme.errors import GpuRequiredError
from packager.spec import IOSpec, TensorSpec


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
        reason = f"the {', '.join(missing)} package is not installed (pip install -e '.[gpu]')"
    if reason is not None:
        raise GpuRequiredError(
            f"format '{format_name}' needs an NVIDIA GPU and TensorRT ({reason}); "
            "run it on a GPU host, or in the builder image (make docker-package)"
        )


def profile_shapes(spec: IOSpec, max_batch: int) -> Iterator[tuple[TensorSpec, tuple, tuple, tuple]]:
    """(tensor, min, opt, max) per input: batch 1..max_batch, dynamic axes 1..their max,
    optimised for half the max batch at the full axis length."""
    axes_max = spec.axes
    axes_min = {name: 1 for name in axes_max}
    for tensor in spec.inputs:
        yield (
            tensor,
            tensor.concrete_shape(1, axes_min),
            tensor.concrete_shape(max(1, max_batch // 2), axes_max),
            tensor.concrete_shape(max_batch, axes_max),
        )


def gpu_details() -> dict[str, str]:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return {"gpu": torch.cuda.get_device_name(), "compute_capability": f"{major}.{minor}"}
