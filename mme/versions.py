"""The version matrix (``versions.toml``): which serving release an artifact targets."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources

from mme.errors import UsageError


@dataclass(frozen=True)
class Release:
    name: str
    triton_container: str
    sagemaker_image: str
    triton_server: str

    def to_dict(self) -> dict:
        return {
            "release": self.name,
            "triton_container": self.triton_container,
            "sagemaker_image": self.sagemaker_image,
            "triton_server": self.triton_server,
        }


def _matrix() -> dict:
    return tomllib.loads(resources.files("mme").joinpath("versions.toml").read_text())


def release(name: str | None = None) -> Release:
    matrix = _matrix()
    key = name or matrix["default"]
    rows = matrix["releases"]
    if key not in rows:
        raise UsageError(f"unknown Triton release {key!r}; known releases: {', '.join(sorted(rows))}")
    return Release(name=key, **rows[key])
