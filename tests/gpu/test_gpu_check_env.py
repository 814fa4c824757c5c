"""The GPU check cannot rot silently: its CPU dry run runs, end to end, in an environment that
holds only what the lent GPU host's image lists (tests/gpu/lent-host.toml) plus the wheels the
check carries there (tests/gpu/wheels.txt), and those wheels with the repository fit the
device's 64 MiB.

The environment is a virtual environment of this Python whose site-packages is a farm of
links to the allowed distributions of this checkout's .venv (their modules and metadata): an
import of anything else fails there as it would on the lent host, the `mme package` child and
Triton's python stub included. Versions are this checkout's, not the image's (the image's are
listed where known): what this checks is that nothing outside the set is needed. `unrelied`
packages (grpcio: the image's version is unread and tritonclient.grpc refuses older ones) are
left out, so the code's fallbacks run: ISA-L -> zlib, tritonclient.grpc -> model_config.desc.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.docker.conftest import REPO

GPU = REPO / "tests" / "gpu"
DEVICE_LIMIT = 64 << 20  # the device tool's limit on what travels in one call

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lent_host() -> dict:
    return tomllib.loads((GPU / "lent-host.toml").read_text())


def carried_wheels() -> list[str]:
    lines = (GPU / "wheels.txt").read_text().splitlines()
    return [n for n in (line.split("#", 1)[0].strip() for line in lines) if n]


def requirements_closure(names: set[str]) -> set[str]:
    """``names`` and, transitively, what their installed versions here require (for this
    Python, no extras), among the installed distributions."""
    from packaging.requirements import Requirement

    installed = {_norm(d.metadata["Name"] or ""): d for d in importlib.metadata.distributions()}
    seen, todo = set(), [n for n in names if n in installed]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in installed[name].requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                dep = _norm(req.name)
                if dep in installed and dep not in seen:
                    todo.append(dep)
    return seen


def allowed_distributions() -> set[str]:
    """The image's packages (with what their versions here require: the image is consistent
    with its own versions, ours may need more, as huggingface_hub 2 needs httpx2), less the
    unrelied ones, and the carried wheels alone (what they need must be listed)."""
    host = lent_host()
    unrelied = {_norm(n) for n in host.get("unrelied", {})}
    image = requirements_closure({_norm(n) for n in host["image"]["packages"]} - unrelied) - unrelied
    return image | {_norm(n) for n in carried_wheels()}


def build_lent_host_env(root: Path, allowed: set[str]) -> tuple[Path, list[str]]:
    """A venv at ``root`` (no pip, no system site-packages) whose site-packages links each
    allowed distribution's top-level files from this Python's environment; its python and the
    allowed names this environment lacks."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next((root / "lib").glob("python3.*/site-packages"))
    found: set[str] = set()
    for dist in importlib.metadata.distributions():
        name = _norm(dist.metadata["Name"] or "")
        if name not in allowed or name in found or not dist.files:
            continue
        found.add(name)
        for top in {f.parts[0] for f in dist.files if f.parts and f.parts[0] not in ("..", "__pycache__")}:
            source, target = Path(str(dist.locate_file(top))), site / top
            if source.exists() and not target.exists():
                target.symlink_to(source)
    return root / "bin" / "python", sorted(allowed - found)


@pytest.fixture(scope="module")
def lent_host_python(tmp_path_factory) -> Path:
    python, missing = build_lent_host_env(tmp_path_factory.mktemp("lent-host-env") / "venv", allowed_distributions())
    for needed in ("torch", "numpy", "tritonclient", "nvidia-pytriton", "protobuf", "timm", "transformers"):
        assert needed not in missing, f"{needed} is neither installed here nor linked: {missing}"
    return python


def test_the_environment_refuses_what_the_lent_host_lacks(lent_host_python):
    probe = ("import importlib.util as u, json; print(json.dumps({m: u.find_spec(m) is not None for m in "
             "['torch', 'tritonclient', 'pytriton', 'isal', 'grpc', 'boto3', 'locust', 'tomli_w', 'moto']}))")
    done = subprocess.run([str(lent_host_python), "-c", probe], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": ""})
    seen = json.loads(done.stdout)
    assert seen == {"torch": True, "tritonclient": True, "pytriton": True, "isal": False, "grpc": False,
                    "boto3": False, "locust": False, "tomli_w": False, "moto": False}


def test_the_dry_run_runs_with_only_the_lent_hosts_packages(lent_host_python, tmp_path):
    """Every step of `mme gpu-check run --device cpu`, the wheel's Triton serving copies
    included, with nothing the lent host lacks; the report written after every step, and the
    dry run's exit code says there was no GPU unless --allow-no-gpu."""
    out = tmp_path / "out"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    argv = [str(lent_host_python), "-m", "mme", "gpu-check", "run", "--device", "cpu", "--out", str(out),
            "--model", "test_resnet", "--batches", "1,2", "--iters", "3", "--warmup", "1", "--limit", "1536M",
            "--max-copies", "3", "--triton-max-copies", "2", "--encoder", "distilbert-base-uncased", "--seq-len", "16"]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    log = done.stdout[-4000:] + done.stderr[-4000:]
    assert done.returncode == 4, log  # no GPU: the dry run says so in its exit code
    assert "no GPU: this was a CPU dry run" in done.stdout
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["complete"] is True and report["exit_code"] == 4 and report["device"] == "cpu"
    steps = {s["name"].split(".")[0]: s for s in report["steps"]}
    assert {k: steps[k]["status"] for k in steps} == {"1": "ran", "2": "ran", "3": "ran", "4": "ran", "5": "skipped",
                                                     "6": "ran"}, log
    # The fallbacks ran: no ISA-L and no gRPC on the lent host.
    facts = report["facts"]
    assert facts["gzip"] == "zlib" and facts["config_schema"].startswith("model_config.desc"), facts
    assert any(line.startswith("tarballs gzip through zlib") for line in report["preflight"])
    assert report["headlines"][0].startswith("NO GPU: a CPU dry run")
    # Step 2: the wheel's Triton served copies (python backend), compared with PyTorch.
    triton = steps["2"]["figures"]
    assert triton["one_copy"]["output_shape"] == [2, 1000] and triton["one_copy"]["max_abs_diff_vs_pytorch"] < 1e-4
    assert 1 <= triton["actual_copies"] <= 2 and triton["projections"].startswith("none")
    # Step 3: TF32 off and on, each recorded with its settings.
    latency = steps["3"]["figures"]
    assert set(latency["latency_ms_fp32"]) == set(latency["latency_ms_tf32"]) == {"1", "2"}
    assert set(latency["math_fp32"].values()) == {"ieee"} and set(latency["math_tf32"].values()) == {"tf32"}
    # Step 4: copies until a stop, first copy apart, labelled.
    copies = steps["4"]["figures"]
    assert copies["copies_loaded"] == 3 and copies["stopped_by"] == "max copies"
    assert copies["first_copy_mib"] == copies["deltas_mib"][0] and copies["counted"].startswith("host RSS")
    assert steps["6"]["figures"]["max_abs_diff_vs_cpu"] < 1e-4
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted(["facts.json", "gpu_check.json", "gpu_check.md", triton["report"]])
    # And --allow-no-gpu turns the dry run's "no GPU" into success, for CI.
    again = subprocess.run([*argv[:4], "preflight"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "config.pbtxt schema from model_config.desc" in again.stdout


def test_the_carried_wheels_and_the_repository_fit_the_device(tmp_path):
    """What travels to the lent host in one call: the repository's tracked files and the
    wheels `make gpu-check-wheels` downloads (the real download, from the package index)."""
    lock = {_norm(line.split("==")[0]) for line in (REPO / "constraints.txt").read_text().splitlines() if "==" in line}
    assert all(_norm(n) in lock for n in carried_wheels()), "every carried wheel is pinned in constraints.txt"
    wheels = tmp_path / "whl"
    done = subprocess.run(["bash", str(GPU / "gpu_check.sh"), "--download-wheels", str(wheels)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    got = {_norm(p.name.split("-")[0]) for p in wheels.glob("*.whl")}
    assert got == {_norm(n) for n in carried_wheels()}
    wheel_bytes = sum(p.stat().st_size for p in wheels.glob("*.whl"))
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    repo_bytes = sum((REPO / os.fsdecode(f)).stat().st_size for f in tracked if f and (REPO / os.fsdecode(f)).is_file())
    total = wheel_bytes + repo_bytes
    print(f"carried: wheels {wheel_bytes / 2**20:.1f} MiB + repository {repo_bytes / 2**20:.1f} MiB = "
          f"{total / 2**20:.1f} MiB of {DEVICE_LIMIT / 2**20:.0f} MiB")
    assert total <= DEVICE_LIMIT, f"{total / 2**20:.1f} MiB travels: over the device's 64 MiB"
