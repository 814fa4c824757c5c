from __future__ import annotations

import pytest

from mme.errors import UsageError
from serving.triton import factory
from serving.triton.docker import DockerTritonServer
from serving.triton.local import LocalTritonServer


def test_explicit_kinds():
    assert isinstance(factory.create_server("local"), LocalTritonServer)
    assert isinstance(factory.create_server("docker"), DockerTritonServer)


def test_unknown_kind_is_a_usage_error():
    with pytest.raises(UsageError, match="auto, local, docker"):
        factory.create_server("kubernetes")


@pytest.mark.parametrize(
    ("gpu", "docker_problem", "expected"),
    [(True, None, DockerTritonServer), (True, "engine down", LocalTritonServer), (False, None, LocalTritonServer)],
)
def test_auto_needs_both_a_gpu_and_a_docker_engine(monkeypatch, gpu, docker_problem, expected):
    monkeypatch.setattr(factory, "nvidia_gpu_present", lambda: gpu)
    monkeypatch.setattr(factory, "docker_engine_problem", lambda docker="docker": docker_problem)
    assert isinstance(factory.create_server("auto"), expected)
