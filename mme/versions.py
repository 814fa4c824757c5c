"""The version matrix (``versions.toml``): which serving release an artifact targets, and
what runs inside it (Triton, TensorRT, CUDA, Python, the matching NGC PyTorch image with its
torch and Torch-TensorRT), which GPUs it supports, and whether AWS publishes a SageMaker
Triton image for it. The default release is the newest SageMaker serves whose CUDA a SageMaker
host image runs natively (see the comment above ``default`` in versions.toml and mme/hosts.py).

The Dockerfiles read the same matrix through build args::

    python -m mme.versions --build-args --image serving [--release 25.09]
    python -m mme.versions --get tensorrt [--release 24.09]
    python -m mme.versions --list
    python -m mme.versions --check-installed [--release 25.09]   (the builder image's check)

This module imports nothing heavy (the Makefile runs it with any Python 3.11+).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass, fields
from importlib import metadata, resources
from typing import Sequence

from mme.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (Ubuntu 22.04's python3, which the Makefile's Docker targets may run): tomli, where installed
    try:
        import tomli as tomllib
    except ModuleNotFoundError:
        tomllib = None


@dataclass(frozen=True)
class Release:
    name: str
    triton_container: str
    sagemaker_image: str
    triton_server: str
    tensorrt: str | None = None
    cuda: str | None = None
    pytorch_container: str | None = None
    onnx_opset: int | None = None
    python: str | None = None
    torch: str | None = None  # the NGC PyTorch image's torch (Triton's libtorch backend is built from it)
    torch_tensorrt: str | None = None  # the NGC PyTorch image's Torch-TensorRT (the runtime Triton links)
    torch_tensorrt_abi: str | None = None  # its engine ABI version: modules load only in the same ABI
    min_compute_capability: str | None = None  # the oldest GPU architecture the release supports
    min_driver: str | None = None  # the NVIDIA driver its CUDA needs natively (mme/hosts.py: older ones by compatibility)
    sagemaker: bool = False  # AWS publishes sagemaker_image for this release
    unverified: tuple[str, ...] = ()  # fields no primary source confirmed

    def __post_init__(self) -> None:
        object.__setattr__(self, "unverified", tuple(self.unverified))

    def to_dict(self) -> dict:
        data: dict[str, object] = {
            "release": self.name,
            "triton_container": self.triton_container,
            "sagemaker_image": self.sagemaker_image,
            "triton_server": self.triton_server,
        }
        for key in OPTIONAL_FIELDS:
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        data["sagemaker"] = self.sagemaker
        if self.unverified:
            data["unverified"] = list(self.unverified)
        return data


FIELDS = tuple(f.name for f in fields(Release))
OPTIONAL_FIELDS = ("tensorrt", "cuda", "pytorch_container", "onnx_opset", "python", "torch", "torch_tensorrt",
                   "torch_tensorrt_abi", "min_compute_capability", "min_driver")
# What the builder image must carry, as the release's NGC PyTorch image ships it:
# distribution name -> Release field (checked by `python -m mme.versions --check-installed`).
BUILDER_STACK = {"torch": "torch", "torch-tensorrt": "torch_tensorrt", "tensorrt": "tensorrt"}


class NoSageMakerImageError(UsageError):
    """The release has no SageMaker Triton image: it can be served self-hosted only."""

# Build args per image: ARG name -> Release field (or "image:<key>" for the [images] table).
# Each Dockerfile declares exactly these ARGs, with these values as defaults
# (tests/docker/test_dockerfiles.py checks both directions).
BUILD_ARGS: dict[str, dict[str, str]] = {
    "builder": {
        "PYTORCH_CONTAINER": "pytorch_container",
        "TRITON_RELEASE": "name",
        "TENSORRT_VERSION": "tensorrt",
        "CUDA_VERSION": "cuda",
        "ONNX_OPSET": "onnx_opset",
        "PYTHON_VERSION": "python",
    },
    "serving": {
        "TRITON_CONTAINER": "triton_container",
        "TRITON_RELEASE": "name",
        "TRITON_SERVER_VERSION": "triton_server",
        "TENSORRT_VERSION": "tensorrt",
        "CUDA_VERSION": "cuda",
        "PYTHON_VERSION": "python",
    },
    "bench": {
        "BENCH_BASE": "image:bench_base",
    },
}


def _matrix() -> dict:
    return tomllib.loads(resources.files("mme").joinpath("versions.toml").read_text())


def _make_release(key: str, row: dict) -> Release:
    unknown = sorted(set(row) - set(FIELDS))
    if unknown:
        raise UsageError(f"mme/versions.toml: release {key!r} has unknown keys {', '.join(unknown)}; "
                         f"known keys: {', '.join(FIELDS[1:])}")
    not_fields = sorted(set(row.get("unverified", ())) - set(FIELDS))
    if not_fields:
        raise UsageError(f"mme/versions.toml: release {key!r} marks unknown fields unverified: {', '.join(not_fields)}")
    return Release(name=key, **row)


def release(name: str | None = None) -> Release:
    matrix = _matrix()
    key = name or matrix["default"]
    rows = matrix["releases"]
    if key not in rows:
        raise UsageError(f"unknown Triton release {key!r}; known releases: {', '.join(sorted(rows))}")
    return _make_release(key, rows[key])


def default_release_name() -> str:
    return _matrix()["default"]


def releases() -> list[Release]:
    """Every release in the matrix, newest first."""
    rows = _matrix()["releases"]
    return [_make_release(key, rows[key]) for key in sorted(rows, reverse=True)]


def image(key: str) -> str:
    """An image of the ``[images]`` table (e.g. ``bench_base``)."""
    images = _matrix().get("images", {})
    if key not in images:
        raise UsageError(f"mme/versions.toml has no [images] entry {key!r}; known: {', '.join(sorted(images))}")
    return images[key]


def sagemaker_releases() -> list[Release]:
    """Releases AWS publishes a SageMaker Triton image for, newest first."""
    return [r for r in releases() if r.sagemaker]


def require_sagemaker_image(rel: Release, image_uri: str | None = None, action: str = "deploy it") -> None:
    """Refuse a release without a SageMaker Triton image unless the user brings an image."""
    if rel.sagemaker or image_uri:
        return
    served = [r.name for r in sagemaker_releases()]
    default = default_release_name()
    suggested = default if default in served else (served[0] if served else "none")
    raise NoSageMakerImageError(
        f"AWS publishes no SageMaker Triton image for release {rel.name} ({rel.sagemaker_image} does not exist), so "
        f"SageMaker cannot {action}: package for a release it serves (--triton-release {suggested}; "
        f"served: {', '.join(served[:3]) or 'none'}), or pass --image-uri with your own image of Triton {rel.name} in ECR"
    )


def same_major_minor(a: str, b: str) -> bool:
    """True when two versions share major.minor (local parts like ``a0+nv25.09`` ignored)."""
    def head(v: str) -> list[str]:
        return v.strip().split("+")[0].split(".")[:2]
    pa, pb = head(a), head(b)
    return len(pa) == 2 and pa == pb


def same_tensorrt(a: str, b: str) -> bool:
    """True when two TensorRT versions are the same release (major.minor.patch; the build
    number is ignored, and a version given as major.minor compares on those two)."""
    pa, pb = a.strip().split("."), b.strip().split(".")
    n = min(3, len(pa), len(pb))
    return n >= 2 and pa[:n] == pb[:n]


def releases_with_tensorrt(version: str) -> list[Release]:
    """Releases whose TensorRT is ``version`` (see :func:`same_tensorrt`)."""
    return [r for r in releases() if r.tensorrt and same_tensorrt(r.tensorrt, version)]


def build_args(image_name: str, name: str | None = None) -> dict[str, str]:
    """The ``--build-arg`` values of one image for release ``name`` (default: the default release)."""
    if image_name not in BUILD_ARGS:
        raise UsageError(f"unknown image {image_name!r}; choose one of: {', '.join(BUILD_ARGS)}")
    rel = release(name)
    values: dict[str, str] = {}
    for arg, source in BUILD_ARGS[image_name].items():
        value = image(source.split(":", 1)[1]) if source.startswith("image:") else getattr(rel, source)
        if value is None:
            raise UsageError(f"mme/versions.toml: release {rel.name!r} has no {source!r}, needed by the {image_name} image")
        values[arg] = str(value)
    return values


def installed_stack() -> dict[str, str | None]:
    """Versions of the builder stack installed in this Python (None: not installed)."""
    found: dict[str, str | None] = {}
    for dist in BUILDER_STACK:
        candidates = (dist, f"{dist}-cu13", f"{dist}-cu12") if dist == "tensorrt" else (dist,)
        found[dist] = None
        for name in candidates:
            try:
                found[dist] = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
    return found


def stack_mismatches(rel: Release, installed: dict[str, str | None]) -> list[str]:
    """Where the installed torch / Torch-TensorRT / TensorRT differ from the release's
    (torch and Torch-TensorRT by major.minor, TensorRT by major.minor.patch)."""
    problems = []
    for dist, attr in BUILDER_STACK.items():
        want, got = getattr(rel, attr), installed.get(dist)
        if want is None:
            continue
        same = same_tensorrt if dist == "tensorrt" else same_major_minor
        if got is None:
            problems.append(f"{dist} is not installed (release {rel.name} ships {want})")
        elif not same(got, want):
            problems.append(f"{dist} {got} is installed but release {rel.name} ships {want}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mme.versions", description="Print the version matrix.")
    parser.add_argument("--release", help="a release of mme/versions.toml (default: its `default`)")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--build-args", action="store_true", help="print --build-arg KEY=VALUE for --image")
    action.add_argument("--get", metavar="FIELD", help=f"print one field: {', '.join(FIELDS)}")
    action.add_argument("--list", action="store_true", help="print every release, one line each")
    action.add_argument("--check-installed", action="store_true",
                        help="exit 1 unless this Python has the release's torch, Torch-TensorRT and TensorRT (builder image)")
    parser.add_argument("--image", choices=tuple(BUILD_ARGS), help="the image whose build args to print")
    args = parser.parse_args(argv)
    try:
        if args.build_args:
            if not args.image:
                parser.error("--build-args needs --image")
            print(" ".join(f"--build-arg {shlex.quote(f'{k}={v}')}" for k, v in build_args(args.image, args.release).items()))
        elif args.check_installed:
            rel = release(args.release)
            problems = stack_mismatches(rel, installed_stack())
            if problems:
                print(f"mme.versions: error: this image does not carry release {rel.name}'s stack: {'; '.join(problems)}; "
                      f"build from {rel.pytorch_container} and keep its torch, torch_tensorrt and tensorrt", file=sys.stderr)
                return 1
            print(f"ok: torch {rel.torch}, Torch-TensorRT {rel.torch_tensorrt}, TensorRT {rel.tensorrt} as release {rel.name} ships them")
        elif args.get:
            if args.get not in FIELDS:
                parser.error(f"unknown field {args.get!r}; choose one of: {', '.join(FIELDS)}")
            print(getattr(release(args.release), args.get))
        else:
            default = default_release_name()
            for rel in releases():
                mark = " (default)" if rel.name == default else ("" if rel.sagemaker else " (self-hosted only: no SageMaker image)")
                print(f"{rel.name}{mark}: " + ", ".join(f"{k}={v}" for k, v in rel.to_dict().items() if k != "release"))
    except UsageError as exc:
        print(f"mme.versions: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    if tomllib is None:
        print(f"mme.versions: error: reading mme/versions.toml needs Python 3.11+ (tomllib) or the tomli package; "
              f"{sys.executable} is Python {sys.version_info[0]}.{sys.version_info[1]}: run it with Python 3.11+ "
              f"(make: PYTHON=python3.11), or {sys.executable} -m pip install --user tomli", file=sys.stderr)
        sys.exit(2)
    sys.exit(main())
