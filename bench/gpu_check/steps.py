"""The GPU check's steps, each timed and held to the run's budget, the report rewritten after
each one (``complete: false`` until the end):

1. ``mme package MODEL --formats torchscript`` in a child process (random weights, the users'
   code path, a timeout);
2. the nvidia-pytriton wheel's Triton serving python-backend copies of it on the GPU: one copy
   invoked and compared with PyTorch on the CPU, then ``mme capacity``'s GPU path loading
   copies until ``threshold x limit``. It runs before this process touches CUDA, so the device
   holds Triton's memory only. A python-backend copy is a stub process with a CUDA context of its
   own, which Triton's libtorch and TensorRT backends share: its footprint is not projected onto
   instance types;
3. TorchScript latency on CUDA at each batch size, with TF32 off (fp32, as the TensorRT step
   builds by default) and on, CUDA events on a dedicated stream;
4. copies loaded in this process until ``threshold x limit`` (the real count), the first copy
   apart, each figure labelled by what it counts, next to the prediction from the first three;
5. TensorRT, where installed: the same latency for a plan of ``--precision`` (fp32: TF32
   cleared); where not, the headline says NOT MEASURED;
6. a Hugging Face encoder traced on the CPU, run on CUDA and compared with the CPU run.

The limit copies fill is an instance type's usable GPU memory (``mme/instances.toml``;
default ml.g5.2xlarge, the articles' instance), the whole device, or a size.

Exit codes (:func:`run_checks`): 0 every step measured; 1 a step failed; 3 partial (a step
not measured: TensorRT absent, the budget spent); 4 no usable GPU, the CPU dry run included
(``allow_no_gpu``: the dry run exits 0 or 1).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.gpu_check import EXIT_FAILED, EXIT_NO_GPU, EXIT_PARTIAL
from bench.gpu_check.budget import Run
from bench.gpu_check.copies import deep_copy, fill_copies, meter_for
from bench.gpu_check.detect import detect, preflight_lines
from bench.gpu_check.report import GpuCheckReport, Step, markdown, write_facts, write_report
from bench.gpu_check.runners import (
    TIMING,
    empty_cache,
    latency,
    manifest_inputs,
    model_file,
    model_inputs,
    synchronize,
    tensorrt_runner,
    torchscript_runner,
)
from bench.gpu_check.triton import gpu_python_model, triton_serves_a_gpu_copy
from mme.argtypes import byte_size
from mme.errors import UsageError
from mme.fsutil import ensure_writable_dir
from mme.instances import gpu_memory, load_instances
from mme.process import child_env
from packager.formats.torchscript import fp32_math, fp32_settings
from packager.manifest import Manifest
from packager.model import triton_model_name
from sizing.capacity import measure_capacity
from sizing.capacity_report import write_capacity_report

MIB = 1 << 20
GIB = 1 << 30
SOURCE_ROOT = Path(__file__).resolve().parents[2]  # where mme/, packager/, serving/, bench/ live


@dataclass(frozen=True)
class GpuCheckOptions:
    out: Path
    model: str = "resnet50"
    encoder: str = "distilbert-base-uncased"
    seq_len: int = 128
    batches: tuple[int, ...] = (1, 16)
    precision: str = "fp32"  # the TensorRT step's: fp32 with TF32 cleared, like TorchScript's TF32-off run
    limit: str = "ml.g5.2xlarge"  # what copies fill: an instance type's usable GPU memory, "device" or a size
    max_copies: int = 1000  # step 4's cap
    triton_max_copies: int = 40  # step 2's cap
    iters: int = 50
    warmup: int = 10
    threshold: float = 0.9  # share of the limit copies may fill
    budget_s: float = 420.0  # no step starts past this; each has a cap of its own
    device: str = "cuda"  # "cpu": a dry run of every step's code
    allow_no_gpu: bool = False  # exit 0 (not 4) from a run without a GPU, the dry run's
    child_timeout_s: float = 300.0  # any child process (mme package)
    load_timeout_s: float = 120.0  # any model load into Triton


def package_in_child(model: str, formats: str, out: Path, max_batch: int, extra: tuple[str, ...] = (),
            timeout_s: float = 300.0) -> Path:
    """``mme package`` in a child process (no CUDA in this one), stopped after ``timeout_s``."""
    argv = [sys.executable, "-m", "mme", "-q", "package", model, "--no-pretrained", "--formats", formats,
            "--out", str(out), "--max-batch-size", str(max_batch), *extra]
    print("    $ " + " ".join(shlex.quote(a) for a in argv[1:]), flush=True)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, env=child_env(),
                              timeout=max(timeout_s, 1.0))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"mme package {model} --formats {formats} did not finish in {timeout_s:.0f} s") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(f"mme package {model} --formats {formats} exited {done.returncode}: {tail[-1] if tail else ''}")
    return out / triton_model_name(model) / formats


def resolve_limit(spec: str, device_total: int) -> tuple[int, str]:
    """(bytes, what they are) of ``--limit``: an instance type's usable GPU memory
    (mme/instances.toml), ``device`` (the whole GPU or host the check runs on), or a size."""
    if spec == "device":
        return device_total, f"the whole device ({device_total // MIB} MiB)"
    rows = load_instances()
    if spec in rows:
        row = rows[spec]
        size, basis = gpu_memory(row)
        return size, f"{spec}'s {row['gpu']}: {size // MIB} MiB ({basis}, mme/instances.toml)"
    try:
        size = byte_size(spec)
    except Exception:  # noqa: BLE001 - argparse's type raises its own errors
        raise UsageError(f"--limit {spec!r}: give an instance type ({', '.join(rows)}), 'device' or a size like "
                         "20G") from None
    return size, f"{size // MIB} MiB (--limit)"


def _mib(value: float) -> str:
    return f"{value:,.0f} MiB"


class GpuCheck:
    """The six steps' bodies; step 1's artifact is what steps 2-5 use."""

    def __init__(self, options: GpuCheckOptions, work: Path, run: Run) -> None:
        self.options = options
        self.work = work
        self.run = run
        self.max_batch = max(options.batches)
        self.torchscript_dir: Path | None = None

    def _artifact(self) -> Path:
        if self.torchscript_dir is None:
            raise RuntimeError("step 1 did not package the TorchScript model")
        return self.torchscript_dir

    def _child_timeout(self) -> float:
        return min(self.options.child_timeout_s, max(self.run.left(), 30.0))

    def _limit(self) -> tuple[int, str]:
        return resolve_limit(self.options.limit, meter_for(self.options.device, lambda: [os.getpid()]).total())

    def torchscript_package(self, step: Step) -> None:
        o = self.options
        started = time.monotonic()
        self.torchscript_dir = package_in_child(o.model, "torchscript", self.work, self.max_batch, timeout_s=self._child_timeout())
        step.figures.update({"artifact": f"{o.model}/torchscript", "seconds": round(time.monotonic() - started, 1)})

    def triton(self, step: Step) -> None:
        o = self.options
        directory = self._artifact()
        artifact = gpu_python_model(directory, self.work, o.device)
        one = triton_serves_a_gpu_copy(artifact, directory, load_timeout_s=o.load_timeout_s)
        step.figures["one_copy"] = asdict(one)
        if not one.max_abs_diff_vs_pytorch <= 1e-3:
            raise RuntimeError(f"Triton's copy on {o.device} differs from PyTorch on the CPU by {one.max_abs_diff_vs_pytorch:.3g}")
        limit, limit_source = self._limit()
        report = measure_capacity(artifact, threshold=o.threshold, limit_bytes=limit, probe_copies=3, verify=True,
                                  max_copies=o.triton_max_copies, server_kind="local", instances={},
                                  memory="gpu" if o.device == "cuda" else "host", load_timeout_s=o.load_timeout_s)
        path = write_capacity_report(report, o.out)
        first = report.first_copy_bytes
        step.figures.update({
            "counted": report.memory_kind, "limit_mib": round(report.limit_bytes / MIB), "limit_source": limit_source,
            "threshold": o.threshold, "baseline_mib": round(report.baseline_bytes / MIB),
            "first_copy_mib": None if first is None else round(first / MIB),
            "per_copy_mib": round(report.footprint_mean_bytes / MIB), "predicted_copies": report.predicted_copies,
            "actual_copies": report.actual_copies, "max_copies": o.triton_max_copies,
            "load_seconds": [s.load_seconds for s in report.steps], "report": path.name,
            "projections": "none: a python-backend copy carries a CUDA context of its own (one stub process per "
                           "copy), which Triton's libtorch and TensorRT backends share across copies",
        })
        capped = " (the --triton-max-copies cap)" if (report.actual_copies or 0) >= o.triton_max_copies else ""
        step.headline = (f"Triton python-backend copies of {o.model} in {limit_source} at {o.threshold:.0%}: "
                         f"{report.actual_copies} loaded{capped}, {report.predicted_copies} predicted; per copy "
                         f"{_mib(report.footprint_mean_bytes / MIB)}, first "
                         f"{'?' if first is None else _mib(first / MIB)} ({report.memory_kind}); each copy a CUDA "
                         "context of its own: no figure for libtorch or TensorRT copies")

    def torchscript_latency(self, step: Step) -> None:
        o = self.options
        directory = self._artifact()
        _module, run_once = torchscript_runner(model_file(directory, "model.pt"), manifest_inputs(directory), o.device)
        step.figures["pytorch_fp32_defaults"] = fp32_settings()
        step.figures["timing"] = TIMING[o.device]
        for label, tf32 in (("fp32", False), ("tf32", True)):
            with fp32_math(tf32) as settings:
                step.figures[f"math_{label}"] = settings
                step.figures[f"latency_ms_{label}"] = {b: asdict(v) for b, v in
                                                       latency(run_once, list(o.batches), o.warmup, o.iters, o.device).items()}
        first = str(o.batches[0])
        step.headline = (f"TorchScript {o.model} batch {first} p50: {step.figures['latency_ms_fp32'][first]['p50_ms']} ms "
                         f"fp32 (TF32 off), {step.figures['latency_ms_tf32'][first]['p50_ms']} ms TF32 "
                         f"({TIMING[o.device]})")

    def copies(self, step: Step) -> None:
        import torch

        o = self.options
        directory = self._artifact()
        path = model_file(directory, "model.pt")
        batch = model_inputs(manifest_inputs(directory), self.max_batch, o.device)

        def served(module: Any) -> Any:
            with torch.inference_mode():
                module(*batch)  # as a served copy: one request at its max batch size
            return module

        limit, limit_source = self._limit()
        empty_cache(o.device)
        result = fill_copies(lambda: served(torch.jit.load(str(path), map_location=o.device).eval()),
                             lambda first: served(deep_copy(first)), meter_for(o.device, lambda: [os.getpid()]),
                             limit=limit, limit_source=limit_source, threshold=o.threshold, max_copies=o.max_copies,
                             deadline=time.monotonic() + min(120.0, max(self.run.left(), 30.0)), device=o.device,
                             sync=lambda: synchronize(o.device))
        batch.clear()
        empty_cache(o.device)
        step.figures.update(asdict(result))
        step.headline = (f"In-process TorchScript copies of {o.model} in {limit_source} at {o.threshold:.0%}: "
                         f"{result.copies_loaded} loaded (stopped by {result.stopped_by}), {result.predicted_copies} "
                         f"predicted from the first {result.probe_copies}; first copy {_mib(result.first_copy_mib)}, "
                         f"then {result.per_copy_mib:,.1f} MiB each ({result.counted.split(':')[0]})")

    def tensorrt(self, step: Step) -> None:
        o = self.options
        inputs = manifest_inputs(self._artifact())
        directory = package_in_child(o.model, "tensorrt", self.work, self.max_batch, ("--precision", o.precision),
                            timeout_s=self._child_timeout())
        details = Manifest.load(directory).details
        step.figures.update({"precision": o.precision, "engine_precision": details.engine_precision,
                             "layer_precisions": details.layer_precisions,
                             "compute_capability": details.compute_capability, "timing": TIMING["cuda"]})
        runner = tensorrt_runner(model_file(directory, "model.plan"), inputs)
        step.figures["latency_ms"] = {b: asdict(v) for b, v in latency(runner, list(o.batches), o.warmup, o.iters).items()}
        first = str(o.batches[0])
        step.headline = (f"TensorRT {o.model} ({o.precision}) batch {first} p50: "
                         f"{step.figures['latency_ms'][first]['p50_ms']} ms (engine: {details.engine_precision})")

    def encoder(self, step: Step) -> None:
        import torch

        o = self.options
        directory = package_in_child(o.encoder, "torchscript", self.work, self.max_batch, ("--seq-len", str(o.seq_len)),
                            timeout_s=self._child_timeout())
        inputs = manifest_inputs(directory)
        path = model_file(directory, "model.pt")
        cpu = torch.jit.load(str(path), map_location="cpu").eval()
        gpu_module, run_once = torchscript_runner(path, inputs, o.device)
        sample = model_inputs(inputs, 2, "cpu")
        with fp32_math(False), torch.inference_mode():
            want = cpu(*sample)
            got = gpu_module(*[t.to(o.device) for t in sample])
            figures = latency(run_once, list(o.batches), o.warmup, o.iters, o.device)
        want = want if isinstance(want, (tuple, list)) else (want,)
        got = got if isinstance(got, (tuple, list)) else (got,)
        diff = max(float(np.max(np.abs(g.float().cpu().numpy() - w.float().numpy()))) for g, w in zip(got, want))
        step.figures.update({"model": o.encoder, "seq_len": o.seq_len, "traced_on": "cpu", "ran_on": o.device,
                             "inputs": "token ids 1000-1999, attention mask all ones", "math": "fp32 (TF32 off)",
                             "max_abs_diff_vs_cpu": diff, "timing": TIMING[o.device],
                             "latency_ms": {b: asdict(v) for b, v in figures.items()}})
        if not diff < 1e-3:
            raise RuntimeError(f"the encoder's {o.device} outputs differ from its CPU outputs by {diff:.3g}")
        first = str(o.batches[0])
        step.headline = (f"{o.encoder} (seq {o.seq_len}) on {o.device} vs CPU: max abs diff {diff:.2g}; batch {first} "
                         f"p50 {figures[first].p50_ms} ms")


def run_checks(options: GpuCheckOptions) -> int:
    """Preflight, then the steps; facts.json, gpu_check.json and gpu_check.md (and ``mme
    capacity``'s report) in ``options.out``, the report rewritten after every step; the exit code."""
    out = ensure_writable_dir(options.out)
    facts = detect()
    preflight = preflight_lines(facts)
    print("==> preflight: what this host has", flush=True)
    for line in preflight:
        print(f"    {line}", flush=True)
    write_facts(facts, out)
    device = options.device
    report = GpuCheckReport(facts=facts, preflight=preflight, device=device, model=options.model,
                            batches=list(options.batches), threshold=options.threshold, seconds=0.0, steps=[])
    if device == "cuda" and not facts.torch_cuda:
        report.complete, report.exit_code = True, EXIT_NO_GPU
        report.steps.append(Step("no GPU", "not measured", 0.0, facts.no_gpu_reason,
                                 headline=f"NO GPU: nothing measured ({facts.no_gpu_reason})"))
        write_report(report, out)
        print(f"gpu-check: no usable NVIDIA GPU ({facts.no_gpu_reason}); nothing was measured")
        return EXIT_NO_GPU

    def save() -> None:
        report.seconds = round(time.monotonic() - checks.started, 1)
        write_report(report, out)

    checks = Run(options.budget_s, after_step=save)
    report.steps = checks.steps
    save()
    work = Path(tempfile.mkdtemp(prefix="mme-gpu-check-"))
    try:
        _steps(GpuCheck(options, work, checks), checks, facts, device)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    code = exit_code([s.status for s in checks.steps], device, options.allow_no_gpu)
    report.complete, report.exit_code = True, code
    save()
    print(markdown(report))
    print(f"written {out}/gpu_check.json, {out}/gpu_check.md, {out}/facts.json")
    if code == EXIT_NO_GPU:
        print("gpu-check: no GPU: this was a CPU dry run of every step's code, no figure is a GPU's "
              "(--allow-no-gpu exits 0 from it)")
    return code


def exit_code(statuses: list[str], device: str, allow_no_gpu: bool) -> int:
    """1 when a step failed; for a run without a GPU (the CPU dry run) 4, or 0 with
    ``allow_no_gpu``; on the GPU 3 when a figure was not measured, else 0."""
    if "failed" in statuses:
        return EXIT_FAILED
    if device != "cuda":
        return 0 if allow_no_gpu else EXIT_NO_GPU
    return EXIT_PARTIAL if "not measured" in statuses else 0


def _steps(check: GpuCheck, checks: Run, facts: Any, device: str) -> None:
    o = check.options
    first = checks.step(f"1. package {o.model} (TorchScript)", 30, check.torchscript_package)
    needs_1 = "" if first.status == "ran" else "needs step 1's artifact"
    no_nvml = "NVML is unavailable (nvidia-ml-py): GPU memory cannot be read" \
        if device == "cuda" and facts.nvml_gpus in (-1, 0) else ""
    no_triton = "" if facts.pytriton else "the nvidia-pytriton wheel is not installed (gpu_check.sh --wheels carries it)"
    no_stub = facts.libpython
    checks.step("2. Triton (nvidia-pytriton) python-backend copies: mme capacity's GPU path", 60, check.triton,
                not_measured=needs_1 or no_triton or no_stub or no_nvml)
    checks.step("3. TorchScript latency, TF32 off and on", 30, check.torchscript_latency, not_measured=needs_1)
    checks.step("4. TorchScript copies in this process until the threshold", 30, check.copies,
                not_measured=needs_1 or no_nvml)
    if device != "cuda":
        checks.step("5. TensorRT", 120, check.tensorrt, skip="TensorRT needs the GPU (--device cpu)")
    else:
        no_trt = f"no TensorRT on this host: {facts.tensorrt_reason}" if facts.tensorrt_reason or not facts.tensorrt else ""
        trt = checks.step("5. TensorRT", 120, check.tensorrt, not_measured=needs_1 or no_trt)
        if trt.status == "not measured":
            trt.headline = f"TensorRT: NOT MEASURED ({trt.note.split(':')[0]})"
    checks.step("6. Hugging Face encoder traced on the CPU, run on the device", 60, check.encoder)
