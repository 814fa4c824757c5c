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
