"""Fixtures for the model store, extraction, cache and SageMaker error-shape tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

from mme.fsutil import deterministic_tar_gz
from tests.serving_store.store_helpers import CONFIG, Member, free_port, write_tarball


@pytest.fixture
def make_tarball(tmp_path: Path) -> Callable[..., Path]:
    """make_tarball(members, name=..., compress=True) -> path of a hand-built tarball."""
    counter = iter(range(1_000_000))

    def make(members: list[Member], name: str | None = None, compress: bool = True) -> Path:
        out = tmp_path / "tarballs"
        out.mkdir(exist_ok=True)
        return write_tarball(out / (name or f"t{next(counter)}.tar.gz"), members, compress)

    return make


@pytest.fixture
def tiny_model_dir(tmp_path: Path) -> Path:
    """A valid one-model Triton directory (python backend), not tarred."""
    root = tmp_path / "tiny-src" / "tiny"
    (root / "1").mkdir(parents=True)
    (root / "config.pbtxt").write_text(CONFIG)
    (root / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    return root


@pytest.fixture
def tiny_tarball(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """The MME tarball of tiny_model_dir, made like 'mme package' makes it."""
    dest = tmp_path / "tiny.tar.gz"
    deterministic_tar_gz(tiny_model_dir, "tiny", dest)
    return dest


@dataclass(frozen=True)
class PackagedArtifact:
    directory: Path  # artifacts/test_resnet/cpu-local
    tarball: Path
    package_seconds: float


@pytest.fixture(scope="session")
def resnet_artifact(test_resnet_cpu_local) -> PackagedArtifact:
    """timm's tiny test_resnet packaged by 'mme package' (cpu-local, random weights, no network)."""
    directory, seconds = test_resnet_cpu_local
    return PackagedArtifact(directory, directory / "test_resnet.tar.gz", seconds)


@dataclass(frozen=True)
class MotoServer:
    endpoint_url: str
    startup_seconds: float


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """A real moto S3 server over HTTP on 127.0.0.1 (moto_server from the venv)."""
    exe = Path(sys.executable).parent / "moto_server"
    if not exe.exists():
        pytest.skip("moto_server not installed; pip install 'moto[server]'")
    port = free_port()
    start = time.perf_counter()
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = start + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.perf_counter() > deadline:
                    pytest.fail(f"moto_server did not start on port {port} (exit code {proc.poll()})")
                time.sleep(0.05)
        yield MotoServer(url, time.perf_counter() - start)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
