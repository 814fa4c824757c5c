"""The endpoint's CloudWatch-named metrics (serving.runtime.metrics) and instance sampler
(serving.monitor.instance_metrics). Fast; no Triton needed.

Sources: AWS, "Monitor Amazon SageMaker AI with Amazon CloudWatch" (invocation, multi-model
loading and instance metrics: names, units, statistics) and /work/shared/reference.md, "What
SageMaker's MME front end and Triton's SageMaker mode actually do" (CloudWatch MME metrics).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import types

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

import serving.monitor.instance_metrics as instance_metrics
from mme.errors import UsageError
from serving.monitor.instance_metrics import InstanceReading, InstanceSampler
from serving.runtime.metrics import EndpointMetrics

BUSY_CHILD = "import time\nend = time.time() + 10\nwhile time.time() < end:\n    pass\n"


def families(metrics: EndpointMetrics) -> dict[str, dict[tuple, float]]:
    """Sample name -> {labels: value} from the Prometheus text, as a scraper parses it."""
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(metrics.prometheus_text().decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_overhead_latency_includes_the_model_loading_wait():
    """AWS CloudWatch page / reference.md: OverheadLatency is the time from the request's arrival to
    the response minus ModelLatency, so a request that waited for a load carries that wait in
    OverheadLatency too; ModelLoadingWaitTime is sampled only for requests that waited."""
    m = EndpointMetrics()
    m.request("a.tar.gz", 200, model_us=1_000, total_us=2_501_500, wait_us=2_500_000, hit=False)
    m.request("a.tar.gz", 200, model_us=1_000, total_us=1_300, wait_us=0.0, hit=True)
    lat = m.snapshot()["latency_us"]
    assert lat["OverheadLatency"]["max"] == pytest.approx(2_500_500)
    assert lat["OverheadLatency"]["min"] == pytest.approx(300)
    assert lat["OverheadLatency"]["count"] == 2
    assert lat["ModelLoadingWaitTime"]["count"] == 1 and lat["ModelLoadingWaitTime"]["sum"] == 2_500_000
    assert lat["ModelLatency"] == {"count": 2, "sum": 2_000, "min": 1_000, "max": 1_000, "avg": 1_000}


def test_model_cache_hit_average_is_the_hit_ratio():
    """AWS CloudWatch page / reference.md: ModelCacheHit is 0/1 per request; its Average is the hit
    ratio, its Sum the hits, its SampleCount the requests."""
    m = EndpointMetrics()
    for hit in (True, True, False, True, False, True, True, True):
        m.request("m", 200, model_us=10, total_us=20, wait_us=0 if hit else 5, hit=hit)
    snap = m.snapshot()
    stat = snap["latency_us"]["ModelCacheHit"]
    assert (stat["count"], stat["sum"], stat["avg"]) == (8, 6, 0.75)
    assert (stat["min"], stat["max"]) == (0, 1)
    assert snap["counts"]["ModelCacheHit"] == 6 and snap["counts"]["ModelCacheMiss"] == 2
    assert snap["units"]["ModelCacheHit"] == "None" and snap["units"]["ModelLatency"] == "Microseconds"


def test_4xx_and_5xx_counted_per_status():
    """AWS CloudWatch page: Invocations counts every InvokeEndpoint request; Invocation4XXErrors and
    Invocation5XXErrors the 4xx/5xx answers (reference.md: 424 ModelError and 429 are 4xx);
    InvocationsPerInstance = Invocations / instances (one here)."""
    m = EndpointMetrics()
    for status in (200, 200, 400, 413, 424, 429, 500, 503):
        m.request("m", status, model_us=0, total_us=100, wait_us=0, hit=None)
    c = m.snapshot()["counts"]
    assert (c["Invocations"], c["Invocation4XXErrors"], c["Invocation5XXErrors"]) == (8, 4, 2)
    assert c["InvocationsPerInstance"] == 8
    assert (c["Invocations.ok"], c["Invocations.model_error"], c["Invocations.error"]) == (2, 1, 5)
    p = families(m)
    assert p["Invocations"] == {(("outcome", "ok"),): 2, (("outcome", "model_error"),): 1, (("outcome", "error"),): 5}
    assert p["Invocation4XXErrors"] == {(): 4} and p["Invocation5XXErrors"] == {(): 2}
    two = EndpointMetrics(instance_count=2)
    two.request("m", 200, model_us=1, total_us=2, wait_us=0, hit=True)
    assert two.snapshot()["counts"]["InvocationsPerInstance"] == 0.5


def test_request_that_needed_no_model_emits_no_cache_or_latency_sample():
    """AWS CloudWatch page: ModelCacheHit is sent for requests to a multi-model endpoint's models;
    a request rejected before a model was needed (hit=None), or never sent to the container
    (model_us=0), adds no ModelCacheHit or ModelLatency sample but is an invocation."""
    m = EndpointMetrics()
    m.request("", 400, model_us=0.0, total_us=150.0, wait_us=0.0, hit=None)
    m.request("big.tar.gz", 413, model_us=0.0, total_us=0.0, wait_us=0.0, hit=None)  # untimed refusal
    snap = m.snapshot()
    assert snap["latency_us"]["ModelCacheHit"]["count"] == 0 and snap["latency_us"]["ModelLatency"]["count"] == 0
    assert snap["latency_us"]["OverheadLatency"]["count"] == 1  # total_us=0: not timed
    assert snap["counts"]["ModelCacheHit"] == 0 and snap["counts"]["ModelCacheMiss"] == 0
    assert snap["counts"]["Invocations"] == 2 and snap["counts"]["Invocation4XXErrors"] == 2


def test_prometheus_text_keeps_cloudwatch_names():
    """AWS CloudWatch page / reference.md: the metric names are CloudWatch's; the exposition must not
    rename them (prometheus_client's Counter would add ``_total``); latencies are histograms."""
    m = EndpointMetrics()
    m.request("a", 200, model_us=700, total_us=3_000, wait_us=2_000, hit=False)
    m.request("a", 200, model_us=1_200, total_us=1_500, wait_us=0, hit=True)
    m.request("b", 500, model_us=900, total_us=1_000, wait_us=0, hit=True)
    m.model_loaded(1.5, 0.25, None)
    m.model_unloaded(0.1, evicted=True)
    m.memory(300, 1_000, 2)
    p = families(m)
    names = set(p)
    assert {"Invocations", "Invocation4XXErrors", "Invocation5XXErrors", "InvocationsPerInstance",
            "ModelCacheHit", "ModelLatency_bucket", "ModelLatency_sum", "ModelLatency_count",
            "OverheadLatency_bucket", "ModelLoadingWaitTime_bucket", "ModelLoadingTime_bucket",
            "ModelDownloadingTime_bucket", "ModelUnloadingTime_bucket", "LoadedModelCount",
            "MemoryLimitUtilization"} <= names
    assert not [n for n in names if n.endswith("_total") or n.endswith("_created")]
    assert p["ModelCacheHit"] == {(): 2} and p["ModelCacheMiss"] == {(): 1}
    assert p["ModelLatency_count"] == {(): 3} and p["ModelLatency_sum"] == {(): 2_800}
    buckets = {dict(k)["le"]: v for k, v in p["ModelLatency_bucket"].items()}
    assert (buckets["500.0"], buckets["1000.0"], buckets["2500.0"], buckets["+Inf"]) == (0, 2, 3, 3)
    assert p["MemoryLimitUtilization"] == {(): 30.0}
    # instance gauges not measured yet, and GPU ones on a host without a GPU, are absent
    assert "CPUUtilization" not in names and "GPUUtilization" not in names
    other = EndpointMetrics()  # one registry each: nothing shared
    assert families(other)["Invocations"] == {(("outcome", o),): 0 for o in ("ok", "model_error", "error")}


def test_snapshot_keeps_what_the_bench_reads():
    """reference.md (metrics the bench compares with CloudWatch): schema_version 1 and the counts,
    latency_us and gauges keys bench/analysis.py and bench/run.py read; MemoryUtilization has
    CloudWatch's meaning (host memory) and the endpoint's limit share is MemoryLimitUtilization."""
    from bench.endpoint_stages import endpoint_stage

    m = EndpointMetrics()
    before = m.snapshot()
    m.request("a", 200, model_us=2_000, total_us=2_500, wait_us=0, hit=True)
    m.request("b", 424, model_us=1_000, total_us=5_000, wait_us=3_000, hit=False)
    m.model_loaded(2.0, None, 0.5)
    m.memory(512, 2_048, 3)
    m.instance(InstanceReading(cpu_percent=150.123, memory_percent=12.5, disk_percent=40.0,
                               gpu_percent=None, gpu_memory_percent=None))
    snap = json.loads(json.dumps(m.snapshot()))
    assert snap["schema_version"] == 1
    for key in ("ModelLoads", "ModelEvictions", "ModelCacheHit", "ModelCacheMiss", "Invocations.ok",
                "Invocations.model_error", "Invocations.error", "Invocations", "Invocation4XXErrors",
                "Invocation5XXErrors", "InvocationsPerInstance", "ContainerRestarts"):
        assert key in snap["counts"], key
    for key in ("ModelLatency", "OverheadLatency", "ModelLoadingWaitTime", "ModelDownloadingTime",
                "ModelLoadingTime", "ModelUnloadingTime", "ModelExtractionTime", "ModelCacheHit"):
        assert set(snap["latency_us"][key]) == {"count", "sum", "min", "max", "avg"}, key
    g = snap["gauges"]
    assert (g["LoadedModelCount"], g["MemoryUsedBytes"], g["MemoryLimitBytes"], g["MemoryLimitUtilization"]) == (3, 512, 2_048, 25.0)
    assert (g["MemoryUtilization"], g["CPUUtilization"], g["DiskUtilization"]) == (12.5, 150.12, 40.0)
    assert g["GPUUtilization"] is None and g["GPUMemoryUtilization"] is None
    assert snap["units"]["CPUUtilization"] == "Percent" and snap["units"]["MemoryUsedBytes"] == "Bytes"
    stage = endpoint_stage(snap, before)
    assert (stage.model_loads, stage.cache_hits, stage.cache_misses, stage.invocations_ok) == (1, 1, 1, 1)
    assert stage.model_latency_avg_ms == pytest.approx(1.5) and stage.memory_utilization == 25.0


def test_concurrent_requests_are_all_counted():
    """reference.md: the endpoint records from its asyncio loop while snapshots are read from other
    threads; no sample may be lost."""
    m = EndpointMetrics()

    def hammer() -> None:
        for i in range(2_000):
            m.request("m", 200, model_us=10, total_us=20, wait_us=0, hit=i % 2 == 0)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        m.snapshot(), m.prometheus_text()
    for t in threads:
        t.join()
    snap = m.snapshot()
    assert snap["counts"]["Invocations"] == 8_000 and snap["latency_us"]["ModelCacheHit"]["avg"] == 0.5


@pytest.fixture
def busy_child():
    child = subprocess.Popen([sys.executable, "-c", BUSY_CHILD])
    try:
        yield child
    finally:
        child.kill()
        child.wait()


def test_instance_sampler_reads_cpu_memory_and_disk_of_real_processes(busy_child, tmp_path):
    """AWS CloudWatch page: CPUUtilization is the sum of the cores' utilisation by the container's
    processes; MemoryUtilization the share of the instance's memory they use (reference.md: RSS of
    the process tree over host RAM); DiskUtilization the disk space used (the model cache's disk)."""
    sampler = InstanceSampler(lambda: [busy_child.pid], tmp_path, gpu=False)
    time.sleep(0.1)
    sampler.sample()  # baseline
    time.sleep(0.5)
    reading = sampler.sample()
    rss = psutil.Process(busy_child.pid).memory_info().rss
    assert reading.processes == 1 and reading.interval_s == pytest.approx(0.5, abs=0.2)
    assert reading.cpu_percent > 20
    assert reading.memory_percent == pytest.approx(100.0 * rss / psutil.virtual_memory().total, rel=0.1)
    usage = shutil.disk_usage(tmp_path)
    assert reading.disk_percent == pytest.approx(100.0 * usage.used / usage.total, abs=1.0)
    assert reading.gpu_percent is None and reading.gpu_memory_percent is None
    m = EndpointMetrics()
    m.instance(reading)
    assert m.snapshot()["gauges"]["CPUUtilization"] == round(reading.cpu_percent, 2)
    assert "CPUUtilization" in families(m)


def test_instance_sampler_copes_with_processes_that_come_and_go(tmp_path):
    """reference.md (Triton's python-backend stub processes start and stop with models): processes
    that vanished are skipped, new ones are counted from their start, a failing pid list reads as
    no processes; the disk path may not exist yet (the cache root's filesystem is read)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    pids: list[int] = [gone.pid]
    sampler = InstanceSampler(lambda: list(pids), tmp_path / "not" / "yet", gpu=False)
    first = sampler.sample()
    assert first.processes == 0 and first.cpu_percent == 0.0 and first.interval_s is None
    assert first.disk_percent > 0
    child = subprocess.Popen([sys.executable, "-c", BUSY_CHILD])  # started after the first sample
    try:
        pids.append(child.pid)
        time.sleep(0.5)
        reading = sampler.sample()
        assert reading.processes == 1 and reading.cpu_percent > 20
    finally:
        child.kill()
        child.wait()
    assert sampler.sample().processes == 0

    def broken() -> list[int]:
        raise psutil.NoSuchProcess(1)

    assert InstanceSampler(broken, tmp_path, gpu=False).sample().processes == 0


def fake_nvml(gpus: list[tuple[int, int, int]]) -> types.SimpleNamespace:
    """A pynvml stand-in: per GPU (utilisation %, used bytes, total bytes)."""
    class NVMLError(Exception):
        pass

    return types.SimpleNamespace(
        NVMLError=NVMLError, shutdowns=[],
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=gpus[h][0], memory=0),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=gpus[h][1], total=gpus[h][2], free=0),
        nvmlShutdown=lambda: None,
    )


def test_gpu_metrics_are_summed_over_gpus(monkeypatch, tmp_path):
    """AWS CloudWatch page: GPUUtilization and GPUMemoryUtilization are percent per GPU summed over
    the instance's GPUs (0..100 x GPUs); absent without a GPU."""
    nvml = fake_nvml([(30, 4 * 2**30, 16 * 2**30), (50, 8 * 2**30, 16 * 2**30)])
    monkeypatch.setattr(instance_metrics, "_nvml", lambda: nvml)
    reading = InstanceSampler(lambda: [], tmp_path).sample()
    assert reading.gpu_percent == 80.0 and reading.gpu_memory_percent == 75.0
    assert InstanceSampler(lambda: [], tmp_path, gpu=False).sample().gpu_percent is None
    monkeypatch.setattr(instance_metrics, "_nvml", lambda: None)
    assert InstanceSampler(lambda: [], tmp_path).sample().gpu_memory_percent is None
    with pytest.raises(UsageError):
        InstanceSampler(lambda: [], tmp_path, gpu=True)
