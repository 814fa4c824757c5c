"""SystemTritonServer (serving/triton/system.py): the tritonserver of NVIDIA's container
run as a local process, as `mme serve --server system` does inside the serving image."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from serving.triton.container import ping_status
from serving.triton.config import TritonServerConfig
from serving.triton.system import (
    BINARY_ENV,
    SystemTritonNotFoundError,
    SystemTritonServer,
    find_system_tritonserver,
)

CONFIG = TritonServerConfig(sagemaker_port=8080, http_port=8000, grpc_port=8001, metrics_port=8002)

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def fake_install(root: Path, executable: bool = True) -> Path:
    """``root``/bin/tritonserver and ``root``/backends, the NGC container's layout."""
    binary = root / "bin" / "tritonserver"
    binary.parent.mkdir(parents=True)
    (root / "backends" / "python").mkdir(parents=True)
    binary.write_text("#!/bin/sh\nexit 0\n")
    if executable:
        binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    return binary


SERVE = Path(__file__).resolve().parents[1] / "serving" / "data" / "sagemaker_serve"


def test_command_runs_the_system_binary_in_sagemaker_multi_model_mode(tmp_path, monkeypatch):
    """Without a serve script in the image: the binary with serve's arguments (its Python port)."""
    monkeypatch.setattr("serving.triton.system.find_serve_script", lambda *a: None)
    binary = fake_install(tmp_path / "opt" / "tritonserver")
    server = SystemTritonServer(CONFIG, binary=binary)
    argv = server.command(Path("/tmp/repo"))
    assert argv[0] == str(binary)
    assert argv[1:4] == ["--allow-sagemaker=true", "--allow-http=false", "--model-control-mode=explicit"]
    for flag in ("--model-repository=/tmp/repo", "--model-namespacing=true", "--allow-http=true",
                 "--sagemaker-port=8080", "--http-port=8000", "--grpc-port=8001", "--metrics-port=8002",
                 "--allow-grpc=true", "--allow-metrics=true", "--log-verbose=true",
                 f"--backend-directory={(tmp_path / 'opt' / 'tritonserver' / 'backends').resolve()}",
                 f"--backend-config=python,shm-region-prefix-name={server.shm_prefix}"):
        assert flag in argv
    env = server._environment()
    assert env["SAGEMAKER_MULTI_MODEL"] == "true" and env["SAGEMAKER_BIND_TO_PORT"] == "8080"
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.prefix) / "bin")


def test_with_a_serve_script_bash_runs_it_with_our_flags_in_additional_args(tmp_path):
    """SageMaker's serve (tests/serving/data/sagemaker_serve, docker/sagemaker/serve @ e1db8a603)."""
    binary = fake_install(tmp_path / "opt" / "tritonserver")
    config = TritonServerConfig(sagemaker_port=8080, http_port=None, grpc_port=None, metrics_port=None,
                                sagemaker_env={"SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--exit-timeout-secs=5"})
    server = SystemTritonServer(config, binary=binary, serve_script=SERVE)
    try:
        assert server.command(Path("/tmp/repo")) == ["bash", str(SERVE)]
        env = server._environment()
        assert env["SAGEMAKER_TRITON_ADDITIONAL_ARGS"].split() == [  # the user's come last
            f"--backend-directory={(tmp_path / 'opt' / 'tritonserver' / 'backends').resolve()}",
            f"--backend-config=python,shm-region-prefix-name={server.shm_prefix}", "--exit-timeout-secs=5"]
        assert "SAGEMAKER_TRITON_PING_MODE" not in env  # the script sets it, as in SageMaker
        first = Path(env["PATH"].split(os.pathsep)[0])
        assert (first / "tritonserver").resolve() == binary.resolve()  # the script finds our binary
    finally:
        server.stop()
    assert not first.exists()
    with pytest.raises(SystemTritonNotFoundError, match="not SageMaker's Triton serve script"):
        SystemTritonServer(config, binary=binary, serve_script=binary).start()


def test_binary_search_order(tmp_path, monkeypatch):
    given = fake_install(tmp_path / "given")
    from_env = fake_install(tmp_path / "env")
    on_path = fake_install(tmp_path / "path")
    monkeypatch.setenv(BINARY_ENV, str(from_env))
    monkeypatch.setenv("PATH", f"{on_path.parent}{os.pathsep}{os.environ['PATH']}")
    assert find_system_tritonserver(given) == given
    assert find_system_tritonserver() == from_env
    monkeypatch.delenv(BINARY_ENV)
    assert find_system_tritonserver() == on_path


def test_missing_or_unusable_binaries_say_how_to_fix(tmp_path, monkeypatch):
    monkeypatch.delenv(BINARY_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("serving.triton.system.SYSTEM_ROOT", tmp_path / "nowhere")
    with pytest.raises(SystemTritonNotFoundError) as info:
        find_system_tritonserver()
    message = str(info.value)
    assert "no tritonserver on PATH" in message and BINARY_ENV in message and "make docker-serve" in message
    assert "\n" not in message

    with pytest.raises(SystemTritonNotFoundError, match="no tritonserver at .*missing"):
        find_system_tritonserver(tmp_path / "missing")
    not_exec = fake_install(tmp_path / "noexec", executable=False)
    with pytest.raises(SystemTritonNotFoundError, match="is not executable; run: chmod"):
        find_system_tritonserver(not_exec)
    with pytest.raises(SystemTritonNotFoundError, match="backend directory .* does not exist"):
        SystemTritonServer(CONFIG, binary=fake_install(tmp_path / "ok"), backend_directory=tmp_path / "nope").start()


def test_serves_ping_with_a_real_tritonserver(tmp_path):
    """The wheel's tritonserver stands in for the container's: same binary, other paths."""
    from serving.triton.local import TritonNotInstalledError, check_libpython, find_distribution, prepare_backends

    try:
        dist = find_distribution()
        backends = prepare_backends(dist, cache_dir=tmp_path / "cache")
        check_libpython()
    except TritonNotInstalledError as exc:
        pytest.skip(str(exc))
    library_path = os.pathsep.join(str(p) for p in dist.library_path())
    server = SystemTritonServer(
        TritonServerConfig(sagemaker_port=0, startup_timeout_s=60.0, env={"LD_LIBRARY_PATH": library_path}),
        binary=dist.binary, backend_directory=backends,
    )
    server.start()
    try:
        assert ping_status(server.sagemaker_url) == 200
        assert server.pid in server.pids()
    finally:
        server.stop()
    assert not server.is_running() and server.pids() == []


# -- where the system Triton loads models from (Triton 2.70+: /opt/ml/models/<hash>/model only) --

@pytest.mark.parametrize(("version", "release", "required"), [
    ("2.71.0", None, "/opt/ml/models"),   # the serving image of 26.07: TRITON_SERVER_VERSION is set
    ("2.61.0", None, None),               # 25.09 accepts any url
    (None, "24.09", None),                # from the matrix row of MME_TRITON_RELEASE
    (None, "26.07", "/opt/ml/models"),
    (None, None, "/opt/ml/models"),       # unknown: the layout every version accepts
])
def test_required_model_root_follows_the_triton_version(monkeypatch, version, release, required):
    for name, value in (("TRITON_SERVER_VERSION", version), ("MME_TRITON_RELEASE", release)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    got = SystemTritonServer.required_model_root()
    assert (str(got) if got else None) == required


def test_a_cache_dir_elsewhere_is_refused_where_triton_loads_only_from_opt_ml_models(monkeypatch, tmp_path):
    from mme.errors import UsageError
    from serving.runtime.local_endpoint import LocalEndpoint, LocalEndpointOptions
    from serving.triton.factory import choose_cache_root

    assert choose_cache_root(None, Path("/opt/ml/models")) == Path("/opt/ml/models")
    assert choose_cache_root(tmp_path, None) == tmp_path
    monkeypatch.setenv("TRITON_SERVER_VERSION", "2.71.0")
    models = tmp_path / "models"
    models.mkdir()
    (models / "m.tar.gz").touch()  # something to serve: mme serve refuses an empty directory
    options = LocalEndpointOptions(models=str(models), server_kind="system", cache_dir=tmp_path / "cache", memory="host")
    with pytest.raises(UsageError) as info:
        LocalEndpoint(options)
    message = str(info.value)
    assert "loads models only from /opt/ml/models/<hash>/model" in message and "--cache-dir /opt/ml/models" in message
    assert not (tmp_path / "cache").exists()  # nothing half-made
