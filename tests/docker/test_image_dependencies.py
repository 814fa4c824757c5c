"""The lean images (serving, bench) install mme with --no-deps plus
docker/<image>/requirements.txt. Here, in a fresh interpreter where every installed
package outside that set's dependency closure is made unimportable, the image's commands
must still parse and their modules import: `mme serve` without torch, `mme bench` without
torch or Triton."""

from __future__ import annotations

import pytest

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.docker.conftest import DOCKER_DIR, REPO

OWN_PACKAGES = {"mme", "packager", "serving", "bench", "tests"}

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def requirement_lines(image: str) -> list[str]:
    lines = (DOCKER_DIR / image / "requirements.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def dependency_closure(requirements: list[str]) -> set[str]:
    """Canonical names of the distributions ``pip install -r`` would bring, as far as this
    environment's metadata tells (markers evaluated for this interpreter)."""
    todo = [Requirement(line) for line in requirements]
    seen: set[tuple[str, frozenset[str]]] = set()
    names: set[str] = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        key = (name, frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        names.add(name)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        extras = set(req.extras) | {""}
        for spec in dist.requires or []:
            dep = Requirement(spec)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in extras):
                todo.append(dep)
    return names


def site_packages() -> Path:
    import numpy

    return Path(numpy.__file__).resolve().parents[1]


def image_site(tmp_path: Path, allowed_dists: set[str]) -> Path:
    """A site-packages holding only ``allowed_dists`` (symlinks into this environment's)."""
    source = site_packages()
    target = tmp_path / "site-packages"
    target.mkdir()
    for dist in importlib.metadata.distributions():
        if canonicalize_name(dist.metadata["Name"]) not in allowed_dists:
            continue
        for file in dist.files or []:
            top = file.parts[0]
            if top == ".." or top in OWN_PACKAGES or (target / top).exists():
                continue
            if (source / top).exists():
                (target / top).symlink_to(source / top)
    return target


def run_in_image_site(site: Path, code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter that sees the standard library, ``site`` and this
    repository only (-S: this environment's site-packages stay out)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(site)])
    return subprocess.run([sys.executable, "-S", "-c", textwrap.dedent(code)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_image_site_holds_the_closure_only(tmp_path):
    site = image_site(tmp_path, dependency_closure(requirement_lines("serving")))
    names = {p.name for p in site.iterdir()}
    assert {"aiohttp", "uvicorn", "httptools", "numpy", "tritonclient", "onnxruntime"} <= names
    assert not names & {"torch", "timm", "transformers", "locust"}
    done = run_in_image_site(site, "import importlib.util; print(importlib.util.find_spec('torch'))")
    assert done.stdout.strip() == "None", done.stderr


def test_serving_image_starts_the_front_without_torch(tmp_path):
    site = image_site(tmp_path, dependency_closure(requirement_lines("serving")))
    # nvidia-ml-py (GPU memory readings) is in the image; here only where the gpu extra is installed.
    nvml = "import pynvml" if importlib.util.find_spec("pynvml") else "pass"
    done = run_in_image_site(site, """
        from mme.cli import build_parser
        args = build_parser().parse_args(["serve", "--models", "/models", "--host", "0.0.0.0", "--port", "8080"])
        assert args.command == "serve"
        build_parser().parse_args(["capacity", "/models"])
        import serving.runtime.local_endpoint, sizing.capacity, serving.monitor.memory, serving.triton.factory
        import serving.triton.system, serving.triton.docker, serving.triton.local
        import packager.compat
        import numpy, onnxruntime  # what the python backend's cpu-local model.py imports
        NVML
        print("ok")
    """.replace("NVML", nvml))
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


def test_bench_image_runs_the_load_generator_and_reports_without_torch(tmp_path):
    site = image_site(tmp_path, dependency_closure(requirement_lines("bench")))
    names = {p.name for p in site.iterdir()}
    assert "locust" in names and not names & {"torch", "tritonclient", "onnxruntime"}
    # The mme process: parse the command, build reports.
    cli = run_in_image_site(site, """
        from mme.cli import build_parser
        args = build_parser().parse_args(["bench", "--endpoint", "local", "--endpoint-url", "http://127.0.0.1:8080"])
        assert args.command == "bench"
        import bench.report, bench.analysis, bench.charts, bench.render
        import matplotlib.figure  # imported lazily by the charts
        print("ok")
    """)
    assert cli.returncode == 0 and "ok" in cli.stdout, cli.stderr[-3000:]
    # The generator process (python -m bench.run): Locust, gevent monkey-patched first.
    generator = run_in_image_site(site, """
        import importlib, pkgutil
        import bench.run  # patches the standard library before anything else
        import bench
        for module in pkgutil.iter_modules(bench.__path__):
            importlib.import_module(f"bench.{module.name}")
        import botocore.auth, geventhttpclient
        print("ok")
    """)
    assert generator.returncode == 0 and "ok" in generator.stdout, generator.stderr[-3000:]
