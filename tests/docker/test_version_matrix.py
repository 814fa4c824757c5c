"""mme/versions.toml: one row per release with every field; the default release is the
newest SageMaker serves whose CUDA a SageMaker host image runs natively, and its TensorRT is the
gpu extra's; releases without a SageMaker image are refused for SageMaker; the loader's API
(release(), Release.to_dict()) still works."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import pytest

from mme import versions
from mme.errors import UsageError
from packager.formats.base import ExportOptions
from packager.formats.onnx_format import MIN_OPSET
from tests.docker.conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# Releases whose Triton is built on an earlier month's NGC containers (server rYY.MM build.py
# upstream_container_version).
UPSTREAM = {"26.05": "26.04"}


def gpu_extra_pin(prefix: str) -> str:
    for spec in PYPROJECT["project"]["optional-dependencies"]["gpu"]:
        name, _, version = spec.partition("==")
        if name.startswith(prefix):
            return version
    raise AssertionError(f"no {prefix}* pin in the gpu extra")


@pytest.mark.parametrize("rel", versions.releases(), ids=lambda r: r.name)
def test_every_release_records_every_field(rel):
    for key in versions.FIELDS:
        if key in ("sagemaker", "unverified"):
            continue
        assert getattr(rel, key) not in (None, ""), f"release {rel.name} lacks {key}"
    assert isinstance(rel.sagemaker, bool)
    assert set(rel.unverified) <= set(versions.FIELDS)
    assert re.fullmatch(r"\d+\.\d+", rel.min_compute_capability)
    assert re.fullmatch(r"\d+", rel.torch_tensorrt_abi)
    assert re.fullmatch(r"\d+\.\d+\.\d+\w*(\+\w+)?", rel.torch) and re.fullmatch(r"\d+\.\d+\.\d+\w*", rel.torch_tensorrt)
    month = rel.name
    assert rel.triton_container == f"nvcr.io/nvidia/tritonserver:{month}-py3"
    # The PyTorch image Triton's build takes its libtorch (and TensorRT) from: the same month, or
    # the upstream month its build.py names (r26.05 builds on 26.04's containers).
    assert rel.pytorch_container == f"nvcr.io/nvidia/pytorch:{UPSTREAM.get(month, month)}-py3"
    assert rel.sagemaker_image.endswith(f":{month}-py3")
    assert re.fullmatch(r"2\.\d+\.\d+", rel.triton_server)
    assert re.fullmatch(r"\d+\.\d+(\.\d+){0,2}", rel.tensorrt)
    assert re.fullmatch(r"\d+\.\d+\.\d+", rel.cuda)
    assert re.fullmatch(r"3\.\d+", rel.python)
    assert isinstance(rel.onnx_opset, int) and rel.onnx_opset >= MIN_OPSET
    assert re.fullmatch(r"\d{3}\.\d+\.\d+", rel.min_driver)


def runs_natively_somewhere(rel) -> bool:
    """Some SageMaker host image (InferenceAmiVersion) runs the release's CUDA natively."""
    from mme.hosts import NATIVE, compat, nvidia_amis

    return any(compat(rel.cuda, host, None).how == NATIVE for host in nvidia_amis())


def test_default_release_is_the_newest_sagemaker_release_a_host_image_runs_natively():
    default = versions.release()
    assert default.sagemaker, f"the default release {default.name} has no SageMaker Triton image"
    assert default == next(r for r in versions.sagemaker_releases() if runs_natively_somewhere(r))
    assert not versions.release("26.07").sagemaker  # AWS publishes no 26.07 image: self-hosted only
    # 26.05 and 26.04 are served too, newer than the default: CUDA 13.2 runs on the newest AMI
    # (driver 580, CUDA 13.0) only by minor-version compatibility.
    newer = [r.name for r in versions.sagemaker_releases()][: [r.name for r in versions.sagemaker_releases()].index(default.name)]
    assert newer == ["26.05", "26.04"] and not any(runs_natively_somewhere(versions.release(n)) for n in newer)
    # None of the three carries TensorRT 11 (the FP16 builder flag stays): TensorRT did not decide.
    assert all(versions.release(n).tensorrt.startswith("10.") for n in (*newer, default.name))


def test_a_release_without_a_sagemaker_image_is_refused_unless_the_user_brings_one():
    with pytest.raises(versions.NoSageMakerImageError) as info:
        versions.require_sagemaker_image(versions.release("26.07"))
    message = str(info.value)
    assert "AWS publishes no SageMaker Triton image for release 26.07" in message
    assert "--triton-release 25.09" in message and "--image-uri" in message and "\n" not in message
    versions.require_sagemaker_image(versions.release("26.07"), "123.dkr.ecr.us-east-1.amazonaws.com/mine:26.07")
    versions.require_sagemaker_image(versions.release("25.09"))


def test_default_release_serves_the_tensorrt_the_gpu_extra_installs():
    default = versions.release()
    pin = gpu_extra_pin("tensorrt")
    assert versions.same_tensorrt(pin, default.tensorrt), (
        f"the gpu extra installs TensorRT {pin} but the default release {default.name} runs {default.tensorrt}: "
        "plans built by `mme package` would not load in the default serving image"
    )


def test_default_release_python_is_one_mme_supports_and_its_opset_is_the_packagers():
    default = versions.release()
    lo, hi = re.fullmatch(r">=(3\.\d+),<(3\.\d+)", PYPROJECT["project"]["requires-python"]).groups()
    as_tuple = lambda v: tuple(int(x) for x in v.split("."))  # noqa: E731
    assert as_tuple(lo) <= as_tuple(default.python) < as_tuple(hi)
    assert default.onnx_opset == ExportOptions().opset


def test_loader_api_is_unchanged_for_existing_callers():
    old = versions.release("22.10")
    assert (old.triton_container, old.sagemaker_image, old.triton_server) == (
        "nvcr.io/nvidia/tritonserver:22.10-py3", "sagemaker-tritonserver:22.10-py3", "2.27.0")
    data = old.to_dict()
    assert {"release", "triton_container", "sagemaker_image", "triton_server"} <= set(data)
    assert data["release"] == "22.10" and data["tensorrt"] == old.tensorrt and data["sagemaker"] is True
    assert versions.release().name == versions.default_release_name()
    with pytest.raises(UsageError, match="unknown Triton release '19.01'"):
        versions.release("19.01")
    # A Release built by hand with the original four fields still works.
    assert versions.Release("x", "a", "b", "c").to_dict() == {
        "release": "x", "triton_container": "a", "sagemaker_image": "b", "triton_server": "c", "sagemaker": False}


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [("11.1.0.106", "11.1.0", True), ("11.1.0.106", "11.1.0.99", True), ("10.4.0", "10.4.0.26", True),
     ("10.4.0", "10.4.1", False), ("11.1", "11.1.0.106", True), ("11.1.0", "11.2.0", False), ("11", "11.1", False)],
)
def test_same_tensorrt(a, b, same):
    assert versions.same_tensorrt(a, b) is same


def test_releases_with_tensorrt():
    assert [r.name for r in versions.releases_with_tensorrt("10.4.0.26")] == ["24.09"]
    assert [r.name for r in versions.releases_with_tensorrt("10.13.3")] == ["25.09"]
    assert [r.name for r in versions.releases_with_tensorrt("10.15.1.29")] == ["26.05", "26.04"]  # 26.05 is built on 26.04
    assert versions.releases_with_tensorrt("9.9.9") == []


def test_build_args_printer_for_the_makefile():
    done = subprocess.run([sys.executable, "-m", "mme.versions", "--build-args", "--image", "serving", "--release", "24.09"],
                          cwd=REPO, capture_output=True, text=True, check=True)
    tokens = done.stdout.split()
    pairs = dict(tokens[i + 1].split("=", 1) for i in range(0, len(tokens), 2) if tokens[i] == "--build-arg")
    assert pairs == versions.build_args("serving", "24.09")
    assert pairs["TRITON_CONTAINER"] == "nvcr.io/nvidia/tritonserver:24.09-py3"
    get = subprocess.run([sys.executable, "-m", "mme.versions", "--get", "tensorrt"], cwd=REPO,
                         capture_output=True, text=True, check=True)
    assert get.stdout.strip() == versions.release().tensorrt
    bad = subprocess.run([sys.executable, "-m", "mme.versions", "--get", "name", "--release", "1.0"], cwd=REPO,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown Triton release '1.0'" in bad.stderr


def test_the_matrix_module_imports_nothing_heavy():
    done = subprocess.run([sys.executable, "-c", "import sys, mme.versions; print(sorted(m for m in ('torch', 'numpy', 'tensorrt') if m in sys.modules))"],
                          cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_gpu_extra_installs_from_nvidias_index_and_leaves_torch_tensorrt_to_the_builder():
    extra = PYPROJECT["project"]["optional-dependencies"]["gpu"]
    assert not any(spec.startswith("torch-tensorrt") for spec in extra)  # it must match the release's libtorch
    makefile = (REPO / "Makefile").read_text()
    target = makefile.split("\ninstall-gpu:", 1)[1].split("\n\n", 1)[0]
    assert "--extra-index-url $(NVIDIA_INDEX)" in target and ".[dev,gpu]" in target
    assert "NVIDIA_INDEX ?= https://pypi.nvidia.com" in makefile
    readme = (REPO / "README.md").read_text()
    assert "make install-gpu" in readme and "https://pypi.nvidia.com" in readme
