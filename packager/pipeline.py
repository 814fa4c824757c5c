"""``mme package``: model spec -> exports -> validation -> Triton directory -> tarball + manifest.

Every check that can fail fast runs before the model is loaded (options, GPU formats,
output directory). Each format is built in a staging directory and swapped into
``<out>/<model>/<format>/`` only once it validated, so an interrupted or failed run never
leaves something that looks like a good artifact. Re-running replaces the artifact with
an identical one (seeded random weights, deterministic tarballs).
"""

from __future__ import annotations

import platform
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from mme import __version__
from mme.errors import UsageError
from mme.fsutil import ensure_writable_dir, staged_directory
from mme.progress import Reporter
from mme.versions import release as triton_release
from packager import layout
from packager.formats import FORMATS, ExportContext
from packager.formats.gpu import check_precision
from packager.formats.onnx_format import MIN_OPSET
from packager.hub import hub_reachable, use_offline_mode
from packager.manifest import Manifest
from packager.manifest_records import BuildDetails, Source, TensorEntry, TritonSettings, TritonTarget, Validation
from packager.model import triton_model_name
from packager.registry import resolve
from packager.request import PackageRequest, request_fingerprint
from packager.served import served_kind
from packager.triton_config import build_config

__all__ = ["PackageRequest", "PackagedArtifact", "check_package_request", "package", "request_fingerprint"]


@dataclass(frozen=True)
class PackagedArtifact:
    format: str
    directory: Path
    manifest: Manifest

    @property
    def tarball(self) -> Path:
        return self.directory / self.manifest.tarball

    def line(self) -> str:
        """One line for people: where it went, how close it validated, how big it is."""
        m = self.manifest
        size = self.tarball.stat().st_size / 1e6
        return (f"  {m.format:<15} -> {self.directory}  (max |diff| {m.validation.max_abs_diff:.2e}, "
                f"{m.tarball} {size:.1f} MB, weights: {m.weights})")


def check_package_request(request: PackageRequest, *, build_here: bool = True) -> None:
    """Refuse a request that cannot be packaged, before any work; ``build_here=False`` checks it
    for another host (a SageMaker job): everything but this host's GPU and local weights."""
    request.triton.check()
    if request.export.opset < MIN_OPSET:
        raise UsageError(f"--opset {request.export.opset} is too old; Triton's ONNX Runtime path needs {MIN_OPSET} or newer")
    if request.atol is not None and not request.atol > 0:
        raise UsageError(f"--atol must be a positive number (got {request.atol})")
    if request.rtol is not None and not request.rtol >= 0:
        raise UsageError(f"--rtol must be 0 or a positive number (got {request.rtol}); 0 compares absolutely, by --atol alone")
    path = request.model.weights_path
    if path is not None and not path.exists():
        raise UsageError(f"--weights {path}: no such file or directory; pass a local checkpoint file or a Hugging Face model directory")
    check_precision(request.export.precision)
    gpu = [name for name in request.formats if FORMATS[name].requires_gpu]
    if request.export.hardware_compatible and not gpu:
        raise UsageError("--hardware-compatible applies to the TensorRT formats (tensorrt, torch-tensorrt); add one to --formats")
    release = triton_release(request.triton_release)
    for name in request.formats:
        if build_here:
            FORMATS[name].check_available(release)
        else:
            FORMATS[name].check_release(release)


def package(request: PackageRequest, reporter: Reporter) -> list[PackagedArtifact]:
    check_package_request(request)
    release = triton_release(request.triton_release)
    out = ensure_writable_dir(request.out)
    name = triton_model_name(request.model.name)
    model_root = out / name
    created_root = not model_root.exists()
    if not hub_reachable():
        use_offline_mode()  # cached weights still load; nothing waits on retries

    family = resolve(request.model.name, request.family, request.model.weights_path)
    kind = served_kind(request)
    kind.check_family(request.model.name, family)
    reporter.info(f"==> packaging {request.model.name} as {', '.join(request.formats)} into {model_root}")
    load_timings: dict[str, float] = {}
    with reporter.stage(f"load {request.model.name}", load_timings, "load"):
        model = family.load(request.model, reporter)
    reporter.info(
        f"  {model.family} model, {model.parameters / 1e6:.1f}M parameters, weights: {model.weights}, "
        f"inputs {', '.join(t.name + '[' + ', '.join(map(str, t.shape)) + ']' for t in model.spec.inputs)}"
    )
    model_root.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(dir=model_root, prefix=".work-"))
    results: list[PackagedArtifact] = []
    try:
        max_batch = request.triton.max_batch_size
        ctx = ExportContext(model=model, options=request.export, workdir=workdir, reporter=reporter,
                            max_batch_size=max_batch, instance_kind=request.triton.instance_kind)
        served = kind.for_model(model, reporter, load_timings)
        with reporter.stage("reference outputs from PyTorch", load_timings, "reference"):
            references = served.references(model, max_batch)
        for index, format_name in enumerate(request.formats, start=1):
            fmt = FORMATS[format_name]
            reporter.info(f"[{index}/{len(request.formats)}] {format_name}: {fmt.description}")
            timings = dict(load_timings)
            with reporter.stage("export", timings, "export"):
                exported = fmt.export(ctx)
            atol = request.atol or fmt.default_atol(model.spec.default_atol, request.export.precision)
            rtol = request.rtol if request.rtol is not None else fmt.default_rtol(model.spec.default_rtol,
                                                                                  request.export.precision)
            run = fmt.runner(exported, ctx)
            device, device_detail = fmt.validation_device(run)
            with reporter.stage(f"validate against PyTorch (on {device})", timings, "validate"):
                validation = served.validate(model, exported, run, references, atol=atol, rtol=rtol, device=device,
                                             device_detail=device_detail, reporter=reporter)
            with staged_directory(model_root / format_name) as staging:
                with reporter.stage("layout", timings, "layout"):
                    config = build_config(fmt, exported, request.triton, model.spec.axes,
                                          fmt.triton_parameters(request.export))
                    what, steps = served.layout(staging, name, model, exported, config, request.triton)
                with reporter.stage("tarball", timings, "tarball"):
                    tarball = layout.write_tarball(staging, name, steps)
                manifest = _manifest(request, family, model, fmt, what, config, tarball.name, staging,
                                     validation, timings, release, served.details(name))
                manifest.write(staging)
            results.append(PackagedArtifact(format_name, model_root / format_name, manifest))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if created_root and model_root.exists() and not any(model_root.iterdir()):
            model_root.rmdir()
    return results


def _manifest(request, family, model, fmt, served, config, tarball, staging, validation, timings,
              release, served_details) -> Manifest:
    exported = served.exported
    versions = {"mme-toolkit": __version__, "python": platform.python_version(), **fmt.recorded_versions(exported),
                **family.versions()}
    source = Source(
        family=model.family,
        name=request.model.name,
        weights=model.weights,
        weights_path=str(request.model.weights_path) if model.weights == "local" else None,
        seed=request.model.seed if model.weights == "random" else None,
        extra={k: v for k, v in model.details.items() if v not in (None, [], "")},
    )
    triton = TritonSettings(
        platform=fmt.platform,
        backend=fmt.backend,
        max_batch_size=config.max_batch_size,
        instance_kind=request.triton.instance_kind or fmt.instance_kind,
        dynamic_batching=request.triton.dynamic_batching,
        target=TritonTarget.from_release(release),
    )
    spec = served.spec
    spec_names = {e.name: s.name for s, e in zip(spec.inputs + spec.outputs, exported.inputs + exported.outputs)}
    details = dict(exported.details) | {"task": spec.task, "axes_max": spec.axes,
                                        "request_sha256": request_fingerprint(request)} | served_details
    return Manifest(
        model=triton_model_name(request.model.name),
        requested_name=request.model.name,
        format=fmt.name,
        source=source,
        triton=triton,
        tarball=tarball,
        files=layout.file_entries(staging),
        parameters=int(model.parameters),
        inputs=tuple(TensorEntry.from_spec(t, spec_names[t.name]) for t in exported.inputs),
        outputs=tuple(TensorEntry.from_spec(t, spec_names[t.name]) for t in exported.outputs),
        sample_request=served.sample,
        versions=versions,
        validation=Validation.from_dict(validation),
        timings_s={k: round(v, 3) for k, v in timings.items()},
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        details=BuildDetails.from_dict(details),
    )
