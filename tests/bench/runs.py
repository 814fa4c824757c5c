"""Recorded bench runs built by hand, through the saved-results contract (bench.results),
so analysis results can be checked against answers computed by hand."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bench.results import RequestRecord, RequestWriter, RunInfo, StageRecord, append_endpoint_metrics, write_stages


@dataclass
class RunBuilder:
    run_dir: Path
    requests: list[RequestRecord] = field(default_factory=list)
    stages: list[StageRecord] = field(default_factory=list)

    def stage(self, users: int, start: float, end: float, cpu_max: float = 40.0, cpu_mean: float = 30.0,
              saturated: int = 0) -> int:
        index = len(self.stages)
        self.stages.append(StageRecord(index, start, end, users, 2.0, cpu_max, cpu_mean, saturated))
        return index

    def ok(self, stage: int, latencies: list[float], users: int | None = None, t0: float | None = None,
           dt: float = 0.001) -> None:
        s = self.stages[stage] if stage < len(self.stages) else None
        start = t0 if t0 is not None else (s.start_t if s else 0.0)
        for i, latency in enumerate(latencies):
            self.requests.append(RequestRecord(start + dt * i, stage, users if users is not None else s.users,
                                               f"m-v{i % 3 + 1}.tar.gz", latency, 1, 200, "", "host:1"))

    def fail(self, stage: int, t: float, users: int, error: str = "ModelError", status: int = 424,
             latency: float = 5.0) -> None:
        self.requests.append(RequestRecord(t, stage, users, "m-v1.tar.gz", latency, 0, status, error, "host:1"))

    def write(self, stopped_reason: str | None = "completed", write_stages_file: bool = True,
              **run_fields) -> Path:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        info = dict(run_id=self.run_dir.name, endpoint="local", endpoint_url="http://127.0.0.1:8080",
                    region="us-east-1", mode="multi", model="resnet50", format="onnx",
                    instance_type="ml.g5.2xlarge", copies=10, target_distribution="uniform", client="fast",
                    workers=1, shape="staged", content_type="application/json", payload_bytes=1234,
                    started_at="2025-01-01T00:00:00Z",
                    ended_at="2025-01-01T00:10:00Z" if stopped_reason else None,
                    stopped_reason=stopped_reason)
        info.update(run_fields)
        RunInfo(**info).write(self.run_dir)
        writer = RequestWriter(self.run_dir)
        writer.write(sorted(self.requests, key=lambda r: r.t))
        writer.close()
        if write_stages_file:
            write_stages(self.run_dir, self.stages)
        return self.run_dir

    def metrics(self, stage: int, counts: dict, loaded: int | None = None, memory_pct: float | None = None,
                model_latency: tuple[int, float] | None = None, at: str = "end") -> None:
        snapshot = {"schema_version": 1, "counts": counts, "latency_us": {}, "gauges": {}}
        if model_latency is not None:
            count, total = model_latency
            snapshot["latency_us"]["ModelLatency"] = {"count": count, "sum": total, "max": 0, "avg": None}
        if loaded is not None:
            snapshot["gauges"]["LoadedModelCount"] = loaded
        if memory_pct is not None:
            snapshot["gauges"]["MemoryUtilization"] = memory_pct
        append_endpoint_metrics(self.run_dir, stage, float(stage), snapshot, at=at)


def staged_run(run_dir: Path, **run_fields) -> Path:
    """Four user levels (10 s each):

    stage 0, 10 users: ok [10, 20, 30, 40] ms                 -> 0.4 req/s, p50 25
    stage 1, 20 users: ok [5, 10, ..., 50] ms                 -> 1.0 req/s, p50 27.5
    stage 2, 40 users: ok [100, 200, 300, 400], 2 failures    -> 0.6 req/s; first failure at 37 users
    stage 3, 60 users: ok [500, 600, 700], generator saturated -> 0.3 req/s
    """
    b = RunBuilder(run_dir)
    for users, start in ((10, 0.0), (20, 10.0), (40, 20.0), (60, 30.0)):
        b.stage(users, start, start + 10.0, saturated=int(users == 60), cpu_max=95.0 if users == 60 else 40.0)
    b.ok(0, [40, 10, 30, 20])
    b.ok(1, [5 * i for i in range(1, 11)])
    b.ok(2, [100, 200, 300, 400])
    b.fail(2, t=27.0, users=40, error="", status=0)
    b.fail(2, t=25.0, users=37, error="ModelError", status=424)
    b.ok(3, [500, 600, 700])
    return b.write(**run_fields)


def clean_run(run_dir: Path, p50s: tuple[float, ...] = (8.0, 9.0, 12.0), per_stage: int = 20, **run_fields) -> Path:
    """Error-free stages of 10, 20, 40 users, 10 s each, every request at the stage's p50."""
    b = RunBuilder(run_dir)
    for i, (users, latency) in enumerate(zip((10, 20, 40), p50s)):
        b.stage(users, 10.0 * i, 10.0 * (i + 1))
        b.ok(i, [latency] * per_stage * (i + 1))
    return b.write(**run_fields)


def sizing_run(run_dir: Path) -> Path:
    """One-second stages: 50, 100, 200 req/s without failures at p95 50, 80, 180 ms, then
    250 req/s with 10 failures at p95 400 ms."""
    b = RunBuilder(run_dir)
    for i, (users, n, latency) in enumerate(((10, 50, 50.0), (20, 100, 80.0), (40, 200, 180.0), (80, 240, 400.0))):
        b.stage(users, float(i), float(i + 1))
        b.ok(i, [latency] * n)
    for k in range(10):
        b.fail(3, t=3.5 + 0.01 * k, users=80)
    return b.write()
