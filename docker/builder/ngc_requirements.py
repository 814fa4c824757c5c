"""What the builder image installs around NVIDIA's PyTorch image (standard library only).

The builder keeps the NGC image's own torch, torchvision, Torch-TensorRT, TensorRT and CUDA
libraries: Triton's libtorch backend of the same release is built from that torch and links
that Torch-TensorRT, so modules built with PyPI's would not load (engine ABI), and TensorRT
plans must come from the release's TensorRT. It also keeps every other distribution the NGC
image ships (numpy, protobuf, onnx, cuda-bindings, ...): NGC's torch, TensorRT and their tools
were built and tested against those versions (a numpy 2 over extensions built for numpy 1 fails
at import), while the project's lock (constraints.txt) was resolved on a CPU machine for PyPI's
torch. Everything else the project needs is installed with the project's pins:

    python -m pip list --format=json > base.json        # the NGC image, before the install
    python ngc_requirements.py pyproject.toml constraints.txt OUT_DIR --installed base.json

writes ``OUT_DIR/requirements.txt`` (the project's dependencies plus its ``dev`` and ``gpu``
extras, less what the NGC image owns; a requirement on a distribution the image ships loses
its pin), ``OUT_DIR/constraints.txt`` (the lock, less the same, with the image's version
pinned for each distribution the image ships at another version) and ``OUT_DIR/kept.txt``
(those distributions: the image's version and the lock's). pip then keeps each of them, or
fails the build naming the dependency that needs another version. After the install,

    python -m pip list --format=json > installed.json
    python ngc_requirements.py --check base.json installed.json

fails the build, listing them, if any distribution of the image changed version or went
away, and ``python -m mme.versions --check-installed`` fails it if the image's torch,
Torch-TensorRT and TensorRT are not the release's.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from pathlib import Path

EXTRAS = ("dev", "gpu")
# Distributions the NGC PyTorch image provides and the builder must keep, whether or not they
# are pip distributions there (its CUDA libraries are system libraries, not nvidia-* wheels).
NGC_OWNED = re.compile(r"^(torch|torchvision|torchaudio|triton|pytorch-triton|torch-tensorrt|tensorrt(-.*)?|nvidia-.*)$")
# Ours, although their names look like NVIDIA's libraries.
NOT_OWNED = {"nvidia-ml-py", "nvidia-pytriton"}
# A requirement line: name, extras, version specifiers, marker.
REQUIREMENT = re.compile(r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?P<extras>\[[^\]]*\])?\s*(?P<spec>[^;]*?)\s*(?P<marker>;.*)?$")


def canonical(name: str) -> str:
    """The name as pip compares it (PEP 503): ``Jinja2`` and ``typing_extensions`` -> ``jinja2``, ``typing-extensions``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def name_of(requirement: str) -> str:
    """``tritonclient[http,grpc]==2.73.0`` -> ``tritonclient`` (normalised as pip does)."""
    return canonical(re.split(r"[\[=<>!~;\s]", requirement.strip(), maxsplit=1)[0])


def pinned_version(requirement: str) -> str | None:
    """The version of an exact pin (``onnx==1.23.2`` -> ``1.23.2``), else None."""
    match = REQUIREMENT.match(requirement)
    spec = match.group("spec").strip() if match else ""
    return spec[2:].strip() if spec.startswith("==") and "," not in spec and "*" not in spec else None


def owned_by_ngc(requirement: str) -> bool:
    name = name_of(requirement)
    return name not in NOT_OWNED and NGC_OWNED.match(name) is not None


def installed_versions(pip_list_json: str) -> dict[str, tuple[str, str]]:
    """``pip list --format=json`` -> {canonical name: (name as listed, version)}."""
    return {canonical(d["name"]): (d["name"], d["version"]) for d in json.loads(pip_list_json)}


def kept_from_base(wanted: list[str], lock_text: str, installed: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """The distributions the base image ships that the project's install would change: pinned at
    another version by the lock or by a requirement. {name: (the image's version, the lock's)}."""
    kept: dict[str, tuple[str, str]] = {}
    pins = [line.strip() for line in lock_text.splitlines() if line.strip() and not line.strip().startswith("#")]
    for line in pins + wanted:
        name, version = name_of(line), pinned_version(line)
        if name in installed and version is not None and not owned_by_ngc(line) and version != installed[name][1]:
            kept.setdefault(name, (installed[name][1], version))
    return dict(sorted(kept.items()))


def unpinned(requirement: str) -> str:
    """``onnx==1.23.2 ; python_version < "4"`` -> ``onnx ; python_version < "4"`` (extras kept)."""
    match = REQUIREMENT.match(requirement)
    if match is None:
        return requirement
    return match.group("name") + (match.group("extras") or "") + (" " + match.group("marker") if match.group("marker") else "")


def requirements(pyproject: dict, kept: dict[str, tuple[str, str]] | None = None) -> list[str]:
    project = pyproject["project"]
    wanted = list(project["dependencies"])
    for extra in EXTRAS:
        wanted += project["optional-dependencies"][extra]
    kept = kept or {}
    return [unpinned(r) if name_of(r) in kept else r for r in wanted if not owned_by_ngc(r)]


def constraints(lock_text: str, kept: dict[str, tuple[str, str]] | None = None,
                installed: dict[str, tuple[str, str]] | None = None) -> list[str]:
    kept, installed = kept or {}, installed or {}
    lines = []
    for line in lock_text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            lines.append(line)
        elif not owned_by_ngc(stripped) and name_of(stripped) not in kept:
            lines.append(line)
    for name, (version, lock) in kept.items():
        lines.append(f"{installed[name][0] if name in installed else name}=={version}  # the base image's (lock: {lock})")
    return lines


def changed(before: dict[str, tuple[str, str]], after: dict[str, tuple[str, str]]) -> list[str]:
    """Each distribution of ``before`` whose version is not the same in ``after``."""
    problems = []
    for name, (listed, version) in sorted(before.items()):
        if name not in after:
            problems.append(f"{listed} {version} removed")
        elif after[name][1] != version:
            problems.append(f"{listed} {version} -> {after[name][1]}")
    return problems


def write(pyproject_path: Path, lock_path: Path, out: Path, installed_path: Path | None) -> int:
    pyproject = tomllib.loads(pyproject_path.read_text())
    lock_text = lock_path.read_text()
    installed = installed_versions(installed_path.read_text()) if installed_path else {}
    kept = kept_from_base(requirements(pyproject), lock_text, installed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "requirements.txt").write_text("\n".join(requirements(pyproject, kept)) + "\n")
    (out / "constraints.txt").write_text("\n".join(constraints(lock_text, kept, installed)) + "\n")
    report = [f"{installed[name][0]} {version} (lock: {lock})" for name, (version, lock) in kept.items()]
    (out / "kept.txt").write_text("".join(line + "\n" for line in report))
    if report:
        print(f"ngc_requirements.py: keeping the base image's version of {len(report)} distributions the lock pins "
              f"otherwise: {', '.join(report)}")
    return 0


def check(before_path: Path, after_path: Path) -> int:
    problems = changed(installed_versions(before_path.read_text()), installed_versions(after_path.read_text()))
    if problems:
        print(f"ngc_requirements.py: error: the install changed {len(problems)} distributions the base image ships: "
              f"{', '.join(problems)}; a dependency needs a version the image does not ship (pip's log above names "
              f"it): pin that dependency to a release that accepts the image's, or build on a newer PyTorch container",
              file=sys.stderr)
        return 1
    print(f"ok: the {len(installed_versions(before_path.read_text()))} distributions the base image ships are unchanged")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ngc_requirements.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", nargs=2, metavar=("BEFORE", "AFTER"),
                        help="fail unless every distribution of BEFORE (pip list --format=json) has its version in AFTER")
    parser.add_argument("--installed", type=Path, metavar="PIP_LIST_JSON",
                        help="the base image's `pip list --format=json`: keep its versions")
    parser.add_argument("paths", nargs="*", type=Path, metavar="PYPROJECT CONSTRAINTS OUT_DIR")
    args = parser.parse_args(argv[1:])
    if args.check:
        if args.paths or args.installed:
            parser.error("--check takes BEFORE and AFTER only")
        return check(Path(args.check[0]), Path(args.check[1]))
    if len(args.paths) != 3:
        parser.error("give PYPROJECT CONSTRAINTS OUT_DIR (or --check BEFORE AFTER)")
    return write(*args.paths, args.installed)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
