"""Running ``mme bench`` the way users do (its own process) and reading what it saved."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

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
