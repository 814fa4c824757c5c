"""mme capacity on the real server: the prediction holds on this host."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from mme.cli import main
from packager.manifest import Manifest
from sizing.capacity_report import format_table


@pytest.mark.integration
def test_capacity_prediction_matches_what_fits(packaged_test_resnet, tmp_path, capsys):
    code = main(["capacity", str(packaged_test_resnet.directory), "--memory-limit", "1100M", "--probe-copies", "2",
                 "--cycles", "2", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    report = json.loads((tmp_path / "capacity_test_resnet_cpu-local.json").read_text())
    predicted, actual = report["predicted_copies"], report["actual_copies"]
    assert actual >= 2
    assert abs(predicted - actual) <= max(1, round(0.1 * actual)), (predicted, actual)
    assert all(step["delta_bytes"] > 0 for step in report["steps"])
    assert report["steps"][actual - 1]["memory_bytes"] <= 0.9 * report["limit_bytes"]
    assert report["leak_check"]["returned_to_baseline"] is True
    assert {p["instance_type"] for p in report["projections"]} == {
        "ml.g4dn.2xlarge", "ml.g5.2xlarge", "ml.p3.2xlarge", "ml.g6.2xlarge", "ml.g6e.2xlarge"}
    g6e = next(p for p in report["projections"] if p["instance_type"] == "ml.g6e.2xlarge")
    g5 = next(p for p in report["projections"] if p["instance_type"] == "ml.g5.2xlarge")
    assert g6e["copies"] >= 2 * g5["copies"]
    # projected onto the usable memory the driver reports, not the nominal size
    assert (g5["memory_bytes"], g5["memory_basis"], g5["nominal_gib"]) == (23028 << 20, "usable", 24)
    assert f"predicted {predicted}, actual {actual}" in out
    # the first copy apart, the per-copy figure from the copies after it (2 probes: copy 2)
    steps = report["steps"]
    assert report["first_copy_bytes"] == steps[0]["delta_bytes"] == report["first_copy_loaded_bytes"]
    assert report["first_copy_rest_bytes"] == steps[0]["rest_delta_bytes"]
    assert report["footprint_mean_bytes"] == steps[1]["delta_bytes"] and report["per_copy_basis"] == "copy 2, after the first"
    assert "one-time start-up" in report["definitions"]["first_copy_bytes"] and "usable" in report["definitions"]["projections.memory_bytes"]
    assert "first copy" in out and "per copy after the first" in out and "usable" in out
    # each copy read at rest and after requests at its max batch size; the prediction counts the latter
    assert report["counted"] == "loaded" and report["warmup_batch"] == packaged_test_resnet.manifest.triton.max_batch_size
    assert report["footprint_loaded_mean_bytes"] == report["footprint_mean_bytes"]
    assert report["footprint_loaded_mean_bytes"] > report["footprint_rest_mean_bytes"] > 0
    assert report["predicted_copies_rest"] >= report["predicted_copies_loaded"] == predicted
    assert all(0 < s["rest_delta_bytes"] <= s["delta_bytes"] for s in report["steps"][:actual])
    assert max(s["memory_bytes"] for s in report["steps"]) <= report["limit_bytes"]  # never loaded past the limit
    assert "at rest" in out and "loaded after requests up to batch" in out and report["warmup_concurrency"] == 16
    # then the callers the endpoint will serve, JSON bodies as mme bench sends by default, counted once
    assert report["overhead_concurrency"] == 200 and report["overhead_body"] == "json" and report["overhead_bytes"] >= 0
    assert "requests in flight from 200 callers (json bodies)" in out


@pytest.mark.integration
def test_a_limit_too_small_for_one_copy_loads_one_and_says_what_limit_would_fit(packaged_test_resnet, tmp_path,
                                                                                   capsys):
    code = main(["capacity", str(packaged_test_resnet.directory), "--memory-limit", "120M", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    report = json.loads((tmp_path / "capacity_test_resnet_cpu-local.json").read_text())
    assert len(report["steps"]) == 1 and report["predicted_copies"] == 0  # one copy to measure, none past it
    needed = report["limit_for_one_bytes"]
    assert needed * 0.9 >= report["baseline_bytes"] + report["first_copy_bytes"] > report["limit_bytes"] * 0.9
    assert "one copy fits under a limit of" in out
    # with one copy the first stands in for the per-copy figure, and the report says so
    assert report["footprint_mean_bytes"] == report["first_copy_bytes"]
    assert "the only one measured" in report["per_copy_basis"] and "the only one measured" in out


def test_both_loops_share_one_report_from_their_readings():
    """Readings -> footprint -> prediction -> copies that fit -> projections: build_capacity_report, used
    by the local loop and by the one against an endpoint (sizing.capacity_remote)."""
    import pytest

    from sizing.capacity_report import Footprint, Readings, build_capacity_report

    mib = 2**20
    readings = Readings("m", "onnx", "host RSS", 1000 * mib, 0.9, 100 * mib)
    for memory in (200, 300, 450, 460):
        readings.record(memory * mib, 0.5)
    assert [(s.copies, s.delta_bytes // mib) for s in readings.steps] == [(1, 100), (2, 100), (3, 150), (4, 10)]
    instances = {"ml.small": {"gpu": "T4", "gpu_memory_gib": 1}, "ml.big": {"gpu": "L40S", "gpu_memory_gib": 4}}
    report = build_capacity_report(readings, readings.steps[:2], instances=instances)
    assert report.first_copy_bytes == 100 * mib  # copy 1
    assert report.footprint_mean_bytes == 100 * mib and report.footprint_max_bytes == 100 * mib  # copy 2
    assert report.predicted_copies == 8 and report.actual_copies == 4  # 1 + (900 - 100 - 100) / 100; all four under 900
    assert [(p.instance_type, p.gpu, p.copies, p.memory_basis) for p in report.projections] == [
        ("ml.small", "T4", 8, "nominal"), ("ml.big", "L40S", 35, "nominal")]  # rows without a usable figure
    every = build_capacity_report(readings, verified=False, instances=instances)
    # per copy over copies 2-4 (100, 150, 10): the first is counted apart
    assert every.footprint_min_bytes == 10 * mib and every.footprint_mean_bytes == 260 * mib // 3
    assert every.per_copy_basis == "copies 2-4, after the first"
    assert every.actual_copies is None and every.predicted_copies == 9 and every.steps == tuple(readings.steps)
    assert Footprint.of(readings.steps[2:]).line() == "per copy 80 MiB (min 10, max 150)"
    with pytest.raises(ValueError):
        Footprint.of([])


def test_the_first_copy_is_counted_once_and_projections_use_usable_memory():
    """On a GPU the first copy carries the one-time CUDA/cuDNN/cuBLAS/ONNX Runtime start-up:
    averaged into every copy it would under-count what fits. The prediction is baseline + first
    + (n - 1) x per copy; instance types are projected onto the memory their driver reports."""
    from sizing.capacity_report import CopyCost, Readings, build_capacity_report, predict, predict_copies

    mib = 2**20
    limit = 24576 * mib
    readings = Readings("m", "onnx", "GPU memory (NVML)", limit, 0.9, 500 * mib)
    for memory in (2000, 2300, 2600):  # the first copy +1500 MiB (start-up + itself), then +300 each
        readings.record(memory * mib, 1.0)
    instances = {"ml.g5.2xlarge": {"gpu": "A10G", "gpu_memory_gib": 24, "gpu_memory_usable_mib": 23028},
                 "ml.other": {"gpu": "A10G", "gpu_memory_gib": 24}}
    report = build_capacity_report(readings, instances=instances)
    assert (report.first_copy_bytes, report.footprint_mean_bytes) == (1500 * mib, 300 * mib)
    budget = 0.9 * 24576  # MiB
    assert report.predicted_copies == 1 + int((budget - 500 - 1500) // 300) == 68
    averaged = predict(500 * mib, 700 * mib, limit, 0.9)  # the old mean over every copy, the first included
    assert averaged == 30 < report.predicted_copies
    g5, other = report.projections
    assert (g5.memory_bytes, g5.memory_basis, g5.nominal_gib) == (23028 * mib, "usable", 24.0)
    assert g5.copies == 1 + int((0.9 * 23028 - 500 - 1500) // 300) == 63  # nominal 24 GiB would say 68
    assert (other.memory_bytes, other.memory_basis, other.copies) == (24 << 30, "nominal", 68)
    assert predict_copies(500 * mib, 1500 * mib, 300 * mib, limit, 0.9) == 68
    assert predict_copies(500 * mib, 30000 * mib, 300 * mib, limit, 0.9) == 0  # not even the first fits
    # copy 1 loaded by an earlier run (the remote loop leaves it out): the start-up is in the baseline
    later = CopyCost.of(readings.steps[1:])
    assert not later.first_measured and later.first_bytes == 300 * mib and "copy 1 was loaded before" in later.basis
    preloaded = build_capacity_report(readings, readings.steps[1:], instances={})
    assert preloaded.first_copy_bytes is None and preloaded.projections == ()
    assert "first copy: not measured" in format_table(preloaded)
    table = format_table(report)
    assert "first copy 1500 MiB" in table and "per copy after the first: mean 300 MiB" in table
    assert "23028 MiB" in table and "(nominal)" in table and "no gpu_memory_usable_mib" in table


def test_the_instance_table_holds_usable_memory_and_checks_user_tables(tmp_path, capsys):
    from mme.errors import UsageError
    from mme.instances import gpu_memory, load_instances

    rows = load_instances()
    usable = {row["gpu"]: row["gpu_memory_usable_mib"] for row in rows.values()}
    assert usable == {"T4": 15360, "A10G": 23028, "V100": 16160, "L4": 23034, "L40S": 46068}
    for row in rows.values():  # below the nominal size, never above
        assert 0.9 * row["gpu_memory_gib"] * 1024 < gpu_memory(row)[0] / 2**20 < row["gpu_memory_gib"] * 1024
    bad = tmp_path / "bad.toml"
    bad.write_text('[instances."ml.x"]\ngpu = "T4"\n')
    with pytest.raises(UsageError, match=r'ml\.x.*needs gpu_memory_gib'):
        load_instances(bad)
    bad.write_text('[instances."ml.x"]\ngpu = "T4"\ngpu_memory_gib = 16\ngpu_memory_usable_mib = "lots"\n')
    with pytest.raises(UsageError, match="gpu_memory_usable_mib must be a positive number of MiB"):
        load_instances(bad)
    code = main(["capacity", str(tmp_path / "artifact"), "--instances", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "gpu_memory_usable_mib" in err and "Traceback" not in err


@pytest.mark.integration
def test_capacity_refuses_host_rss_on_a_gpu_host_without_nvml(packaged_test_resnet, tmp_path, monkeypatch, capsys):
    """A GPU artifact on a host with a GPU but no nvidia-ml-py: one line naming the fix and --memory host."""
    import shutil
    import sys

    from serving.monitor import memory

    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    monkeypatch.setattr(memory, "nvidia_gpu_evidence", lambda: "/dev/nvidia0")  # the probe: a GPU is there
    gpu_artifact = tmp_path / "onnx"
    shutil.copytree(packaged_test_resnet.directory, gpu_artifact)
    manifest = Manifest.load(gpu_artifact)
    replace(manifest, triton=replace(manifest.triton, instance_kind="KIND_GPU")).write(gpu_artifact)
    code = main(["capacity", str(gpu_artifact), "--server", "local", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "/dev/nvidia0" in err and "make install-gpu" in err and "--memory host" in err
    assert not (tmp_path / "out").exists()
    # the CPU format is counted in host memory on the same host: no refusal
    code = main(["capacity", str(packaged_test_resnet.directory), "--probe-copies", "1", "--no-verify",
                 "--memory-limit", "2G", "--concurrency", "2", "--out", str(tmp_path / "cpu")])
    assert code == 0, capsys.readouterr().err


def test_requests_in_flight_are_counted_once_for_the_endpoint():
    """What many callers at once add (request buffers) is the endpoint's: it comes off the budget
    once, and copies read before it was measured are judged with it."""
    from sizing.capacity_report import Readings, build_capacity_report

    mib = 2**20
    readings = Readings("m", "onnx", "host RSS", 1000 * mib, 0.9, 100 * mib)
    for memory in (200, 300):
        readings.record(memory * mib, 0.5)
    assert readings.note_overhead(500 * mib) == 200 * mib and readings.memory_bytes == 500 * mib
    readings.record(600 * mib, 0.5)  # the next copy's delta starts from the reading with requests in flight
    readings.record(700 * mib, 0.5)
    readings.record(950 * mib, 0.5)
    assert [s.delta_bytes // mib for s in readings.steps] == [100, 100, 100, 100, 250]
    report = build_capacity_report(readings, readings.steps[:2], overhead_concurrency=200, overhead_body="json")
    assert report.predicted_copies == 6  # (900 - 100 - 200) / 100, not 8
    assert report.actual_copies == 4 and report.overhead_bytes == 200 * mib
    tight = Readings("m", "onnx", "host RSS", 1000 * mib, 0.9, 100 * mib)
    for memory in (500, 880):
        tight.record(memory * mib, 0.5)
    tight.note_overhead(950 * mib)  # with 70 MiB in flight the second copy no longer fits under 900
    assert tight.fitted() == 1


def test_capacity_bad_artifact(tmp_path, capsys):
    code = main(["capacity", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "has no manifest.json" in err and "Traceback" not in err


class TritonBackedGpu:
    """A stand-in for NVML on one 8 GiB GPU whose memory in use is that of the Triton processes
    on this host (python-backend stubs grow it as copies load): enough to run the GPU path of
    `mme capacity` and the endpoint's GPU eviction against the real server, without a GPU."""

    class NVMLError(Exception):
        pass

    TOTAL = 8 << 30

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        return "Fake GPU"

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return (9, 0)

    def _used(self) -> int:
        import psutil

        used = 256 << 20  # the driver's own reservation
        # Only this test's Triton (a descendant of this process): other test runs on the host
        # start and stop their own, which would make copies look like they freed memory.
        for proc in psutil.Process().children(recursive=True):
            try:
                if proc.name() in ("tritonserver", "triton_python_backend_stub"):
                    used += proc.memory_info().rss
            except psutil.NoSuchProcess:
                continue  # exited between the listing and the reading
        return used

    def nvmlDeviceGetMemoryInfo(self, handle):
        import types

        used = self._used()
        return types.SimpleNamespace(used=used, total=self.TOTAL, free=self.TOTAL - used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return []

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return []


@pytest.mark.integration
def test_capacity_counts_gpu_memory_through_nvml_on_a_gpu_host(packaged_test_resnet, tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", TritonBackedGpu())
    code = main(["capacity", str(packaged_test_resnet.directory), "--memory", "gpu", "--server", "local",
                 "--memory-limit", "1000M", "--probe-copies", "2", "--max-copies", "8", "--binary", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "requests in flight from 200 callers (binary bodies)" in out
    report = json.loads((tmp_path / "capacity_test_resnet_cpu-local.json").read_text())
    assert report["memory_kind"] == "GPU memory of Fake GPU (NVML, whole device)"
    assert report["baseline_bytes"] >= 256 << 20  # NVML's figure, not the process tree's
    assert all(step["delta_bytes"] > 0 for step in report["steps"])
    assert report["actual_copies"] >= 2 and abs(report["predicted_copies"] - report["actual_copies"]) <= 1, out
    assert "projection applies this host-memory footprint" not in out
    # Without --memory-limit the limit is the GPU's memory, not the host's RAM.
    code = main(["capacity", str(packaged_test_resnet.directory), "--memory", "gpu", "--server", "local",
                 "--probe-copies", "1", "--no-verify", "--out", str(tmp_path / "nolimit")])
    assert code == 0
    report = json.loads((tmp_path / "nolimit" / "capacity_test_resnet_cpu-local.json").read_text())
    assert report["limit_bytes"] == TritonBackedGpu.TOTAL


@pytest.mark.integration
def test_the_local_endpoint_counts_the_gpu_for_every_server_kind(packaged_test_resnet, tmp_path, monkeypatch):
    """On a GPU host the eviction threshold is NVML's, whatever Triton runs the models (the
    system kind compared host RSS with host RAM and never saw GPU memory)."""
    import shutil
    import sys

    from serving.monitor.memory import GpuMemoryMeter, HostMemoryMeter
    from serving.runtime.local_endpoint import LocalEndpoint, LocalEndpointOptions

    monkeypatch.setitem(sys.modules, "pynvml", TritonBackedGpu())
    monkeypatch.setenv("TRITON_SERVER_VERSION", "2.61.0")  # a system Triton that accepts any cache directory
    gpu_artifact = tmp_path / "onnx"
    shutil.copytree(packaged_test_resnet.directory, gpu_artifact)
    manifest = Manifest.load(gpu_artifact)
    replace(manifest, triton=replace(manifest.triton, instance_kind="KIND_GPU")).write(gpu_artifact)
    for kind in ("local", "docker", "system"):
        endpoint = LocalEndpoint(LocalEndpointOptions(models=str(gpu_artifact), server_kind=kind))
        try:
            assert isinstance(endpoint.meter, GpuMemoryMeter), kind
            assert endpoint._memory_limit() == TritonBackedGpu.TOTAL
        finally:
            endpoint.stop()
    cpu = LocalEndpoint(LocalEndpointOptions(models=str(packaged_test_resnet.directory), server_kind="local"))
    try:
        assert isinstance(cpu.meter, HostMemoryMeter)  # cpu-local models live in host memory
    finally:
        cpu.stop()
