"""Locating the wheel's Triton and placing the python-backend stub (no server started)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from mme.errors import MmeError
from serving.triton import local
from serving.triton.config import TritonServerConfig, free_ports, resolve_ports
from serving.triton.local import (
    STUB_NAME,
    LocalTritonServer,
    TritonDistribution,
    TritonNotInstalledError,
    find_distribution,
    prepare_backends,
)

VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"

pytestmark = pytest.mark.integration  # real servers or whole commands: make test-integration


def fake_distribution(root: Path) -> TritonDistribution:
    dist = TritonDistribution(root=root / "pytriton" / "tritonserver", libs=root / "nvidia_pytriton.libs")
    (dist.backends / "python").mkdir(parents=True)
    (dist.backends / "python" / "libtriton_python.so").write_bytes(b"backend")
    dist.stub_for(VERSION).parent.mkdir(parents=True)
    dist.stub_for(VERSION).write_bytes(b"stub for " + VERSION.encode())
    return dist


def test_the_installed_wheel_is_found():
    dist = find_distribution()
    assert dist.binary.is_file() and os.access(dist.binary, os.X_OK)
    assert dist.stub_for(VERSION).is_file()
    assert dist.libs.is_dir()


def test_missing_wheel_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(TritonNotInstalledError) as info:
        LocalTritonServer(TritonServerConfig(sagemaker_port=0)).start()
    assert isinstance(info.value, MmeError)
    assert "pip install nvidia-pytriton" in str(info.value) and "\n" not in str(info.value)


def test_missing_binary_is_a_clear_error(monkeypatch, tmp_path):
    (tmp_path / "pytriton" / "tritonserver").mkdir(parents=True)
    spec = importlib.util.spec_from_loader("pytriton", loader=None, is_package=True)
    spec.submodule_search_locations.append(str(tmp_path / "pytriton"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec)
    with pytest.raises(TritonNotInstalledError, match="no tritonserver binary"):
        find_distribution()


def test_stub_is_placed_once(tmp_path):
    dist = fake_distribution(tmp_path)
    assert prepare_backends(dist, VERSION) == dist.backends
    placed = dist.backends / "python" / STUB_NAME
    assert placed.read_bytes() == dist.stub_for(VERSION).read_bytes()
    assert os.access(placed, os.X_OK)
    inode, mtime = placed.stat().st_ino, placed.stat().st_mtime_ns
    assert prepare_backends(dist, VERSION) == dist.backends
    assert (placed.stat().st_ino, placed.stat().st_mtime_ns) == (inode, mtime)


def test_stub_of_another_python_is_replaced(tmp_path):
    dist = fake_distribution(tmp_path)
    (dist.backends / "python" / STUB_NAME).write_bytes(b"stub for 3.8")
    prepare_backends(dist, VERSION)
    assert (dist.backends / "python" / STUB_NAME).read_bytes() == dist.stub_for(VERSION).read_bytes()


def test_read_only_wheel_gets_a_cached_copy_of_the_backends(tmp_path, monkeypatch):
    dist = fake_distribution(tmp_path / "site")
    real_access = os.access

    def access(path, mode):  # root may write anywhere: pretend site-packages is read-only
        return False if Path(path).is_relative_to(tmp_path / "site") else real_access(path, mode)

    monkeypatch.setattr(local.os, "access", access)
    backends = prepare_backends(dist, VERSION, cache_dir=tmp_path / "cache")
    assert backends.is_relative_to(tmp_path / "cache")
    assert (backends / "python" / STUB_NAME).read_bytes() == dist.stub_for(VERSION).read_bytes()
    assert (backends / "python" / "libtriton_python.so").read_bytes() == b"backend"
    assert not (dist.backends / "python" / STUB_NAME).exists()
    assert prepare_backends(dist, VERSION, cache_dir=tmp_path / "cache") == backends


def test_unsupported_python_is_a_clear_error(tmp_path):
    dist = fake_distribution(tmp_path)
    with pytest.raises(TritonNotInstalledError, match=f"no python-backend stub for Python 2.7.*{VERSION}"):
        prepare_backends(dist, "2.7")


def test_environment_puts_the_venv_first_on_path_and_the_wheel_libs_on_the_loader_path():
    server = LocalTritonServer(TritonServerConfig(sagemaker_port=18080, env={"EXTRA": "1"}))
    server._dist = find_distribution()
    env = server._environment()
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.prefix) / "bin")
    assert env["LD_LIBRARY_PATH"].split(os.pathsep)[0] == str(server._dist.libs)
    assert env["SAGEMAKER_MULTI_MODEL"] == "true" and env["SAGEMAKER_BIND_TO_PORT"] == "18080"
    assert env["EXTRA"] == "1"


def test_zero_ports_become_distinct_free_ports():
    config = resolve_ports(TritonServerConfig(sagemaker_port=0, metrics_port=None))
    ports = [config.sagemaker_port, config.http_port, config.grpc_port]
    assert all(p > 0 for p in ports) and len(set(ports)) == 3 and config.metrics_port is None
    assert len(set(free_ports(4))) == 4
    assert resolve_ports(TritonServerConfig(sagemaker_port=8080)).sagemaker_port == 8080


def test_sagemaker_settings_reach_the_environment_and_config_ports_become_settings():
    settings = {"SAGEMAKER_TRITON_LOG_INFO": "false", "OTHER": "x", "SAGEMAKER_TRITON_PING_MODE": "",
                "SAGEMAKER_TRITON_ALLOW_METRICS": "false"}
    server = LocalTritonServer(TritonServerConfig(sagemaker_port=18080, http_port=None, grpc_port=9001,
                                                  metrics_port=9002, sagemaker_env=settings))
    server._dist = find_distribution()
    env = server._environment()
    assert env["SAGEMAKER_TRITON_LOG_INFO"] == "false" and env["OTHER"] == "x"
    assert env["SAGEMAKER_TRITON_ALLOW_GRPC"] == "true" and env["SAGEMAKER_TRITON_GRPC_PORT"] == "9001"
    assert env["SAGEMAKER_TRITON_ALLOW_METRICS"] == "false"  # the user's setting wins over the config's port
    assert env["SAGEMAKER_TRITON_PING_MODE"] == "live"  # exported, so serve's MME value reaches tritonserver
    argv = server.command(Path("/tmp/repo"))
    for flag in ("--allow-http=false", "--allow-grpc=true", "--grpc-port=9001", "--grpc-address=127.0.0.1",
                 "--allow-metrics=false", "--log-info=false"):
        assert flag in argv
    assert not any(a.startswith("--http-port") for a in argv)


def test_kserve_url_needs_http_on():
    from serving.triton.config import TritonServerError

    assert LocalTritonServer(TritonServerConfig(http_port=8000)).kserve_url == "http://127.0.0.1:8000"
    with pytest.raises(TritonServerError, match="http_port=0") as info:
        _ = LocalTritonServer(TritonServerConfig(http_port=None)).kserve_url
    assert "\n" not in str(info.value)


def test_config_log_verbose_and_extra_args_come_after_serves():
    server = LocalTritonServer(TritonServerConfig(sagemaker_port=18080, log_verbose=0, extra_args=("--id=x",),
                                                  sagemaker_env={"SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--id=y"}))
    argv = server.command(Path("/tmp/repo"))
    assert argv.index("--log-verbose=true") < argv.index("--log-verbose=0")  # Triton takes the last one
    assert argv[-2:] == ["--id=y", "--id=x"]
