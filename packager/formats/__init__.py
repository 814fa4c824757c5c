"""Export formats. Each module defines one format; ``FORMATS`` is the table of them."""

from __future__ import annotations

import difflib

from mme.errors import UsageError
from packager.formats.base import ExportContext, ExportedModel, ExportOptions, ModelFormat
from packager.formats.cpu_local import CpuLocalFormat
from packager.formats.onnx_format import OnnxFormat
from packager.formats.tensorrt_plan import TensorRTPlanFormat
from packager.formats.torch_tensorrt import TorchTensorRTFormat
from packager.formats.torchscript import TorchScriptFormat

FORMATS: dict[str, ModelFormat] = {
    f.name: f
    for f in (TorchScriptFormat(), OnnxFormat(), CpuLocalFormat(), TensorRTPlanFormat(), TorchTensorRTFormat())
}


def format_of(name: str | None) -> ModelFormat | None:
    """The format called ``name`` (a manifest's, an object's metadata), None for no name or one this
    toolkit does not know: what a format is and holds is the format's to say, not its name's."""
    return FORMATS.get(name or "")


def parse_formats(text: str) -> tuple[str, ...]:
    """``"onnx,tensorrt"`` -> ("onnx", "tensorrt"); ``all`` means every format."""
    if text.strip() == "all":
        return tuple(FORMATS)
    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    if not names:
        raise UsageError(f"--formats is empty; choose from {', '.join(FORMATS)} (or 'all')")
    for name in names:
        if name not in FORMATS:

            close = difflib.get_close_matches(name.lower().replace("_", "-"), FORMATS, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UsageError(f"unknown format {name!r}; {hint}choose from {', '.join(FORMATS)} (or 'all')")
    return names


__all__ = [
    "FORMATS", "format_of", "parse_formats",
    "ExportContext", "ExportedModel", "ExportOptions", "ModelFormat",
]
