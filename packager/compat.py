"""Will this artifact load in that serving release? TensorRT engines load only on the
TensorRT version they were built with, so a plan built with one TensorRT is refused, with
a one-line fix, before it is pushed or loaded into a release that runs another.

``check_plan_compatible(manifest, release)`` takes the manifest as a dict (``manifest.json``
as read, or ``Manifest.to_dict()``) and a :class:`mme.versions.Release`; artifacts without
a TensorRT engine (TorchScript, ONNX, cpu-local) always pass.

Also a command for scripts and the Makefile::

    python -m packager.compat [--release 26.07] artifacts/resnet50/tensorrt [more artifact dirs or trees]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from mme.errors import MmeError
from mme.versions import Release, release as triton_release, releases_with_tensorrt, same_tensorrt

# Formats whose files hold serialized TensorRT engines (Torch-TensorRT embeds them in TorchScript).
ENGINE_FORMATS = {"tensorrt": "TensorRT plan", "torch-tensorrt": "Torch-TensorRT module"}
ENGINE_PLATFORMS = {"tensorrt_plan": "tensorrt"}


class PlanIncompatibleError(MmeError):
    """A TensorRT engine built for another TensorRT than the serving release runs."""


def _as_dict(manifest: Any) -> Mapping[str, Any]:
    if hasattr(manifest, "to_dict"):
        return manifest.to_dict()
    return manifest


def engine_format(manifest: Mapping[str, Any]) -> str | None:
    """The manifest's format when its artifact holds a TensorRT engine, else None."""
    fmt = manifest.get("format")
    if fmt in ENGINE_FORMATS:
        return fmt
    platform = (manifest.get("triton") or {}).get("platform")
    return ENGINE_PLATFORMS.get(platform)


def check_plan_compatible(manifest: Mapping[str, Any], release: Release) -> None:
    """Raise :class:`PlanIncompatibleError` (one line: what and how to fix) when the
    artifact holds a TensorRT engine whose recorded TensorRT differs from ``release``'s."""
    manifest = _as_dict(manifest)
    fmt = engine_format(manifest)
    if fmt is None:
        return
    what = f"{manifest.get('model') or manifest.get('requested_name') or 'this model'} ({ENGINE_FORMATS[fmt]})"
    rebuild = f"rebuild it with the builder image of release {release.name} (make docker-package TRITON_RELEASE={release.name})"
    built = str((manifest.get("versions") or {}).get("tensorrt") or "").strip()
    if not built or built == "unknown":
        raise PlanIncompatibleError(
            f"{what} records no TensorRT version in its manifest, so it cannot be checked against Triton "
            f"{release.name}; {rebuild}"
        )
    if not release.tensorrt:
        raise PlanIncompatibleError(
            f"mme/versions.toml records no TensorRT version for Triton release {release.name}, so {what} "
            f"(TensorRT {built}) cannot be checked; add `tensorrt = \"...\"` to that release"
        )
    if same_tensorrt(built, release.tensorrt):
        return
    matching = [r.name for r in releases_with_tensorrt(built)]
    if matching:
        alternative = f"or pass --triton-release {matching[0]} (that release runs TensorRT {built})"
    else:
        alternative = f"no release in mme/versions.toml runs TensorRT {built}, so rebuilding is the only fix"
    raise PlanIncompatibleError(
        f"{what} was built with TensorRT {built} but Triton release {release.name} ({release.triton_container}) "
        f"runs TensorRT {release.tensorrt}, and an engine loads only on the TensorRT it was built with: "
        f"{rebuild}, {alternative}"
    )


def manifest_paths(paths: Sequence[Path]) -> list[Path]:
    """``manifest.json`` files under each path (an artifact directory or a tree of them)."""
    found: list[Path] = []
    for path in paths:
        if path.is_file():
            found.append(path)
        elif (path / "manifest.json").is_file():
            found.append(path / "manifest.json")
        else:
            found.extend(sorted(path.rglob("manifest.json")))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packager.compat",
                                     description="Refuse TensorRT engines built for another TensorRT than the release runs.")
    parser.add_argument("paths", nargs="+", type=Path, help="artifact directories (or trees of them) made by 'mme package'")
    parser.add_argument("--release", help="the serving release (default: mme/versions.toml's default)")
    args = parser.parse_args(argv)
    try:
        rel = triton_release(args.release)
        manifests = manifest_paths(args.paths)
        if not manifests:
            raise MmeError(f"no manifest.json under {', '.join(map(str, args.paths))}; point at artifacts made by 'mme package'")
        for path in manifests:
            try:
                data = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise MmeError(f"cannot read {path} ({exc}); re-run 'mme package'") from None
            check_plan_compatible(data, rel)
    except MmeError as exc:
        print(f"mme: error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"ok: {len(manifests)} artifact(s) load on Triton {rel.name} (TensorRT {rel.tensorrt})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
