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


def test_every_kind_is_one_row_of_the_table():
    """--server's choices, what each kind builds and what it runs all come from SERVER_KINDS."""
    assert factory.SERVER_CHOICES == ("auto", *factory.SERVER_KINDS)
    for name, kind in factory.SERVER_KINDS.items():
        assert isinstance(factory.create_server(name), kind.server) and name in factory.server_help()
    assert [k.name for k in factory.by_preference()] == ["system", "docker", "local"]  # what auto tries, in order
    assert factory.SERVER_KINDS["local"].runs("python") and not factory.SERVER_KINDS["local"].runs("onnxruntime")
    assert [k.name for k in factory.SERVER_KINDS.values() if k.in_container] == ["docker"]
