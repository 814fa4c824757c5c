"""The version matrix (``versions.toml``): which serving release an artifact targets, and
what runs inside it (Triton, TensorRT, CUDA, Python, the matching NGC PyTorch image).

The Dockerfiles read the same matrix through build args::

    python -m mme.versions --build-args --image serving [--release 26.07]
    python -m mme.versions --get tensorrt [--release 24.09]
    python -m mme.versions --list

This module imports nothing heavy (the Makefile runs it with any Python 3.11+).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tomllib
from dataclasses import dataclass, fields
from importlib import resources
from typing import Sequence

from mme.errors import UsageError


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

    def to_dict(self) -> dict:
        data = {
            "release": self.name,
            "triton_container": self.triton_container,
            "sagemaker_image": self.sagemaker_image,
            "triton_server": self.triton_server,
        }
        for key in ("tensorrt", "cuda", "pytorch_container", "onnx_opset", "python"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        return data


FIELDS = tuple(f.name for f in fields(Release))

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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mme.versions", description="Print the version matrix.")
    parser.add_argument("--release", help="a release of mme/versions.toml (default: its `default`)")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--build-args", action="store_true", help="print --build-arg KEY=VALUE for --image")
    action.add_argument("--get", metavar="FIELD", help=f"print one field: {', '.join(FIELDS)}")
    action.add_argument("--list", action="store_true", help="print every release, one line each")
    parser.add_argument("--image", choices=tuple(BUILD_ARGS), help="the image whose build args to print")
    args = parser.parse_args(argv)
    try:
        if args.build_args:
            if not args.image:
                parser.error("--build-args needs --image")
            print(" ".join(f"--build-arg {shlex.quote(f'{k}={v}')}" for k, v in build_args(args.image, args.release).items()))
        elif args.get:
            if args.get not in FIELDS:
                parser.error(f"unknown field {args.get!r}; choose one of: {', '.join(FIELDS)}")
            print(getattr(release(args.release), args.get))
        else:
            default = default_release_name()
            for rel in releases():
                mark = " (default)" if rel.name == default else ""
                print(f"{rel.name}{mark}: " + ", ".join(f"{k}={v}" for k, v in rel.to_dict().items() if k != "release"))
    except UsageError as exc:
        print(f"mme.versions: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
