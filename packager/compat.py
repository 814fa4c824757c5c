"""Will this artifact load in that serving release, on that GPU? Checked before anything is
pushed, deployed or served, with a one-line fix, because a SageMaker endpoint that cannot
load a model says so only after a deploy of many minutes.

A TensorRT engine (a plan, or one embedded by Torch-TensorRT) deserialises only

* on the TensorRT version that built it;
* on GPUs of the compute capability it was built for, unless it was built hardware
  compatible (``--hardware-compatible``: Ampere and newer, compute capability 8.0+);
* for Torch-TensorRT, in the Torch-TensorRT runtime of the same release line: Triton's
  libtorch backend links the one of the NGC PyTorch image of its release, and the engine
  ABI changes between releases.

TorchScript saved by a newer torch than the release's libtorch may not load either; that
one is reported as a warning (:func:`compat_warnings`), since most modules still do.

``check_artifact(manifest, release, compute_capability=..., where=...)`` takes the manifest
(:class:`packager.manifest.Manifest`, a dict of the manifest.json shape, or :class:`EngineFacts` built from S3
metadata) and a :class:`mme.versions.Release`. Artifacts without an engine only meet the
release's own GPU floor. Also a command for scripts and the Makefile::

    python -m packager.compat [--release 25.09] [--instance-type ml.g5.xlarge] artifacts/resnet50/tensorrt ...
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from mme.errors import MmeError
from mme.instances import instance_gpu
from mme.versions import Release, releases, releases_with_tensorrt, same_major_minor, same_tensorrt
from mme.versions import release as triton_release
from packager.formats import FORMATS, format_of
from packager.formats.gpu import HARDWARE_COMPATIBLE  # TensorRT's HardwareCompatibilityLevel.AMPERE_PLUS
from packager.manifest import MANIFEST_NAME, Manifest, is_artifact_directory

AMPERE = (8, 0)


def engine_format_of_platform(platform: str | None) -> str | None:
    """The engine format a Triton platform belongs to when only that format uses it
    (``tensorrt_plan``: tensorrt), else None."""
    owners = [f for f in FORMATS.values() if f.platform and f.platform == platform]
    return owners[0].name if len(owners) == 1 and owners[0].engine else None


class PlanIncompatibleError(MmeError):
    """An engine that cannot load in the target release or on the target GPU."""


@dataclass(frozen=True)
class EngineFacts:
    """What the checks need to know of an artifact (from its manifest or its S3 metadata)."""

    model: str
    format: str | None
    tensorrt: str | None = None
    torch_tensorrt: str | None = None
    torch_tensorrt_abi: str | None = None
    torch: str | None = None
    compute_capability: str | None = None
    hardware_compatibility: str | None = None

    @classmethod
    def of(cls, manifest: Any) -> "EngineFacts":
        if isinstance(manifest, EngineFacts):
            return manifest
        if isinstance(manifest, Manifest):
            return cls.of_manifest(manifest)
        data: Mapping[str, Any] = manifest.to_dict() if hasattr(manifest, "to_dict") else manifest
        return cls._from_records(data.get("model") or data.get("requested_name"), data.get("format"),
                                 (data.get("triton") or {}).get("platform"), data.get("versions") or {},
                                 data.get("details") or {})

    @classmethod
    def of_manifest(cls, manifest: Manifest) -> "EngineFacts":
        """From a :class:`packager.manifest.Manifest`."""
        return cls._from_records(manifest.model or manifest.requested_name, manifest.format, manifest.triton.platform,
                                 manifest.versions, manifest.details.to_dict())

    @classmethod
    def _from_records(cls, model: Any, fmt: Any, platform: Any, versions: Mapping[str, Any],
                      details: Mapping[str, Any]) -> "EngineFacts":
        """From a manifest's parts: its ``versions`` and ``details`` as written in the file."""
        known = format_of(fmt)
        if not (known and (known.engine or known.saved_by_torch)):
            fmt = engine_format_of_platform(platform) or fmt
        return cls(
            model=str(model or "this model"),
            format=fmt,
            tensorrt=_known(versions.get("tensorrt")),
            torch_tensorrt=_known(versions.get("torch_tensorrt")),
            torch_tensorrt_abi=_known(details.get("torch_tensorrt_abi")),
            torch=_known(versions.get("torch")),
            compute_capability=_known(details.get("compute_capability")),
            hardware_compatibility=_known(details.get("hardware_compatibility")),
        )

    @classmethod
    def from_s3_metadata(cls, metadata: Mapping[str, str]) -> "EngineFacts":
        """The facts ``mme push`` records in each object's metadata (``x-amz-meta-mme-*``)."""
        return cls(
            model=metadata.get("mme-model") or "this model",
            format=metadata.get("mme-format"),
            tensorrt=_known(metadata.get("mme-tensorrt")),
            torch_tensorrt=_known(metadata.get("mme-torch-tensorrt")),
            torch_tensorrt_abi=_known(metadata.get("mme-torch-tensorrt-abi")),
            torch=_known(metadata.get("mme-torch")),
            compute_capability=_known(metadata.get("mme-compute-capability")),
            hardware_compatibility=_known(metadata.get("mme-hardware-compatibility")),
        )

    @property
    def has_engine(self) -> bool:
        known = format_of(self.format)
        return bool(known and known.engine)

    @property
    def what(self) -> str:
        known = format_of(self.format)
        return f"{self.model} ({known.engine if known and known.engine else self.format or 'artifact'})"


def _known(value: Any) -> str | None:
    text = str(value).strip() if value is not None else ""
    return None if text in ("", "unknown", "None") else text


def parse_cc(text: str | None) -> tuple[int, int] | None:
    """``"8.6"`` -> (8, 6); None for anything else."""
    parts = (text or "").strip().split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def _rebuild(release: Release) -> str:
    return f"rebuild it with the builder image of release {release.name} (make docker-package TRITON_RELEASE={release.name})"


def check_plan_compatible(manifest: Any, release: Release) -> None:
    """Raise :class:`PlanIncompatibleError` (one line: what and how to fix) when the artifact's
    engine cannot load in ``release``: another TensorRT, or another Torch-TensorRT runtime."""
    facts = EngineFacts.of(manifest)
    if not facts.has_engine:
        return
    built = facts.tensorrt
    if built is None:
        raise PlanIncompatibleError(
            f"{facts.what} records no TensorRT version in its manifest, so it cannot be checked against Triton "
            f"{release.name}; {_rebuild(release)}"
        )
    if not release.tensorrt:
        raise PlanIncompatibleError(
            f"mme/versions.toml records no TensorRT version for Triton release {release.name}, so {facts.what} "
            f"(TensorRT {built}) cannot be checked; add `tensorrt = \"...\"` to that release"
        )
    if not same_tensorrt(built, release.tensorrt):
        matching = [r.name for r in releases_with_tensorrt(built)]
        if matching:
            alternative = f"or pass --triton-release {matching[0]} (that release runs TensorRT {built})"
        else:
            alternative = f"no release in mme/versions.toml runs TensorRT {built}, so rebuilding is the only fix"
        raise PlanIncompatibleError(
            f"{facts.what} was built with TensorRT {built} but Triton release {release.name} ({release.triton_container}) "
            f"runs TensorRT {release.tensorrt}, and an engine loads only on the TensorRT it was built with: "
            f"{_rebuild(release)}, {alternative}"
        )
    known = format_of(facts.format)
    if known and known.torch_tensorrt_engine:
        runtime = release.torch_tensorrt
        if facts.torch_tensorrt is None:
            raise PlanIncompatibleError(
                f"{facts.what} records no Torch-TensorRT version, so its engine ABI cannot be checked against "
                f"Triton {release.name}; {_rebuild(release)}"
            )
        if facts.torch_tensorrt_abi and release.torch_tensorrt_abi:
            same = facts.torch_tensorrt_abi == release.torch_tensorrt_abi
            built_as = f"Torch-TensorRT {facts.torch_tensorrt} (engine ABI {facts.torch_tensorrt_abi})"
            runs_as = f"Torch-TensorRT {runtime} (engine ABI {release.torch_tensorrt_abi})"
        else:  # no ABI recorded: the release line decides
            same = runtime is None or same_major_minor(facts.torch_tensorrt, runtime)
            built_as, runs_as = f"Torch-TensorRT {facts.torch_tensorrt}", f"Torch-TensorRT {runtime}"
        if not same:
            raise PlanIncompatibleError(
                f"{facts.what} was compiled with {built_as} but Triton {release.name}'s libtorch backend runs "
                f"{runs_as} of NGC PyTorch {release.name}, which refuses engines of another ABI: {_rebuild(release)}"
            )


def check_gpu(manifest: Any, compute_capability: str | None, where: str) -> None:
    """Raise when the artifact's engine was built for another GPU than ``compute_capability``
    (``where`` names it: "ml.g5.xlarge (A10G, 8.6)"). Unknown targets pass."""
    facts = EngineFacts.of(manifest)
    target = parse_cc(compute_capability)
    if not facts.has_engine or target is None:
        return
    built = parse_cc(facts.compute_capability)
    if built is None:
        raise PlanIncompatibleError(
            f"{facts.what} records no GPU compute capability, so it cannot be checked against {where}; "
            "re-package it on the GPU it will run on"
        )
    if built == target:
        return
    if facts.hardware_compatibility == HARDWARE_COMPATIBLE and built >= AMPERE and target >= AMPERE:
        return
    fixes = ("build it on that GPU family, or in a SageMaker job on it (mme compile --on sagemaker "
             "--instance-type <an instance with that GPU>)")
    if target >= AMPERE:
        fixes += ", or package it with --hardware-compatible (runs on every Ampere or newer GPU, somewhat slower)"
    raise PlanIncompatibleError(
        f"{facts.what} was built for compute capability {facts.compute_capability} but {where} has "
        f"{compute_capability}, and a TensorRT engine loads only on the GPU architecture it was built for: {fixes}"
    )


def check_release_on_gpu(release: Release, compute_capability: str | None, where: str) -> None:
    """Raise when the release itself does not support the GPU (e.g. 25.04+ on a V100, 7.0)."""
    target, floor = parse_cc(compute_capability), parse_cc(release.min_compute_capability)
    if target is None or floor is None or target >= floor:
        return
    newer = [r.name for r in _releases_supporting(target)]
    hint = f"deploy release {newer[0]} (--triton-release {newer[0]})" if newer else "choose an instance with a newer GPU"
    raise PlanIncompatibleError(
        f"Triton {release.name} supports GPUs of compute capability {release.min_compute_capability} and newer, "
        f"but {where} has {compute_capability}: choose a newer instance type, or {hint}"
    )


def _releases_supporting(target: tuple[int, int]) -> list[Release]:
    return [r for r in releases() if r.sagemaker and (parse_cc(r.min_compute_capability) or (0, 0)) <= target]


def check_artifact(manifest: Any, release: Release, *, compute_capability: str | None = None,
                   where: str = "the target GPU") -> None:
    """Every check: the engine against the release, the engine and the release against the GPU."""
    check_plan_compatible(manifest, release)
    check_gpu(manifest, compute_capability, where)
    check_release_on_gpu(release, compute_capability, where)


def compat_warnings(manifest: Any, release: Release) -> list[str]:
    """What may still fail, said as warnings: TorchScript saved by a newer torch than the
    release's libtorch."""
    facts = EngineFacts.of(manifest)
    known = format_of(facts.format)
    if not (known and known.saved_by_torch) or not facts.torch or not release.torch:
        return []
    saved, runtime = _major_minor(facts.torch), _major_minor(release.torch)
    if saved is None or runtime is None or saved <= runtime:
        return []
    return [f"{facts.model} ({facts.format}) was saved by torch {facts.torch}, newer than the libtorch of Triton "
            f"{release.name} (torch {release.torch}); if it fails to load, package it in the builder image "
            f"(make docker-package TRITON_RELEASE={release.name})"]


def _major_minor(version: str) -> tuple[int, int] | None:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def manifest_paths(paths: Sequence[Path]) -> list[Path]:
    """``manifest.json`` files under each path (an artifact directory or a tree of them)."""
    found: list[Path] = []
    for path in paths:
        if path.is_file():
            found.append(path)
        elif is_artifact_directory(path):
            found.append(path / MANIFEST_NAME)
        else:
            found.extend(sorted(path.rglob("manifest.json")))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packager.compat",
                                     description="Refuse engines that cannot load in the release or on the GPU.")
    parser.add_argument("paths", nargs="+", type=Path, help="artifact directories (or trees of them) made by 'mme package'")
    parser.add_argument("--release", help="the serving release (default: mme/versions.toml's default)")
    parser.add_argument("--instance-type", help="check against this SageMaker instance type's GPU (mme/instances.toml)")
    args = parser.parse_args(argv)
    try:
        rel = triton_release(args.release)
        cc, where = None, "the target GPU"
        if args.instance_type:

            gpu = instance_gpu(args.instance_type)
            cc, where = gpu.compute_capability, gpu.describe(args.instance_type)
        manifests = manifest_paths(args.paths)
        if not manifests:
            raise MmeError(f"no manifest.json under {', '.join(map(str, args.paths))}; point at artifacts made by 'mme package'")
        for path in manifests:
            try:
                manifest = Manifest.load(path)
            except OSError as exc:
                raise MmeError(f"cannot read {path} ({exc.strerror or exc}); re-run 'mme package'") from None
            check_artifact(manifest, rel, compute_capability=cc, where=where)
            for line in compat_warnings(manifest, rel):
                print(f"warning: {line}", file=sys.stderr)
    except MmeError as exc:
        print(f"mme: error: {exc}", file=sys.stderr)
        return exc.exit_code
    on_gpu = f", {where}" if args.instance_type else ""
    print(f"ok: {len(manifests)} artifact(s) load on Triton {rel.name} (TensorRT {rel.tensorrt}{on_gpu})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
