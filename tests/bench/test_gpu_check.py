"""bench.gpu_check on the CPU: the facts as the shell script reads them, the subcommand's
options and errors, latency percentiles, the budgeted steps and the report rewritten after
each, the exit codes, inputs as a request carries them, TF32 settings, the copies loaded to the
threshold with the project's memory meter, and the limit. The whole run on the CPU (--device
cpu), in an environment of the lent host's packages only, is tests/gpu/test_gpu_check_env.py."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from bench.gpu_check import EXIT_FAILED, EXIT_NO_GPU, EXIT_PARTIAL
from bench.gpu_check.budget import Run
from bench.gpu_check.copies import fill_copies, meter_for
from bench.gpu_check.detect import HostFacts, preflight_lines, shell_assignments
from bench.gpu_check.report import GpuCheckReport, Step, markdown, write_report
from bench.gpu_check.runners import ModelInputs, latency, model_inputs
from bench.gpu_check.steps import exit_code, resolve_limit
from mme.cli import main
from mme.errors import UsageError
from packager.formats.torchscript import fp32_math, fp32_settings
from sizing.capacity_report import predict_copies

MIB = 1 << 20


def test_shell_assignments_read_back_by_bash_as_the_script_reads_them():
    facts = HostFacts(torch="2.14.1", torch_cuda=True, gpu_count=2, gpu_name="NVIDIA H200 'SXM'",
                      tensorrt_reason="not installed: run make install-gpu; or $(do not run)", pytest=False)
    text = shell_assignments(facts)
    assert text.splitlines()[0].startswith("PYTHON=")
    script = text + '\nprintf "%s|%s|%s|%s|%s" "$TORCH_CUDA" "$GPU_COUNT" "$GPU_NAME" "$TENSORRT_REASON" "$PYTEST"'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout == "1|2|NVIDIA H200 'SXM'|not installed: run make install-gpu; or $(do not run)|0"


def test_detect_json_has_every_fact(capsys):
    assert main(["gpu-check", "detect", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert list(facts) == list(HostFacts().to_dict())
    assert isinstance(facts["torch_cuda"], bool) and isinstance(facts["nvml_gpus"], int)


@pytest.mark.parametrize("argv, words", [
    (["--max-copies", "0"], "--max-copies: must be a positive integer"),
    (["--limit", "lots"], "--limit 'lots': give an instance type"),
    (["--batches", "1,x"], "--batches: must be a positive integer"),
    (["--threshold", "1.5"], "--threshold: must be a fraction"),
    (["--device", "tpu"], "--device: invalid choice"),
])
def test_bad_options_are_one_line_usage_errors(tmp_path, capsys, argv, words):
    assert main(["gpu-check", "run", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err
    assert not any(tmp_path.iterdir())  # nothing was run


def test_without_a_gpu_run_exits_4_and_writes_the_facts(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this process already sees a GPU")
    assert main(["gpu-check", "run", "--out", str(tmp_path / "out")]) == EXIT_NO_GPU
    out = capsys.readouterr().out
    assert "no usable NVIDIA GPU" in out and "==> preflight" in out
    assert json.loads((tmp_path / "out" / "facts.json").read_text())["torch_cuda"] is False
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert report["complete"] and report["exit_code"] == EXIT_NO_GPU and report["headlines"][0].startswith("NO GPU")
    assert main(["gpu-check", "run", "--out", str(tmp_path / "again"), "--allow-no-gpu"]) == 0


@pytest.mark.parametrize("statuses, device, allow, code", [
    (["ran", "ran"], "cuda", False, 0),
    (["ran", "not measured"], "cuda", False, EXIT_PARTIAL),  # TensorRT absent: partial, not a pass
    (["ran", "failed", "not measured"], "cuda", False, EXIT_FAILED),
    (["ran", "skipped"], "cpu", False, EXIT_NO_GPU),  # the dry run: no GPU figure
    (["ran", "skipped"], "cpu", True, 0),
    (["failed"], "cpu", True, EXIT_FAILED),
])
def test_exit_codes(statuses, device, allow, code):
    assert exit_code(statuses, device, allow) == code


def test_preflight_names_every_part_the_steps_rely_on():
    facts = HostFacts(torch="2.11.0", cuda_build="13.0", driver="580.159.03", torch_cuda=True, gpu_count=1,
                      gpu_name="NVIDIA H200", compute_capability="9.0", gpu_memory_mib=143771, nvml_gpus=1,
                      tensorrt_reason="the tensorrt package is not installed", grpcio="1.62.0", protobuf="5.29.0",
                      config_schema="model_config.desc (tritonclient.grpc: grpc too old)", gzip="zlib",
                      pytriton="0.7.0", libpython="", network_namespace="unshare failed: no permission", docker="none")
    text = "\n".join(preflight_lines(facts))
    for words in ("torch 2.11.0 built for CUDA 13.0", "driver 580.159.03", "1 x NVIDIA H200 (compute capability 9.0, "
                  "143771 MiB)", "TensorRT: absent (the tensorrt package is not installed)", "grpcio 1.62.0, protobuf 5.29.0",
                  "schema from model_config.desc", "gzip through zlib (python-isal absent", "libpython: found",
                  "private network namespace (unshare): unshare failed: no permission"):
        assert words in text


def test_latency_percentiles_per_batch_size():
    calls: list[int] = []

    def run_once(batch: int) -> None:
        calls.append(batch)
        time.sleep(0.001 * batch)

    figures = latency(run_once, [1, 4], warmup=2, iters=5, device="cpu")
    assert calls == [1] * 7 + [4] * 7
    assert set(figures) == {"1", "4"}
    for batch, f in figures.items():
        assert f.p50_ms <= f.p90_ms <= f.p99_ms
        assert f.p50_ms >= int(batch) * 1.0  # slept at least that long
        assert 0 < f.items_per_s <= int(batch) / 0.001
    assert figures["4"].p50_ms > figures["1"].p50_ms


def test_inputs_as_a_served_request_carries_them():
    inputs = ModelInputs(["attention_mask", "input_ids", "token_type_ids", "pixel_values"],
                         [(8,), (8,), (8,), (3, 4, 4)], ["int64", "int64", "int64", "float32"])
    mask, ids, types, pixels = model_inputs(inputs, 2, "cpu")
    assert mask.shape == (2, 8) and bool((mask == 1).all())  # every position attended, whatever the order
    assert bool((types == 0).all()) and bool(((ids >= 1000) & (ids < 2000)).all())
    assert pixels.shape == (2, 3, 4, 4) and pixels.dtype.is_floating_point
    again = model_inputs(inputs, 2, "cpu")
    assert bool((again[1] == ids).all())  # seeded: the same request every run


def test_fp32_math_sets_and_restores_tf32():
    before = fp32_settings()
    assert before == {"matmul": "ieee", "conv": "tf32", "rnn": "tf32"}  # PyTorch's defaults differ per operator
    with fp32_math(False) as off:
        assert off == {"matmul": "ieee", "conv": "ieee", "rnn": "ieee"} and fp32_settings() == off
    with fp32_math(True) as on:
        assert on == {"matmul": "tf32", "conv": "tf32", "rnn": "tf32"} and fp32_settings() == on
    assert fp32_settings() == before


def test_run_records_failures_holds_to_the_budget_and_saves_after_each_step():
    saved: list[list[str]] = []
    run = Run(budget_s=100.0, after_step=lambda: saved.append([s.status for s in run.steps]))
    ok = run.step("1. one", 1, lambda step: step.figures.update(x=1))

    def broken(step: Step) -> None:
        raise ValueError("bad thing\nsecond line")

    failed = run.step("2. two", 1, broken)
    skipped = run.step("3. three", 1, lambda step: None, skip="needs the GPU")
    missing = run.step("4. TensorRT", 1, lambda step: None, not_measured="no TensorRT on this host")
    late = run.step("5. five", 1000, lambda step: step.figures.update(ran=True))
    assert (ok.status, ok.figures) == ("ran", {"x": 1})
    assert failed.status == "failed" and failed.note == "ValueError: bad thing"
    assert failed.headline == "two: FAILED (ValueError: bad thing)"
    assert (skipped.status, skipped.note, skipped.headline) == ("skipped", "needs the GPU", "")
    assert missing.status == "not measured" and missing.headline == "TensorRT: NOT MEASURED (no TensorRT on this host)"
    assert late.status == "not measured" and late.note.startswith("not started:") and not late.figures
    assert saved == [["ran"], ["ran", "failed"], ["ran", "failed", "skipped"],
                     ["ran", "failed", "skipped", "not measured"],
                     ["ran", "failed", "skipped", "not measured", "not measured"]]


class FakeMeter:
    """Memory that grows by what each copy holds; the first copy also carries a start-up."""

    description = "fake"

    def __init__(self, baseline: int, total: int) -> None:
        self.value, self.size = baseline, total

    def used(self) -> int:
        return self.value

    def total(self) -> int:
        return self.size

    def details(self) -> dict:
        return {}


def test_copies_are_loaded_until_the_next_would_pass_the_threshold():
    meter = FakeMeter(baseline=1000 * MIB, total=80_000 * MIB)

    def load_first() -> str:
        meter.value += 700 * MIB  # the copy (100) and the one-time start-up (600)
        return "first"

    def clone(first: str) -> str:
        meter.value += 100 * MIB
        return "copy"

    limit = 10_000 * MIB
    result = fill_copies(load_first, clone, meter, limit=limit, limit_source="10,000 MiB", threshold=0.9,
                         max_copies=10_000, deadline=time.monotonic() + 60, device="cpu")
    expected = predict_copies(1000 * MIB, 700 * MIB, 100 * MIB, limit, 0.9)
    assert result.copies_loaded == expected == 74  # 1000 + 700 + 73 x 100 = 9000 = 90% of 10,000
    assert result.stopped_by == "threshold" and result.predicted_copies == expected
    assert result.first_copy_mib == 700 and result.per_copy_mib == 100 and result.used_at_stop_mib == 9000
    assert result.share_of_limit == 0.9 and result.device_total_mib == 80_000 and result.limit_mib == 10_000


def test_copies_stop_at_the_cap_or_the_deadline_and_say_which():
    meter = FakeMeter(0, 1 << 40)

    def grow(*_args) -> str:
        meter.value += MIB
        return "copy"

    capped = fill_copies(grow, grow, meter, limit=1 << 40, limit_source="", threshold=0.9, max_copies=5,
                         deadline=time.monotonic() + 60, device="cpu")
    assert (capped.copies_loaded, capped.stopped_by) == (5, "max copies")
    late = fill_copies(grow, grow, meter, limit=1 << 40, limit_source="", threshold=0.9, max_copies=5,
                       deadline=time.monotonic() - 1, device="cpu")
    assert (late.copies_loaded, late.stopped_by) == (1, "deadline")


def test_copies_measured_with_the_host_meter():
    import mmap
    import os

    size = 48 * MIB
    alive = []

    def load_copy(*_args) -> mmap.mmap:
        # fresh pages of its own (malloc could hand back heap pages earlier tests left resident),
        # every one written: resident
        region = mmap.mmap(-1, size)
        for offset in range(0, size, mmap.PAGESIZE):
            region[offset] = 1
        alive.append(region)
        return region

    meter = meter_for("cpu", lambda: [os.getpid()])
    result = fill_copies(load_copy, load_copy, meter, limit=1 << 40, limit_source="", threshold=0.9, max_copies=3,
                         deadline=time.monotonic() + 60, device="cpu")
    assert result.counted.startswith("host RSS of this process") and len(result.deltas_mib) == 3
    assert result.per_copy_mib == pytest.approx(48, abs=8)


def test_the_limit_is_an_instance_types_usable_memory_the_device_or_a_size():
    size, source = resolve_limit("ml.g5.2xlarge", 143_771 * MIB)
    assert size == 23_028 * MIB and "A10G" in source and "usable" in source
    assert resolve_limit("device", 143_771 * MIB) == (143_771 * MIB, "the whole device (143771 MiB)")
    assert resolve_limit("20G", 1)[0] == 20 << 30
    with pytest.raises(UsageError, match="--limit 'ml.nope': give an instance type"):
        resolve_limit("ml.nope", 1)


def test_report_files_and_markdown(tmp_path):
    facts = HostFacts(torch="2.14.1", gpu_name="NVIDIA H200", compute_capability="9.0")
    steps = [Step("3. TorchScript latency", "ran", 1.5, "",
                  {"latency_ms_fp32": {"1": {"p50_ms": 1.0, "p90_ms": 1.5, "p99_ms": 2.0, "items_per_s": 900.0}}},
                  headline="TorchScript resnet50 batch 1 p50: 1.0 ms fp32"),
             Step("5. TensorRT", "not measured", 0.0, "no TensorRT on this host",
                  headline="TensorRT: NOT MEASURED (no TensorRT on this host)")]
    report = GpuCheckReport(facts=facts, preflight=["python 3.12"], device="cuda", model="resnet50", batches=[1],
                            threshold=0.9, seconds=2.0, steps=steps)
    json_path, md_path = write_report(report, tmp_path)
    written = json.loads(json_path.read_text())
    assert written["complete"] is False and written["exit_code"] is None
    assert written["headlines"] == ["TorchScript resnet50 batch 1 p50: 1.0 ms fp32",
                                    "TensorRT: NOT MEASURED (no TensorRT on this host)"]
    assert written["facts"]["gpu_name"] == "NVIDIA H200" and written["steps"][1]["status"] == "not measured"
    text = md_path.read_text()
    assert text == markdown(report)
    assert text.startswith("# GPU check: NVIDIA H200 (compute capability 9.0)")
    assert "INCOMPLETE" in text and "- **TensorRT: NOT MEASURED (no TensorRT on this host)**" in text
    assert "| 1 | 1.0 | 1.5 | 2.0 | 900.0 |" in text
    assert "| 5. TensorRT | not measured | 0.0 | no TensorRT on this host |" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_check.json", "gpu_check.md"]
