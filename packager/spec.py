"""Declarative input/output specs: one per model family, driving dummy inputs, dynamic
axes, Triton config, TensorRT profiles, sample requests and validation.

Shapes exclude the batch dimension, which is always dynamic. A string in a shape names a
dynamic axis (``"sequence"``); its maximum is given in :attr:`IOSpec.axis_max`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping

if TYPE_CHECKING:  # annotations only: the command line reads the format table without loading numpy
    import numpy as np

# numpy dtype name -> (Triton config data type, KServe v2 datatype)
_DTYPES = {
    "float32": ("TYPE_FP32", "FP32"),
    "float16": ("TYPE_FP16", "FP16"),
    "int64": ("TYPE_INT64", "INT64"),
    "int32": ("TYPE_INT32", "INT32"),
    "bool": ("TYPE_BOOL", "BOOL"),
    "bytes": ("TYPE_STRING", "BYTES"),  # text: numpy object arrays of UTF-8 bytes
}

BATCH_AXIS = "batch"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int | str, ...]

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"unsupported dtype {self.dtype!r} for tensor {self.name!r}")

    @property
    def triton_dtype(self) -> str:
        return _DTYPES[self.dtype][0]

    @property
    def kserve_datatype(self) -> str:
        return _DTYPES[self.dtype][1]

    @property
    def triton_dims(self) -> tuple[int, ...]:
        """Dims as Triton writes them: -1 for every dynamic axis."""
        return tuple(d if isinstance(d, int) else -1 for d in self.shape)

    def concrete_shape(self, batch: int, axes: Mapping[str, int]) -> tuple[int, ...]:
        return (batch,) + tuple(d if isinstance(d, int) else axes[d] for d in self.shape)

    def dynamic_axes(self) -> dict[int, str]:
        """Index -> axis name for every dynamic axis, batch included (ONNX export form)."""
        axes = {0: BATCH_AXIS}
        for i, d in enumerate(self.shape, start=1):
            if isinstance(d, str):
                axes[i] = d
        return axes

    def renamed(self, name: str) -> "TensorSpec":
        return TensorSpec(name=name, dtype=self.dtype, shape=self.shape)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "datatype": self.kserve_datatype,
            "dims": list(self.triton_dims),
            "axes": [d if isinstance(d, str) else None for d in self.shape],
        }


InputMaker = Callable[[int, Mapping[str, int], int], dict[str, "np.ndarray"]]


@dataclass(frozen=True)
class IOSpec:
    """What a packaged model takes and returns, plus how to check an export of it."""

    task: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    axis_max: tuple[tuple[str, int], ...] = ()
    # An output passes validation where |export - PyTorch| <= atol + rtol x |PyTorch| elementwise
    # (numpy.allclose). atol bounds the error near zero; rtol lets it grow with the output's
    # magnitude, as fp32 rounding does: pretrained classifiers (make docker-package packages
    # pretrained weights) give logits of order 10, where atol 1e-4 alone is 1e-5 relative. fp32 keeps
    # about 7 significant digits (unit roundoff 6e-8) and each output accumulates thousands of
    # roundings, summed in other orders on another device (cuDNN/cuBLAS kernels, ONNX Runtime's CUDA
    # provider, Winograd convolutions). rtol 1e-3 leaves that room while a wrong export (other
    # weights, a wrong layer) still fails: it is off by the output's own size, 100% and more.
    default_atol: float = 1e-4
    default_rtol: float = 1e-3

    @property
    def axes(self) -> dict[str, int]:
        return dict(self.axis_max)

    def validation_cases(self, max_batch: int) -> tuple[tuple[int, dict[str, int]], ...]:
        """Batch sizes and axis lengths that validation runs: a batch above one at the full
        axis length, and batch one at a shorter length, so dynamic axes are exercised."""
        full = self.axes
        short = {name: max(1, min(size, size // 4 + 1)) for name, size in full.items()}
        big = min(max_batch, 2)
        cases = [(big, full)]
        if big != 1 or short != full:
            cases.append((1, short))
        return tuple(cases)
