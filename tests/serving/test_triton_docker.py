"""DockerTritonServer: the command it builds and its errors where Docker is unusable."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from mme.errors import MmeError
from mme.versions import release
from serving.triton.config import ModelRootError, TritonServerConfig
from serving.triton.docker import CONTAINER_REPOSITORY, DockerTritonServer, DockerUnavailableError
from serving.triton.sagemaker_serve import serve_arguments

CONFIG = TritonServerConfig(sagemaker_port=8080, http_port=8000, grpc_port=8001, metrics_port=8002, env={"A": "b"})


def option_values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == option]


def fake_docker(tmp_path: Path, script: str) -> str:
    path = tmp_path / "docker"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


PORT_SETTINGS = {"SAGEMAKER_TRITON_ALLOW_GRPC=true", "SAGEMAKER_TRITON_GRPC_PORT=8001",
                 "SAGEMAKER_TRITON_ALLOW_METRICS=true", "SAGEMAKER_TRITON_METRICS_PORT=8002"}


def test_command_runs_triton_in_sagemaker_multi_model_mode(tmp_path):
    """An image without SageMaker's serve script: tritonserver with the arguments serve would give it."""
    cache = tmp_path / "model-cache"
    server = DockerTritonServer(CONFIG, model_root=cache, shm_size="4g", container_name="mme-t", sagemaker_serve=False)
    argv = server.command(Path("/host/repo"))

    image_at = argv.index(release().triton_container)
    docker_part, triton_part = argv[:image_at], argv[image_at + 1:]
    assert docker_part[:3] == ["docker", "run", "--rm"]
    assert option_values(docker_part, "--name") == ["mme-t"]
    assert option_values(docker_part, "--gpus") == ["all"]
    assert option_values(docker_part, "--shm-size") == ["4g"]
    assert option_values(docker_part, "-p") == [f"127.0.0.1:{p}:{p}" for p in (8080, 8000, 8001, 8002)]
    assert set(option_values(docker_part, "-e")) == {"SAGEMAKER_MULTI_MODEL=true", "SAGEMAKER_BIND_TO_PORT=8080", "A=b",
                                                     *PORT_SETTINGS}
    resolved = cache.resolve()
    # The model cache is where SageMaker puts models, so Triton 2.70+ accepts every load url.
    assert option_values(docker_part, "-v") == [f"/host/repo:{CONTAINER_REPOSITORY}:ro", f"{resolved}:/opt/ml/models:ro"]

    assert triton_part[0] == "tritonserver"
    settings = dict(e.split("=", 1) for e in option_values(docker_part, "-e"))
    ours = ["--allow-http=true", "--http-port=8000", "--http-address=0.0.0.0", "--grpc-address=0.0.0.0",
            "--metrics-address=0.0.0.0"]
    assert triton_part[1:] == serve_arguments(settings, model_repository=CONTAINER_REPOSITORY, extra=ours)
    for flag in ("--allow-sagemaker=true", "--model-control-mode=explicit", "--sagemaker-port=8080",
                 "--allow-grpc=true", "--grpc-port=8001", "--metrics-port=8002", "--model-namespacing=true"):
        assert flag in triton_part
    assert server.sagemaker_url == "http://127.0.0.1:8080"


def test_a_sagemaker_image_runs_its_serve_script_with_the_settings(tmp_path):
    """Images built with the SageMaker endpoint (build.py: LABEL ...multi-models=true, /usr/bin/serve)."""
    config = TritonServerConfig(sagemaker_port=8080, http_port=None, grpc_port=None, metrics_port=None,
                                log_verbose=1, extra_args=("--id=x",),
                                sagemaker_env={"SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--exit-timeout-secs=5",
                                               "SAGEMAKER_TRITON_ALLOW_GRPC": "true"})
    argv = DockerTritonServer(config, model_root=tmp_path, sagemaker_serve=True).command(Path("/host/repo"))
    assert argv[-2:] == [release().triton_container, "serve"]
    assert option_values(argv, "-p") == ["127.0.0.1:8080:8080"]
    assert dict(e.split("=", 1) for e in option_values(argv, "-e")) == {
        "SAGEMAKER_MULTI_MODEL": "true", "SAGEMAKER_BIND_TO_PORT": "8080", "SAGEMAKER_TRITON_ALLOW_GRPC": "true",
        "SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--log-verbose=1 --exit-timeout-secs=5 --id=x"}
    assert option_values(argv, "-v") == [f"{tmp_path.resolve()}:/opt/ml/models:ro"]  # serve uses /tmp/sagemaker


def test_the_label_decides_at_start(tmp_path):
    labels = {"com.amazonaws.sagemaker.capabilities.multi-models": "true"}
    inspect = json.dumps([{"Config": {"Labels": labels}}])
    docker = fake_docker(tmp_path, f"""case "$1" in info) echo 28.0;; image) echo '{inspect}';; *) exit 1;; esac""")
    server = DockerTritonServer(TritonServerConfig(sagemaker_port=8080), docker=docker)
    server._before_start()
    assert server.runs_serve() and server.command(Path("/r"))[-1] == "serve"
    assert server._startup_notices() == []
    plain = fake_docker(tmp_path, """case "$1" in info) echo 28.0;; image) echo '[{"Config": {"Labels": null}}]';; esac""")
    server = DockerTritonServer(TritonServerConfig(sagemaker_port=8080), docker=plain, image="my/triton:1")
    server._before_start()
    assert not server.runs_serve() and "tritonserver" in server.command(Path("/r"))
    assert server._startup_notices() == ["my/triton:1 has no SageMaker serve script (no LABEL "
                                         "com.amazonaws.sagemaker.capabilities.multi-models=true); started "
                                         "tritonserver with the arguments serve would give it"]


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

    from serving.models.cache_entries import cache_key
    from serving.runtime.local_endpoint import LocalEndpoint, LocalEndpointOptions

    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(packaged_test_resnet.tarball, models / "r50.tar.gz")
    endpoint = LocalEndpoint(LocalEndpointOptions(models=str(models), server_kind="docker", copies=2, memory="host"))
    try:
        server = endpoint.server
        assert isinstance(server, DockerTritonServer)
        argv = server.command(Path("/host/repo"))
        assert f"{endpoint.cache.root}:/opt/ml/models:ro" in option_values(argv, "-v")
        cached = endpoint.cache.fetch("r50-v1.tar.gz")
        assert server.model_url(cached.model_dir) == f"/opt/ml/models/{cache_key('r50-v1.tar.gz')}/model"
        assert cached.container_name == cache_key("r50-v1.tar.gz")
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
