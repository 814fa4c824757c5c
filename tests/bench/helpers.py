"""Running ``mme bench`` the way users do (its own process) and reading what it saved."""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from bench import results
from mme.process import child_env

from serving.triton.config import free_ports

ROOT = Path(__file__).resolve().parents[2]
# Deterministic credentials for every generator process: the SigV4 test re-signs with them.
ACCESS_KEY = "AKIDBENCHTEST"
SECRET_KEY = "bench/test/secret/key"


def bench_env() -> dict:
    env = child_env({"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                     "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"})
    env.pop("AWS_SESSION_TOKEN", None)
    env.pop("AWS_PROFILE", None)
    return env


@contextmanager
def served_in_background(artifact_dir: Path, log_dir: Path, *serve_args: str) -> Iterator[tuple[str, str]]:
    """`mme serve --models ARTIFACT` in its own process as a user starts it (plus ``serve_args``),
    on a free port: (its URL, its banner once printed)."""
    from tests.conftest import serving_process

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = log_dir / "serve.log"
    command = [sys.executable, "-m", "mme", "serve", *serve_args, "--models", str(artifact_dir), "--port", str(port),
               "--server", "local"]
    with open(log, "w") as err, serving_process(command, f"{url}/ping", what="mme serve", cwd=ROOT, env=bench_env(),
                                                stdout=subprocess.DEVNULL, stderr=err, text=True):
        deadline = time.monotonic() + 30
        while "try it:" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        yield url, log.read_text()


def bench_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "mme", "bench", *args]


def run_bench(*args: str, timeout: float = 90.0) -> subprocess.CompletedProcess:
    return subprocess.run(bench_command(*args), cwd=ROOT, env=bench_env(), capture_output=True, text=True,
                          timeout=timeout)


@dataclass(frozen=True)
class SavedRun:
    directory: Path
    info: results.RunInfo
    requests: list[results.RequestRecord]
    stages: list[results.StageRecord]
    metrics: list[dict]


def saved_run(completed: subprocess.CompletedProcess) -> SavedRun:
    assert completed.returncode == 0, completed.stderr
    directory = Path(completed.stdout.strip().splitlines()[-1])
    return read_run(directory)


def read_run(directory: Path) -> SavedRun:
    return SavedRun(directory, results.RunInfo.read(directory), list(results.read_requests(directory)),
                    results.read_stages(directory), results.read_endpoint_metrics(directory))


def free_port() -> int:
    return free_ports(1)[0]
