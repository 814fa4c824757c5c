"""Shared fixtures. GPU-marked tests run only where a CUDA GPU is visible."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from packager.manifest import Manifest

# Fixtures of the AWS-facing commands (moto S3, Stubber clients, the command line in-process),
# shared by tests/serving/deploy, tests/packager/remote, tests/sizing and tests/mme.
pytest_plugins = ["tests.aws_fixtures"]

# Tests never reach model hubs: fail fast instead of retrying for half a minute.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# A runner that starts the suite as a background job hands it SIGINT ignored, and children
# inherit that: the Ctrl-C tests need SIGINT delivered, here and in the commands they start
# (a caught signal is reset to the default on exec, an ignored one stays ignored).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


# Fixtures that start a real server: a test using one (directly or through another fixture)
# belongs to the integration tier (make test-integration) whatever its file.
INTEGRATION_FIXTURES = frozenset({"moto_server", "moto_url", "s3env", "local_cloud"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run `make test-gpu` on a GPU host)")
    for item in items:
        if item.get_closest_marker("gpu"):  # the marker, not the keyword: tests/gpu/ holds CPU tests too
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


@dataclass(frozen=True)
class PackagedModel:
    directory: Path  # artifacts/test_resnet/cpu-local
    manifest: Manifest

    @property
    def tarball(self) -> Path:
        return self.directory / self.manifest.tarball

    @property
    def onnx_file(self) -> Path:
        return self.directory / self.manifest.model / "1" / "model.onnx"

    @property
    def binary_content_type(self) -> str:
        return self.manifest.sample_request.binary_content_type

    def sample(self, kind: str) -> bytes:
        request = self.manifest.sample_request
        name = {"json": request.json_file, "binary": request.binary_file}[kind]
        return (self.directory / name).read_bytes()

    def extract(self, destination: Path) -> Path:
        """The tarball unpacked into ``destination`` (one model directory inside), as SageMaker does."""
        destination.mkdir(parents=True, exist_ok=True)
        with tarfile.open(self.tarball) as tar:
            tar.extractall(destination, filter="data")
        return destination


@pytest.fixture(scope="session")
def packaged_test_resnet(test_resnet_cpu_local) -> PackagedModel:
    directory, _ = test_resnet_cpu_local
    return PackagedModel(directory, Manifest.load(directory))


# A real S3-compatible server over HTTP (moto), shared by the store and cloud tests.
@dataclass(frozen=True)
class MotoServer:
    endpoint_url: str
    startup_seconds: float


@contextlib.contextmanager
def serving_process(command: list[str], ready_url: str, *, what: str, timeout_s: float = 60.0,
                    stop_timeout_s: float = 30.0, **popen) -> Iterator[subprocess.Popen]:
    """``command`` started (``popen``: Popen's keyword arguments), polled until ``ready_url``
    answers, then yielded; stopped afterwards (SIGTERM, SIGKILL after ``stop_timeout_s``).
    Fails the test if it exits first or does not answer within ``timeout_s``."""
    from mme.polling import poll_until
    from mme.process import stop_process

    process = subprocess.Popen(command, **popen)

    def answered(elapsed) -> bool | None:
        if process.poll() is not None:
            stderr = process.stderr.read() if process.stderr is not None else ""
            pytest.fail(f"{what} exited with {process.returncode} before answering {ready_url}"
                        + (f": {stderr}" if stderr else ""))
        try:
            urllib.request.urlopen(ready_url, timeout=1).close()
        except OSError:
            return None
        return True

    try:
        poll_until(answered, timeout_s=timeout_s, interval_s=0.1, on_timeout=lambda waited: pytest.fail.Exception(
            f"{what} did not answer {ready_url} within {timeout_s:.0f} s"))
        yield process
    finally:
        stop_process(process, stop_timeout_s)


@contextlib.contextmanager
def running_moto_server() -> Iterator[str]:
    """A real moto S3 server over HTTP on 127.0.0.1 (moto_server from the venv): its URL."""
    exe = Path(sys.executable).parent / "moto_server"
    if not exe.exists():
        pytest.skip("moto_server not installed; pip install 'moto[server]'")
    from serving.triton.config import free_ports

    port = free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    with serving_process([str(exe), "-H", "127.0.0.1", "-p", str(port)], f"{url}/moto-api/",
                         what=f"moto_server on port {port}", timeout_s=30, stop_timeout_s=10,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        yield url


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """A real moto S3 server over HTTP on 127.0.0.1, shared by the session."""
    start = time.perf_counter()
    with running_moto_server() as url:
        yield MotoServer(url, time.perf_counter() - start)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Dummy credentials through botocore's usual chain (environment), no real config files."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")

