"""Shared fixtures. GPU-marked tests run only where a CUDA GPU is visible."""

from __future__ import annotations

import importlib.util
import os

import pytest

# Tests never reach model hubs: fail fast instead of retrying for half a minute.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run `make test-gpu` on a GPU host)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def test_resnet_cpu_local(tmp_path_factory):
    """timm's tiny test_resnet packaged once per test session in the cpu-local format
    (random weights, no network): artifacts/test_resnet/cpu-local."""
    import time

    from mme.cli import main

    out = tmp_path_factory.mktemp("cpu-local-artifacts")
    start = time.perf_counter()
    code = main(["-q", "package", "test_resnet", "--no-pretrained", "--formats", "cpu-local", "--out", str(out)])
    if code != 0:
        pytest.fail(f"mme package test_resnet failed with exit code {code}")
    return out / "test_resnet" / "cpu-local", time.perf_counter() - start
