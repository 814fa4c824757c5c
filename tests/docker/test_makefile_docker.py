"""The Makefile's Docker section: targets exist and are phony, and their dry runs
(`make -n`) build with the matrix's build args and run real `mme` commands."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mme import versions
from tests.docker.conftest import (
    REPO,
    docker_commands,
    make_dry_run,
    option_value,
    parse_mme,
)

TARGETS = ("docker-build", "docker-build-job", "docker-package", "docker-serve", "docker-bench")
MAKEFILE = (REPO / "Makefile").read_text()


def build_arg_values(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, arg in enumerate(argv[:-1]) if arg == "--build-arg")


def after_image(argv: list[str], image: str) -> list[str]:
    return argv[argv.index(image) + 1:]


def test_docker_section_is_marked_and_its_targets_are_phony_and_documented():
    section = MAKEFILE[MAKEFILE.index("# --- Docker (GPU hosts) ---"):]
    phony = set()
    for line in section.splitlines():
        if line.startswith(".PHONY:"):
            phony.update(line.split(":", 1)[1].split())
    for target in TARGETS:
        assert re.search(rf"^{target}:.*## ", section, re.MULTILINE), f"{target} missing or without a ## help text"
        assert target in phony


@pytest.mark.parametrize("release_name", [None, "24.09"])
def test_docker_build_builds_every_image_with_the_matrix_build_args(release_name):
    extra = [f"TRITON_RELEASE={release_name}"] if release_name else []
    builds = docker_commands(make_dry_run("docker-build", *extra), "build")
    rel = versions.release(release_name)
    by_file = {option_value(argv, "-f"): argv for argv in builds}
    assert set(by_file) == {f"docker/{image}/Dockerfile" for image in ("builder", "serving", "bench")}
    for image in ("builder", "serving", "bench"):
        argv = by_file[f"docker/{image}/Dockerfile"]
        assert build_arg_values(argv) == versions.build_args(image, rel.name)
        assert option_value(argv, "-t") == f"mme-{image}:{rel.name}"
        assert argv[-1] == "."  # the repository is the context (.dockerignore applies)


def test_docker_build_job_builds_the_builder_then_its_sagemaker_job_image():
    rel = versions.release()
    builds = docker_commands(make_dry_run("docker-build-job"), "build")
    assert [option_value(argv, "-f") for argv in builds] == ["docker/builder/Dockerfile", "docker/builder/job.Dockerfile"]
    job = builds[1]
    assert option_value(job, "--build-arg") == f"BUILDER_IMAGE=mme-builder:{rel.name}"
    assert option_value(job, "-t") == f"mme-builder:{rel.name}-sagemaker" and job[-1] == "."


def test_docker_package_runs_the_users_mme_package_in_the_builder_on_the_gpu():
    runs = docker_commands(make_dry_run("docker-package", "MODEL=resnet50"), "run")
    assert len(runs) == 1
    argv = runs[0]
    rel = versions.release()
    assert option_value(argv, "--gpus") == "all"
    out = str((REPO / "artifacts").resolve())
    assert f"{out}:/artifacts" in [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-v"]
    args = after_image(argv, f"mme-builder:{rel.name}")
    assert args[:2] == ["package", "resnet50"]
    parsed = parse_mme(args)
    assert str(parsed.out) == "/artifacts"
    assert parsed.triton_release == rel.name
    assert {"torchscript", "onnx", "tensorrt", "torch-tensorrt"} <= set(parsed.formats.split(","))


def test_docker_package_passes_the_users_extra_arguments_through():
    argv = docker_commands(make_dry_run("docker-package", "MODEL=bert-base-uncased",
                                        "ARGS=--seq-len 64 --precision fp16"), "run")[0]
    args = after_image(argv, f"mme-builder:{versions.release().name}")
    parsed = parse_mme(args)
    assert parsed.model == "bert-base-uncased" and parsed.seq_len == 64 and parsed.precision == "fp16"


def test_docker_serve_checks_plans_then_runs_mme_serve_on_the_system_triton():
    lines = make_dry_run("docker-serve", "MODEL=resnet50")
    rel = versions.release()
    assert any(f"packager.compat --release {rel.name}" in " ".join(argv) for argv in lines)
    runs = docker_commands(lines, "run")
    assert len(runs) == 1
    argv = runs[0]
    assert option_value(argv, "--gpus") == "all"
    assert option_value(argv, "-p") == "127.0.0.1:8080:8080"
    models = str((REPO / "artifacts" / "resnet50" / "tensorrt").resolve())
    assert f"{models}:/models:ro" in argv
    args = after_image(argv, f"mme-serving:{rel.name}")
    assert args[0] == "serve" and option_value(args, "--server") == "system"
    parsed = parse_mme(args)
    assert parsed.models == "/models" and parsed.host == "0.0.0.0" and parsed.port == 8080 and parsed.server == "system"


def test_docker_bench_runs_mme_bench_in_the_bench_image():
    runs = docker_commands(make_dry_run("docker-bench", "BENCH_ARGS=--endpoint local --endpoint-url http://127.0.0.1:8080 "
                                        "--artifact artifacts/resnet50/tensorrt"), "run")
    assert len(runs) == 1
    argv = runs[0]
    assert option_value(argv, "--network") == "host"
    mounts = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-v"]
    assert f"{(REPO / 'artifacts').resolve()}:/work/artifacts:ro" in mounts
    assert f"{(REPO / 'results').resolve()}:/work/results" in mounts
    args = after_image(argv, f"mme-bench:{versions.release().name}")
    assert args[0] == "bench"
    parsed = parse_mme(args)
    assert parsed.endpoint_url == "http://127.0.0.1:8080" and parsed.artifact == "artifacts/resnet50/tensorrt"
    worker = docker_commands(make_dry_run("docker-bench", "BENCH_CMD=bench-worker", "BENCH_ARGS=--master-host 10.0.0.5"),
                             "run")[0]
    parsed = parse_mme(after_image(worker, f"mme-bench:{versions.release().name}"))
    assert parsed.command == "bench-worker" and parsed.master_host == "10.0.0.5"


def test_existing_targets_are_untouched_by_the_section():
    head = MAKEFILE[:MAKEFILE.index("# --- Docker (GPU hosts) ---")]
    for target in ("install", "package", "demo", "test", "test-gpu", "lock", "clean"):
        assert re.search(rf"^{target}:", head, re.MULTILINE)


# -- the host's Python: the Docker targets read mme/versions.toml with it ------------------------

# Makes this interpreter behave as Ubuntu 22.04's python3 (3.10.12) does for the Makefile: it
# reports 3.10, and `import tomllib` fails with 3.10's ModuleNotFoundError. FAKE_TOMLI=1: the
# tomli package is installed (the API tomllib was taken from).
FAKE_310_SITECUSTOMIZE = '''
import os
import sys
from importlib.machinery import PathFinder

if os.environ.get("FAKE_TOMLI"):
    import tomllib
    sys.modules["tomli"] = sys.modules.pop("tomllib")
for _name in [m for m in sys.modules if m == "tomllib" or m.startswith("tomllib.")]:
    del sys.modules[_name]  # imported before this file ran (coverage's start-up reads pyproject.toml in CI)
sys.version_info = (3, 10, 12, "final", 0)
sys.version = "3.10.12 (main, Nov 20 2023, 15:14:05) [GCC 11.4.0]"
_find_spec = PathFinder.find_spec.__func__

def find_spec(cls, name, path=None, target=None):
    if name in ("tomllib", "tomli"):
        return None
    return _find_spec(cls, name, path, target)

PathFinder.find_spec = classmethod(find_spec)
'''


def fake_python310(tmp_path: Path, tomli: bool = False) -> dict[str, str]:
    """An environment whose PATH starts with a `python3` that is Python 3.10 without tomllib."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(FAKE_310_SITECUSTOMIZE)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python3 = bin_dir / "python3"
    python3.write_text(f'#!/bin/sh\nPYTHONPATH={shim} exec {sys.executable} "$@"\n')
    python3.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "MAKE"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    if tomli:
        env["FAKE_TOMLI"] = "1"
    return env


def make(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    return subprocess.run(["make", "--no-print-directory", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_the_fake_python_is_310_without_tomllib(tmp_path):
    env = fake_python310(tmp_path)
    done = subprocess.run(["python3", "-c", "import sys; print(sys.version_info[:2]); import tomllib"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.strip() == "(3, 10)"
    assert done.returncode == 1 and done.stderr.strip().endswith("ModuleNotFoundError: No module named 'tomllib'")


@pytest.mark.parametrize("target", ["docker-build", "docker-package", "docker-bench"])
@pytest.mark.parametrize("dry_run", ["-n", "DOCKER=echo"])
def test_docker_targets_on_python_310_stop_with_one_line_saying_what_they_need(tmp_path, target, dry_run):
    # No .venv (VENV points nowhere), so the targets read the matrix with the host's python3.
    done = make([dry_run, target, f"VENV={tmp_path / 'no-venv'}"], env=fake_python310(tmp_path))
    assert done.returncode != 0
    assert "docker " not in done.stdout and "mme-" not in done.stdout, "nothing may run with an empty tag"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert (f"make {target} needs Python 3.11+, or 3.10 with tomli, to read mme/versions.toml "
            "(found 3.10 at python3): pass PYTHON=python3.11, or install tomli for it") in lines[0]


def test_docker_targets_work_on_python_310_with_tomli(tmp_path):
    builds = docker_commands([shlex.split(line) for line in make(
        ["-n", "docker-build", f"VENV={tmp_path / 'no-venv'}"], env=fake_python310(tmp_path, tomli=True)).stdout.splitlines()],
        "build")
    rel = versions.release()
    assert [option_value(argv, "-t") for argv in builds] == [f"mme-{image}:{rel.name}" for image in ("builder", "serving", "bench")]
    assert build_arg_values(builds[0]) == versions.build_args("builder", rel.name)


def test_python_m_mme_versions_on_310_says_what_it_needs(tmp_path):
    done = subprocess.run(["python3", "-m", "mme.versions", "--get", "name"], cwd=REPO, env=fake_python310(tmp_path),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and not done.stdout
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(
        "mme.versions: error: reading mme/versions.toml needs Python 3.11+ (tomllib) or the tomli package; ")
    assert "is Python 3.10: run it with Python 3.11+" in done.stderr


def test_docker_targets_without_any_python_or_with_an_unknown_release_stop_with_one_line(tmp_path):
    missing = make(["-n", "docker-build", f"VENV={tmp_path / 'no-venv'}", f"PYTHON={tmp_path / 'python3'}"])
    assert missing.returncode != 0 and not missing.stdout
    assert len(missing.stderr.strip().splitlines()) == 1
    assert f"(found no Python 3 at {tmp_path / 'python3'}): pass PYTHON=python3.11." in missing.stderr
    unknown = make(["-n", "docker-build", "TRITON_RELEASE=99.99"])
    assert unknown.returncode != 0 and not unknown.stdout
    assert len(unknown.stderr.strip().splitlines()) == 1
    assert "make docker-build: mme.versions: error: unknown Triton release '99.99'; known releases: " in unknown.stderr


def test_docker_serve_with_a_python_without_the_projects_packages_says_what_the_engine_check_needs(tmp_path):
    bare = tmp_path / "python3"  # the standard library only (-S: no site-packages), as a fresh host's python3
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    models = tmp_path / "resnet50" / "tensorrt"
    models.mkdir(parents=True)
    done = make(["docker-serve", f"SERVE_MODELS={models}", f"VENV={tmp_path / 'no-venv'}", f"PYTHON={bare}", "DOCKER=echo"])
    assert done.returncode != 0
    assert "run --rm" not in done.stdout, "the serving image must not start before the engines are checked"
    assert (f"make docker-serve: checking the engines in {models} runs packager.compat, which needs the project's "
            f"packages (numpy, ...) in {bare}: run make install PYTHON=python3.11 first") in done.stderr.splitlines()
