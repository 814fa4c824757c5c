"""DockerTritonServer: the command it builds and its errors where Docker is unusable."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from mme.errors import MmeError
from mme.versions import release
from serving.triton.base import ModelRootError, TritonServerConfig
from serving.triton.docker import CONTAINER_REPOSITORY, DockerTritonServer, DockerUnavailableError

CONFIG = TritonServerConfig(sagemaker_port=8080, http_port=8000, grpc_port=8001, metrics_port=8002, env={"A": "b"})


def option_values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == option]


def fake_docker(tmp_path: Path, script: str) -> str:
    path = tmp_path / "docker"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_command_runs_triton_in_sagemaker_multi_model_mode(tmp_path):
    cache = tmp_path / "model-cache"
    server = DockerTritonServer(CONFIG, model_root=cache, shm_size="4g", container_name="mme-t")
    argv = server.command(Path("/host/repo"))

    image_at = argv.index(release().triton_container)
    docker_part, triton_part = argv[:image_at], argv[image_at + 1:]
    assert docker_part[:3] == ["docker", "run", "--rm"]
    assert option_values(docker_part, "--name") == ["mme-t"]
    assert option_values(docker_part, "--gpus") == ["all"]
    assert option_values(docker_part, "--shm-size") == ["4g"]
    assert option_values(docker_part, "-p") == [f"127.0.0.1:{p}:{p}" for p in (8080, 8000, 8001, 8002)]
    assert set(option_values(docker_part, "-e")) == {"SAGEMAKER_MULTI_MODEL=true", "SAGEMAKER_BIND_TO_PORT=8080", "A=b"}
    resolved = cache.resolve()
    # The model cache is where SageMaker puts models, so Triton 2.70+ accepts every load url.
    assert option_values(docker_part, "-v") == [f"/host/repo:{CONTAINER_REPOSITORY}:ro", f"{resolved}:/opt/ml/models:ro"]

    assert triton_part[0] == "tritonserver"
    for flag in ("--allow-sagemaker=true", "--model-control-mode=explicit", "--sagemaker-port=8080",
                 f"--model-repository={CONTAINER_REPOSITORY}", "--http-port=8000", "--http-address=0.0.0.0"):
        assert flag in triton_part
    assert server.sagemaker_url == "http://127.0.0.1:8080"


def test_load_urls_are_the_container_paths_of_the_cache(tmp_path):
    cache = tmp_path / "cache"
    (cache / "0123abcd" / "model").mkdir(parents=True)
    server = DockerTritonServer(CONFIG, model_root=cache)
    assert server.model_url(cache / "0123abcd" / "model") == "/opt/ml/models/0123abcd/model"
    with pytest.raises(ModelRootError, match="outside the mounted model cache"):
        server.model_url(tmp_path / "elsewhere" / "model")
    with pytest.raises(ModelRootError, match="no model_root"):
        DockerTritonServer(CONFIG).model_url(cache / "0123abcd" / "model")


def test_local_endpoint_mounts_its_model_cache_into_the_container(tmp_path, packaged_test_resnet):
    """LocalEndpoint -> create_server wiring: the docker server gets the cache, and a fetched
    target's load url is /opt/ml/models/<hash>/model inside the container."""
    import shutil

    from serving.cache import cache_key
    from serving.local_endpoint import LocalEndpoint, LocalEndpointOptions

    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(packaged_test_resnet.tarball, models / "r50.tar.gz")
    endpoint = LocalEndpoint(LocalEndpointOptions(models=str(models), server_kind="docker", copies=2, memory="host"))
    try:
        server = endpoint.server
        assert isinstance(server, DockerTritonServer)
        argv = server.command(Path("/host/repo"))
        assert f"{endpoint.cache.root}:/opt/ml/models:ro" in option_values(argv, "-v")
        cached = endpoint.cache.fetch("r50-v2.tar.gz")
        assert server.model_url(cached.model_dir) == f"/opt/ml/models/{cache_key('r50-v2.tar.gz')}/model"
        assert cached.container_name == cache_key("r50-v2.tar.gz")
    finally:
        endpoint.stop()


def test_image_and_gpus_can_be_overridden():
    argv = DockerTritonServer(CONFIG, image="my/triton:1", gpus=None).command(Path("/r"))
    assert "my/triton:1" in argv and "--gpus" not in argv


def test_start_without_docker_command_is_a_clear_error(tmp_path):
    server = DockerTritonServer(TritonServerConfig(sagemaker_port=0), docker=str(tmp_path / "no-docker"))
    with pytest.raises(DockerUnavailableError) as info:
        server.start()
    message = str(info.value)
    assert isinstance(info.value, MmeError) and "\n" not in message
    assert "not installed" in message and "kind='local'" in message
    assert not server.is_running()


def test_start_without_engine_is_a_clear_error(tmp_path):
    docker = fake_docker(tmp_path, 'echo "Cannot connect to the Docker daemon at unix:///x.sock." >&2; exit 1')
    server = DockerTritonServer(TritonServerConfig(sagemaker_port=0), docker=docker)
    with pytest.raises(DockerUnavailableError, match="not reachable.*Cannot connect to the Docker daemon"):
        server.start()
    assert not server.is_running()


def test_start_without_the_image_says_how_to_pull_it(tmp_path):
    docker = fake_docker(tmp_path, 'case "$1" in info) echo 28.0;; *) echo "No such image" >&2; exit 1;; esac')
    server = DockerTritonServer(TritonServerConfig(sagemaker_port=0), image="nvcr.io/x/y:1", docker=docker)
    with pytest.raises(DockerUnavailableError, match="docker pull nvcr.io/x/y:1"):
        server.start()
