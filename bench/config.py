"""Everything a load-generator process needs to run, typed: :class:`BenchConfig`, built of one
record per concern (where the run is saved, the endpoint, the targets, the request body, the load,
the client, the generator processes, the stop conditions).

``mme bench`` builds and checks it (``bench.request.build_config``), then hands it to
``python -m bench.run`` (a fresh process: Locust monkey-patches the standard library on import);
the master sends it on to every worker that connects, local or remote. It crosses those process
boundaries as JSON text (:meth:`BenchConfig.to_json` / :meth:`BenchConfig.from_json`, the only
place request bodies become base64); inside a process it is only ever this typed value.

Credentials are not in it: each process reads its own from botocore's chain. Nor is the token
workers present to the master (it would otherwise reach every worker, token or not): it travels
in the environment, ``MME_BENCH_WORKER_TOKEN``.
"""

from __future__ import annotations

import base64
import json
import types
from dataclasses import asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from bench.endpoint import EndpointAddress
from bench.payload import Payload
from bench.stages import LoadPlan
from bench.targets import Distribution

TOKEN_ENV = "MME_BENCH_WORKER_TOKEN"  # the shared token workers present to the master
LOOPBACK = "127.0.0.1"


# Exit code of the load generator when the run went to its end and was saved, but more than
# --max-failure-rate of its requests failed (mme bench then prints the run directory and exits 1).
TOO_MANY_FAILURES = 4

WORKER_MASTER_PORT = 5557  # the master's port remote workers (mme bench-worker) connect to by default


@dataclass(frozen=True)
class MixPlan:
    """A fleet's mix as the load sends it (``mme bench --mix``; built by :func:`bench.mix.build_mix`)."""

    targets: tuple[str, ...]
    weights: tuple[float, ...]  # relative: each target's requests/s in the mix
    payloads: tuple[Payload, ...]  # per target, in order
    models: tuple[str, ...]  # the model of each target
    spec: str  # --mix as given: zipf:S or a TOML file of rates
    catalogue: str  # --catalogue

    def to_json(self) -> dict:
        """What run.json records of the mix (``extra["mix"]``)."""
        return {"targets": list(self.targets), "weights": [round(w, 6) for w in self.weights],
                "models": list(self.models), "payload_bytes": [len(p.body) for p in self.payloads],
                "spec": self.spec, "catalogue": self.catalogue}


@dataclass(frozen=True)
class InProcessResult:
    """What the artifact's model did in-process on the same sample (``mme bench --in-process``), for the report."""

    requests: int
    seconds: float
    requests_per_s: float
    p50_ms: float
    p95_ms: float
    runtime: str  # "onnxruntime 1.23.2, 2 intra-op threads"
    pipeline: str  # "tokenizer + encoder" or "model"
    payload: str  # what was sent

    def to_dict(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class RunOutput:
    """Where the run is saved and what it prints while it goes."""

    run_id: str
    run_dir: Path
    progress_interval_s: float
    metrics_interval_s: float  # between snapshots of the endpoint's /metrics.json within a stage
    quiet: bool


@dataclass(frozen=True)
class EndpointSettings:
    address: EndpointAddress  # name, resolved runtime URL, region, whether the user gave the URL
    mode: str  # "multi" (a TargetModel per request) | "single" (a real-time endpoint)
    instance_type: str | None  # recorded in run.json ("local" for a local URL)
    credentials_note: str  # how the starting process found credentials (never a secret)


@dataclass(frozen=True)
class TargetSettings:
    """What each request asks for."""

    model: str | None  # the run's model (a fleet's name for a mix)
    names: tuple[str, ...]  # the TargetModels; () for single-model endpoints
    distribution: Distribution
    seed: int | None  # of target picking
    mix: MixPlan | None  # a fleet: each target its weight and its own request body

    @property
    def popularity(self) -> str:
        """How targets are picked, in words for run.json and the console."""
        return f"mix {self.mix.spec}" if self.mix is not None else str(self.distribution)


@dataclass(frozen=True)
class LoadSettings:
    plan: LoadPlan  # the stages (or the open-loop rate) checked by bench.stages.build_load_plan
    time_scale: float | None  # as given (recorded in run.json)
    wait_s: tuple[float, float]  # closed loop: each user's wait between requests, min and max
    max_inflight: int  # open loop: cap on requests in flight, all generators together
    warmup: bool  # one answered request per target before the first stage (bench.warmup)


@dataclass(frozen=True)
class ClientSettings:
    kind: str  # "fast" (SigV4 over geventhttpclient) | "boto3" (bench.client.CLIENTS)
    accept: str | None  # the Accept header; None: none sent
    timeout_s: float  # per request


@dataclass(frozen=True)
class GeneratorSettings:
    workers: int  # local generator processes (1: Locust's local runner)
    expect_workers: int  # remote workers (mme bench-worker) to wait for
    master_bind_host: str
    master_port: int  # 0: any free port
    worker_wait_s: float

    @property
    def distributed(self) -> bool:
        return self.workers > 1 or self.expect_workers > 0

    @property
    def local_workers(self) -> int:
        """Worker processes the master starts on this machine (none with --workers 1)."""
        return self.workers if self.workers > 1 else 0

    @property
    def count(self) -> int:
        """Generator processes the run waits for."""
        return self.local_workers + self.expect_workers if self.distributed else 1


@dataclass(frozen=True)
class StopConditions:
    stop_on_failure: bool
    max_p95_ms: float | None
    drain_s: float  # when the run ends, requests in flight get this long to answer (then: cut off)
    max_failure_rate: float  # the run fails (exit code 1) above this share of failed requests


@dataclass(frozen=True)
class BenchConfig:
    output: RunOutput
    endpoint: EndpointSettings
    targets: TargetSettings
    payload: Payload  # the body every request sends (a mix: its first target's; each target's in targets.mix)
    load: LoadSettings
    client: ClientSettings
    generators: GeneratorSettings
    stops: StopConditions
    in_process: InProcessResult | None = None  # the in-process baseline measured before the run (bench.in_process)

    def to_json(self) -> str:
        """The configuration as JSON text, for another process (bodies in base64)."""
        return json.dumps(_plain(self))

    @classmethod
    def from_json(cls, text: str) -> "BenchConfig":
        config = _typed(cls, json.loads(text))
        assert isinstance(config, cls)
        return config

    def write(self, path: Path) -> None:
        path.write_text(self.to_json())

    @classmethod
    def read(cls, path: Path) -> "BenchConfig":
        return cls.from_json(path.read_text())


# -- the process boundary: typed records <-> JSON values ------------------------------------------
def _plain(value: Any) -> Any:
    """``value`` as JSON values: records as objects, tuples as lists, bytes as base64, paths as text."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _typed(kind: Any, data: Any) -> Any:
    """The inverse of :func:`_plain` for a value of type ``kind``, led by the records' annotations."""
    origin, args = get_origin(kind), get_args(kind)
    if origin in (Union, types.UnionType):
        if data is None:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _typed(inner, data)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_typed(args[0], v) for v in data)
        return tuple(_typed(a, v) for a, v in zip(args, data))
    if kind is bytes:
        return base64.b64decode(data)
    if kind is Path:
        return Path(data)
    if isinstance(kind, type) and is_dataclass(kind):
        hints = get_type_hints(kind)
        return kind(**{f.name: _typed(hints[f.name], data[f.name]) for f in fields(kind) if f.init and f.name in data})
    return data
