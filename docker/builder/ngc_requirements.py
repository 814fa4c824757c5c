"""What the builder image installs around NVIDIA's PyTorch image (standard library only).

The builder keeps the NGC image's own torch, torchvision, Torch-TensorRT, TensorRT and CUDA
libraries: Triton's libtorch backend of the same release is built from that torch and links
that Torch-TensorRT, so modules built with PyPI's would not load (engine ABI), and TensorRT
plans must come from the release's TensorRT. Everything else the project needs is installed
with the project's pins:

    python ngc_requirements.py pyproject.toml constraints.txt OUT_DIR

writes ``OUT_DIR/requirements.txt`` (the project's dependencies plus its ``dev`` and ``gpu``
extras, less what the NGC image owns) and ``OUT_DIR/constraints.txt`` (the lock, less the
same). ``python -m mme.versions --check-installed`` then fails the build if the image's
stack is not the release's.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

EXTRAS = ("dev", "gpu")
# Distributions the NGC PyTorch image provides and the builder must keep.
NGC_OWNED = re.compile(r"^(torch|torchvision|torchaudio|triton|pytorch-triton|torch-tensorrt|tensorrt(-.*)?|nvidia-.*)$")
# Ours, although their names look like NVIDIA's libraries.
NOT_OWNED = {"nvidia-ml-py", "nvidia-pytriton"}


def name_of(requirement: str) -> str:
    """``tritonclient[http,grpc]==2.73.0`` -> ``tritonclient`` (normalised as pip does)."""
    name = re.split(r"[\[=<>!~;\s]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def owned_by_ngc(requirement: str) -> bool:
    name = name_of(requirement)
    return name not in NOT_OWNED and NGC_OWNED.match(name) is not None


def requirements(pyproject: dict) -> list[str]:
    project = pyproject["project"]
    wanted = list(project["dependencies"])
    for extra in EXTRAS:
        wanted += project["optional-dependencies"][extra]
    return [r for r in wanted if not owned_by_ngc(r)]


def constraints(lock_text: str) -> list[str]:
    kept = []
    for line in lock_text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or not owned_by_ngc(stripped):
            kept.append(line)
    return kept


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: ngc_requirements.py PYPROJECT CONSTRAINTS OUT_DIR", file=sys.stderr)
        return 2
    pyproject = tomllib.loads(Path(argv[1]).read_text())
    out = Path(argv[3])
    out.mkdir(parents=True, exist_ok=True)
    (out / "requirements.txt").write_text("\n".join(requirements(pyproject)) + "\n")
    (out / "constraints.txt").write_text("\n".join(constraints(Path(argv[2]).read_text())) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
