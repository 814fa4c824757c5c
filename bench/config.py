"""Everything a load-generator process needs to run, as one JSON-serialisable value.

``mme bench`` builds and checks it, then hands it to ``python -m bench.run`` (a fresh process:
Locust monkey-patches the standard library on import); the master sends it on to every worker
that connects, local or remote. Credentials are not in it: each process reads its own from
botocore's chain. Nor is the token workers present to the master (it would otherwise reach
every worker, token or not): it travels in the environment, ``MME_BENCH_WORKER_TOKEN``.
"""

from __future__ import annotations

import base64
import ipaddress
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from bench.endpoint import EndpointAddress
from bench.stages import LoadPlan

TOKEN_ENV = "MME_BENCH_WORKER_TOKEN"  # the shared token workers present to the master
LOOPBACK = "127.0.0.1"


def is_loopback(host: str) -> bool:
    """Whether a master bound to ``host`` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any address


# Exit code of the load generator when the run went to its end and was saved, but more than
# --max-failure-rate of its requests failed (mme bench then prints the run directory and exits 1).
TOO_MANY_FAILURES = 4

WORKER_MASTER_PORT = 5557  # the master's port remote workers (mme bench-worker) connect to by default


@dataclass(frozen=True)
class BenchConfig:
    run_id: str
    run_dir: str
    endpoint: str
    endpoint_url: str  # resolved runtime URL
    custom_url: bool  # the user gave --endpoint-url
    region: str
    mode: str  # "multi" | "single"
    model: str | None
    format: str | None
    instance_type: str | None
    targets: tuple[str, ...]  # () for single-model endpoints
    distribution: str  # "uniform" | "zipf:<s>"
    client: str  # "fast" | "boto3"
    workers: int  # local generator processes (1: Locust's local runner)
    expect_workers: int  # remote workers (mme bench-worker) to wait for
    master_bind_host: str
    master_port: int  # 0: any free port
    worker_wait_s: float
    plan: dict  # LoadPlan.to_json()
    shape: str  # label for run.json
    time_scale: float | None
    wait_min_s: float
    wait_max_s: float
    max_inflight: int  # open-loop concurrency cap, all generators together
    content_type: str
    accept: str | None
    payload_b64: str
    payload_source: str
    stop_on_failure: bool
    max_p95_ms: float | None
    timeout_s: float
    progress_interval_s: float
    quiet: bool
    credentials_note: str
    seed: int | None = None
    metrics_interval_s: float = 10.0
    drain_s: float = 60.0  # when the run ends, requests in flight get this long to answer (then: cut off)
    max_failure_rate: float = 0.01  # the run fails (exit code 1) above this share of failed requests
    warmup: bool = False  # one answered request per target before the first stage (bench.warmup)
    in_process: dict | None = None  # the in-process baseline measured before the run (bench.in_process)
    mix: dict | None = None  # a fleet mix (bench.mix.MixPlan.to_json): targets, weights, models
    mix_payloads: list | None = None  # per target of ``mix``: [base64 body, content type]

    @property
    def address(self) -> EndpointAddress:
        return EndpointAddress(self.endpoint, self.endpoint_url, self.region, self.custom_url)

    @property
    def load_plan(self) -> LoadPlan:
        return LoadPlan.from_json(self.plan)

    @property
    def payload(self) -> bytes:
        return base64.b64decode(self.payload_b64)

    @property
    def distributed(self) -> bool:
        return self.workers > 1 or self.expect_workers > 0

    @property
    def local_workers(self) -> int:
        """Worker processes the master starts on this machine (none with --workers 1)."""
        return self.workers if self.workers > 1 else 0

    @property
    def generators(self) -> int:
        """Generator processes the run waits for."""
        return self.local_workers + self.expect_workers if self.distributed else 1

    def to_dict(self) -> dict:
        data = asdict(self)
        data["targets"] = list(self.targets)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "BenchConfig":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["targets"] = tuple(values.get("targets") or ())
        return cls(**values)

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict()))

    @classmethod
    def read(cls, path: Path) -> "BenchConfig":
        return cls.from_dict(json.loads(path.read_text()))
