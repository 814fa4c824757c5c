"""bench.gpu_check on the CPU: the facts as the shell script reads them, the subcommand's
options and errors, latency percentiles, the budgeted steps, the copies measured with the
project's memory meter, and the report. The whole run on the CPU (--device cpu) is in
tests/docker/test_gpu_check_script.py."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from bench.gpu_check import EXIT_NO_GPU
from bench.gpu_check.copies import measure_copies
from bench.gpu_check.detect import HostFacts, shell_assignments
from bench.gpu_check.report import GpuCheckReport, Step, markdown, write_report
from bench.gpu_check.runners import latency
from bench.gpu_check.steps import Run
from mme.cli import main
from serving.capacity import predict

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
    (["--copies", "1"], "--copies: must be an integer of at least 2"),
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
    assert "no usable NVIDIA GPU" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "facts.json").read_text())["torch_cuda"] is False


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


def test_run_records_failures_and_holds_to_the_budget():
    run = Run(budget_s=100.0)
    ok = run.step("one", 1, lambda step: step.figures.update(x=1))

    def broken(step: Step) -> None:
        raise ValueError("bad thing\nsecond line")

    failed = run.step("two", 1, broken)
    skipped = run.step("three", 1, lambda step: None, skip="needs step 9")
    late = run.step("four", 1000, lambda step: step.figures.update(ran=True))
    assert (ok.status, ok.figures) == ("ran", {"x": 1})
    assert failed.status == "failed" and failed.note == "ValueError: bad thing"
    assert (skipped.status, skipped.note) == ("skipped", "needs step 9")
    assert late.status == "skipped" and late.note.startswith("not started:") and not late.figures


def test_copies_measured_with_the_host_meter_and_predicted_as_mme_capacity_does():
    size = 48 * MIB

    def load_copy() -> bytes:
        return b"\x01" * size  # every page written: resident

    copies = measure_copies(load_copy, 3, 0.9, device="cpu")
    assert copies.memory_method == "host RSS of the Triton process tree"
    assert len(copies.deltas_mib) == 3 and copies.first_copy_mib == copies.deltas_mib[0]
    assert copies.per_copy_mib == pytest.approx((copies.deltas_mib[1] + copies.deltas_mib[2]) / 2, abs=0.1)
    assert copies.per_copy_mib == pytest.approx(48, abs=8)
    extra = max(0.0, copies.first_copy_mib - copies.per_copy_mib)
    expected = predict(int((copies.baseline_mib + extra) * MIB), copies.per_copy_mib * MIB,
                       copies.gpu_total_mib * MIB, 0.9)
    assert copies.copies_that_fit == pytest.approx(expected, rel=0.01)


def test_report_files_and_markdown(tmp_path):
    facts = HostFacts(torch="2.14.1", gpu_name="NVIDIA H200", compute_capability="9.0")
    steps = [Step("1. TorchScript latency", "ran", 1.5, "",
                  {"latency_ms": {"1": {"p50_ms": 1.0, "p90_ms": 1.5, "p99_ms": 2.0, "items_per_s": 900.0}}}),
             Step("3. TensorRT", "skipped", 0.0, "the tensorrt package is not installed")]
    report = GpuCheckReport(facts=facts, device="cuda", model="resnet50", batches=[1], threshold=0.9, seconds=2.0,
                            steps=steps)
    json_path, md_path = write_report(report, tmp_path)
    written = json.loads(json_path.read_text())
    assert written["facts"]["gpu_name"] == "NVIDIA H200" and written["steps"][1]["status"] == "skipped"
    text = md_path.read_text()
    assert text == markdown(report)
    assert text.startswith("# GPU check: NVIDIA H200 (compute capability 9.0)")
    assert "| 1 | 1.0 | 1.5 | 2.0 | 900.0 |" in text
    assert "| 3. TensorRT | skipped | 0.0 | the tensorrt package is not installed |" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_check.json", "gpu_check.md"]
