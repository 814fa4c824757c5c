"""What every export format provides (:class:`ModelFormat`: its Triton settings, tolerance and
recorded versions live on the format, so the pipeline asks the format instead of branching
on its name), and the context an export runs in."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from mme.progress import Reporter
from mme.versions import Release
from packager.model import LoadedModel
from packager.spec import TensorSpec

if TYPE_CHECKING:  # annotations only: the command line reads the format table without loading numpy
    import numpy as np

Runner = Callable[[Mapping[str, "np.ndarray"]], dict[str, "np.ndarray"]]

KIND_GPU = "KIND_GPU"  # Triton's instance_group kind of a model served on the GPU
CPU, CUDA = "cpu", "cuda"  # where a validation ran, as the manifest records it


@dataclass(frozen=True)
class DeviceRunner:
    """A :data:`Runner` that says where it runs: ``device`` "cpu" or "cuda", and ``detail``
    (the GPU, the execution provider, TF32) for the manifest's validation record."""

    run: Runner
    device: str
    detail: str = ""

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run(inputs)


def validation_device(instance_kind: str, gpu_usable: bool) -> str:
    """Where an export is validated: on the GPU when it is served there (``instance_kind``
    KIND_GPU) and this host can run it there (``gpu_usable``), else on the CPU."""
    return CUDA if instance_kind == KIND_GPU and gpu_usable else CPU


@dataclass(frozen=True)
class ExportOptions:
    opset: int = 18
    precision: str = "fp32"  # fp32 | tf32 | fp16 (GPU formats; see packager.formats.gpu)
    cpu_threads: int = 2  # ONNX Runtime intra-op threads in the cpu-local model
    workspace_mib: int = 4096  # TensorRT builder workspace (mme compile's --workspace-mib too)
    hardware_compatible: bool = False  # engines for every Ampere-or-newer GPU, not only this one


@dataclass(frozen=True)
class ExportedModel:
    """One exported model: the files of its Triton version directory and its I/O as
    Triton sees it (names may differ from the spec: TorchScript uses INPUT__0...)."""

    format: str
    files: Mapping[str, Path]  # file name inside <model>/1/ -> path of the exported file
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)


@dataclass
class ExportContext:
    """Shared by all formats of one `mme package` run: intermediates are made once
    (the ONNX file feeds onnx, cpu-local and tensorrt; the TorchScript module feeds
    torchscript and torch-tensorrt)."""

    model: LoadedModel
    options: ExportOptions
    workdir: Path
    reporter: Reporter
    max_batch_size: int = 16  # the request's TritonOptions.max_batch_size (engine profiles, dynamic axes)
    cache: dict[str, Any] = field(default_factory=dict)
    instance_kind: str | None = None  # the request's --instance-kind (KIND_GPU / KIND_CPU); None: each format's own


class ModelFormat:
    """One export format. A format sets the class attributes and implements :meth:`export`
    and :meth:`runner`; the defaults are those of a CPU format served by a Triton platform."""

    name: str = ""
    description: str = ""
    requires_gpu: bool = False
    platform: str | None = None  # Triton platform (onnxruntime_onnx, ...) or None
    backend: str | None = None  # Triton backend (python) or None
    instance_kind: str = "KIND_GPU"  # KIND_GPU | KIND_CPU
    model_file: str = ""  # the model's file name inside <model>/1/
    libtorch_names: bool = False  # Triton's libtorch I/O naming (INPUT__0, OUTPUT__0) instead of the spec's
    # What the rest of the toolkit asks of a format, so no other module compares format names:
    runs_on_sagemaker_image: bool = True  # SageMaker's Triton image has the backend it needs
    onnx_model: bool = False  # its model is an ONNX file ONNX Runtime runs (mme bench --in-process)
    engine: str = ""  # the serialized TensorRT engine its files hold ("TensorRT plan"), "" for none
    torch_tensorrt_engine: bool = False  # the engine is Torch-TensorRT's: its runtime ABI must match the release's
    saved_by_torch: bool = False  # its files are saved by torch (TorchScript): the release's libtorch loads them

    def check_available(self, release: Release) -> None:
        """Raise GpuRequiredError (or MmeError) before any work if this format cannot be built
        here for ``release``."""
        self.check_release(release)

    def check_release(self, release: Release) -> None:
        """Raise MmeError if ``release`` cannot serve this format, wherever it is built (what
        ``mme package --catalogue --on sagemaker`` checks before the GPU host is there)."""
        return None

    def export(self, ctx: ExportContext) -> ExportedModel:
        raise NotImplementedError

    def runner(self, exported: ExportedModel, ctx: ExportContext) -> Runner:
        raise NotImplementedError

    def versions(self) -> dict[str, str]:
        """Versions of the installed tools this format builds with."""
        return {}

    def recorded_versions(self, exported: ExportedModel) -> dict[str, str]:
        """The tool versions the manifest records for ``exported``."""
        return self.versions()

    def triton_parameters(self, options: ExportOptions) -> dict[str, str]:
        """``parameters`` of its config.pbtxt."""
        return {}

    def default_atol(self, spec_atol: float, precision: str) -> float:
        """The absolute validation tolerance when --atol is not given: the family's (``spec_atol``)."""
        return spec_atol

    def default_rtol(self, spec_rtol: float, precision: str) -> float:
        """The relative validation tolerance when --rtol is not given: the family's (``spec_rtol``)."""
        return spec_rtol

    def served_instance_kind(self, ctx: ExportContext) -> str:
        """The Triton instance kind the artifact will be served with (the request's, else this format's)."""
        return ctx.instance_kind or self.instance_kind

    def validation_device(self, run: Runner) -> tuple[str, str]:
        """(device, detail) of a runner made by :meth:`runner`: what a :class:`DeviceRunner`
        says, else the GPU for a GPU-only format and the CPU for the others."""
        if isinstance(run, DeviceRunner):
            return run.device, run.detail
        return (CUDA, "") if self.requires_gpu else (CPU, "")

    def work_path(self, ctx: ExportContext) -> Path:
        """Where the export writes its model file (``<workdir>/<format>/<model_file>``)."""
        path = ctx.workdir / self.name / self.model_file
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def exported(self, ctx: ExportContext, files: Mapping[str, Path],
                 details: Mapping[str, Any] | None = None) -> ExportedModel:
        """The :class:`ExportedModel` of ``files``, with the spec's I/O as this format names it."""
        spec = ctx.model.spec
        inputs, outputs = spec.inputs, spec.outputs
        if self.libtorch_names:
            inputs, outputs = positional_names(inputs, "INPUT"), positional_names(outputs, "OUTPUT")
        return ExportedModel(format=self.name, files=dict(files), inputs=inputs, outputs=outputs,
                             details=dict(details or {}))


def positional_names(specs: tuple[TensorSpec, ...], prefix: str) -> tuple[TensorSpec, ...]:
    """Triton's libtorch naming convention: INPUT__0, INPUT__1, ... in declaration order."""
    return tuple(s.renamed(f"{prefix}__{i}") for i, s in enumerate(specs))


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def exception_summary(exc: BaseException) -> str:
    """One line for an exporter's exception; torch.onnx wraps the real cause in a long
    report whose 'Exception summary' names it."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    found = re.search(r"<class '([\w.]+)'>: (.+)", text)
    if found:
        return f"{found.group(1).rsplit('.', 1)[-1]}: {found.group(2).strip()}"[:300]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]
