"""The Makefile's Docker section: targets exist and are phony, and their dry runs
(`make -n`) build with the matrix's build args and run real `mme` commands."""

from __future__ import annotations

import re

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
