"""The GPU check's measurement steps, each timed, each skipped with its reason when the host
lacks what it needs, the whole run held to a time budget:

1. ``mme package MODEL --formats torchscript`` (random weights, the users' code path), then
   TorchScript latency on CUDA at each batch size;
2. copies of it loaded on the GPU one by one, memory read after each with the project's
   NVML meter, and the copies that fit under the threshold predicted as ``mme capacity``
   predicts them;
3. TensorRT, where installed: the same for a plan of ``--precision``;
4. a Hugging Face encoder traced to TorchScript on the CPU, run on CUDA and compared with
   the CPU run;
5. where the nvidia-pytriton wheel is importable: its tritonserver serving GPU copies of the
   TorchScript model, one copy invoked and compared with PyTorch, and ``mme capacity``'s GPU
   path (NVML) against it.

A failing step is recorded and the run goes on; :func:`run_checks` returns 0 when nothing
failed, 1 when something did, 4 when there is no usable GPU for ``device="cuda"``.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from bench.gpu_check import EXIT_NO_GPU
from bench.gpu_check.report import STEP_MARKS, GpuCheckReport, Step

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
    precision: str = "fp16"  # the TensorRT step's
    copies: int = 6  # loaded in-process for memory per copy; 2 or more
    iters: int = 50
    warmup: int = 10
    threshold: float = 0.9  # share of the memory copies may fill
    triton_headroom_gib: float = 4.0  # step 5 fills the GPU memory in use now plus this much
    triton_max_copies: int = 10
    budget_s: float = 420.0  # no step starts past this
    device: str = "cuda"  # "cpu": a dry run of every step's code


class Run:
    """Steps in order, each timed and held to what is left of the budget."""

    def __init__(self, budget_s: float) -> None:
        self.started = time.monotonic()
        self.budget_s = budget_s
        self.steps: list[Step] = []

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def step(self, name: str, needs_s: float, body: Callable[[Step], None], skip: str = "") -> Step:
        step = Step(name)
        self.steps.append(step)
        if skip:
            step.note = skip
        elif self.left() < needs_s:
            step.note = f"not started: {self.left():.0f} s of the budget left, it needs about {needs_s:.0f} s"
        else:
            print(f"==> {name}", flush=True)
            start = time.monotonic()
            try:
                body(step)
                step.status = "ran" if step.status == "skipped" else step.status
            except Exception as exc:  # noqa: BLE001 - the check records the failure and goes on
                step.status = "failed"
                step.note = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
            step.seconds = round(time.monotonic() - start, 1)
        print(f"    {STEP_MARKS[step.status]} {name}{': ' + step.note if step.note else ''}", flush=True)
        return step


def package(model: str, formats: str, out: Path, max_batch: int, extra: tuple[str, ...] = ()) -> Path:
    """``mme package`` in a child process (its own CUDA context: memory figures stay clean)."""
    from mme.process import child_env
    from packager.model import triton_model_name

    argv = [sys.executable, "-m", "mme", "-q", "package", model, "--no-pretrained", "--formats", formats,
            "--out", str(out), "--max-batch-size", str(max_batch), *extra]
    print("    $ " + " ".join(shlex.quote(a) for a in argv[1:]), flush=True)
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=child_env())
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(f"mme package {model} --formats {formats} exited {done.returncode}: {tail[-1] if tail else ''}")
    return out / triton_model_name(model) / formats


def _latency_figures(figures: dict) -> dict[str, dict]:
    return {batch: asdict(value) for batch, value in figures.items()}


class GpuCheck:
    """The five steps' bodies; step 1's artifact is what steps 2, 3 and 5 use."""

    def __init__(self, options: GpuCheckOptions, work: Path) -> None:
        from bench.gpu_check.runners import ModelInputs

        self.options = options
        self.work = work
        self.max_batch = max(options.batches)
        self.torchscript_dir: Path | None = None
        self.inputs: ModelInputs | None = None

    def _artifact(self):
        if self.torchscript_dir is None or self.inputs is None:
            raise RuntimeError("step 1 did not package the TorchScript model")
        return self.torchscript_dir, self.inputs

    def torchscript(self, step: Step) -> None:
        from bench.gpu_check.runners import latency, manifest_inputs, model_file, torchscript_runner

        o = self.options
        directory = package(o.model, "torchscript", self.work, self.max_batch)
        self.torchscript_dir, self.inputs = directory, manifest_inputs(directory)
        _module, run_once = torchscript_runner(model_file(directory, "model.pt"), self.inputs, o.device)
        step.figures["latency_ms"] = _latency_figures(latency(run_once, list(o.batches), o.warmup, o.iters, o.device))

    def copies(self, step: Step) -> None:
        from bench.gpu_check.copies import measure_copies
        from bench.gpu_check.runners import copy_loader, model_file

        o = self.options
        directory, inputs = self._artifact()
        load = copy_loader(model_file(directory, "model.pt"), inputs, self.max_batch, o.device)
        step.figures.update(asdict(measure_copies(load, o.copies, o.threshold, o.device)))

    def tensorrt(self, step: Step) -> None:
        from bench.gpu_check.runners import latency, model_file, tensorrt_runner
        from packager.manifest import Manifest

        o = self.options
        _, inputs = self._artifact()
        directory = package(o.model, "tensorrt", self.work, self.max_batch, ("--precision", o.precision))
        details = Manifest.load(directory).details
        step.figures.update({"engine_precision": details.engine_precision, "layer_precisions": details.layer_precisions,
                             "compute_capability": details.compute_capability})
        runner = tensorrt_runner(model_file(directory, "model.plan"), inputs)
        step.figures["latency_ms"] = _latency_figures(latency(runner, list(o.batches), o.warmup, o.iters))

    def encoder(self, step: Step) -> None:
        import numpy as np
        import torch

        from bench.gpu_check.runners import latency, manifest_inputs, model_file, random_inputs, torchscript_runner

        o = self.options
        directory = package(o.encoder, "torchscript", self.work, self.max_batch, ("--seq-len", str(o.seq_len)))
        inputs = manifest_inputs(directory)
        path = model_file(directory, "model.pt")
        cpu = torch.jit.load(str(path), map_location="cpu").eval()
        gpu_module, run_once = torchscript_runner(path, inputs, o.device)
        ids = random_inputs(inputs, 2, "cpu")
        with torch.inference_mode():
            want = cpu(*ids)
            got = gpu_module(*[t.to(o.device) for t in ids])
        want = want if isinstance(want, (tuple, list)) else (want,)
        got = got if isinstance(got, (tuple, list)) else (got,)
        diff = max(float(np.max(np.abs(g.float().cpu().numpy() - w.float().numpy()))) for g, w in zip(got, want))
        step.figures.update({"model": o.encoder, "seq_len": o.seq_len, "traced_on": "cpu", "ran_on": o.device,
                             "max_abs_diff_vs_cpu": diff,
                             "latency_ms": _latency_figures(latency(run_once, list(o.batches), o.warmup, o.iters,
                                                                    o.device))})
        if not diff < 1e-2:
            raise RuntimeError(f"the encoder's CUDA outputs differ from its CPU outputs by {diff:.3g}")

    def triton(self, step: Step) -> None:
        from bench.gpu_check.copies import meter_for
        from bench.gpu_check.triton import gpu_python_model, triton_serves_a_gpu_copy
        from serving.capacity import measure_capacity, write_report

        o = self.options
        directory, _ = self._artifact()
        artifact = gpu_python_model(directory, self.work, o.device)
        step.figures["one_copy"] = asdict(triton_serves_a_gpu_copy(artifact, directory, o.device))
        if o.device == "cuda":  # the GPU in use now plus the headroom: the run ends in time
            limit = meter_for(o.device, list).used() + int(o.triton_headroom_gib * GIB)
        else:  # host RSS of the server's processes starts near zero
            limit = int(o.triton_headroom_gib * GIB)
        report = measure_capacity(artifact, threshold=o.threshold, limit_bytes=limit, probe_copies=3, verify=True,
                                  max_copies=o.triton_max_copies, server_kind="local",
                                  memory="gpu" if o.device == "cuda" else "host")
        path = write_report(report, o.out)
        step.figures.update({
            "memory_kind": report.memory_kind, "limit_mib": round(report.limit_bytes / MIB),
            "baseline_mib": round(report.baseline_bytes / MIB), "per_copy_mib": round(report.footprint_mean_bytes / MIB),
            "predicted_copies": report.predicted_copies, "actual_copies": report.actual_copies,
            "load_seconds": [s.load_seconds for s in report.steps], "report": path.name,
            "projections": {p.instance_type: p.copies for p in report.projections},
        })


def run_checks(options: GpuCheckOptions) -> int:
    """Detect, measure, write facts.json, gpu_check.json and gpu_check.md (and ``mme
    capacity``'s report) into ``options.out``; the exit code (0, 1 or 4)."""
    from bench.gpu_check.detect import detect
    from bench.gpu_check.report import markdown, write_facts, write_report
    from mme.fsutil import ensure_writable_dir

    facts = detect()
    out = ensure_writable_dir(options.out)
    write_facts(facts, out)
    device = options.device
    if device == "cuda" and not facts.torch_cuda:
        print(f"gpu-check: no usable NVIDIA GPU ({facts.no_gpu_reason}); nothing was measured")
        return EXIT_NO_GPU
    checks = Run(options.budget_s)
    work = Path(tempfile.mkdtemp(prefix="mme-gpu-check-"))
    try:
        check = GpuCheck(options, work)
        ts = checks.step("1. TorchScript latency", 60, check.torchscript)
        needs_ts = "" if ts.status == "ran" else "needs step 1"
        no_nvml = device == "cuda" and facts.nvml_gpus in (-1, 0)
        checks.step("2. GPU memory per copy (NVML) and copies that fit", 30, check.copies,
                    skip=needs_ts or ("NVML is unavailable (nvidia-ml-py)" if no_nvml else ""))
        no_trt = "TensorRT needs the GPU (--device cpu)" if device != "cuda" else facts.tensorrt_reason
        checks.step("3. TensorRT", 120, check.tensorrt,
                    skip=needs_ts or (no_trt if not facts.tensorrt or device != "cuda" else ""))
        checks.step("4. Hugging Face encoder traced on CPU, run on CUDA", 60, check.encoder)
        triton_skip = needs_ts or ("" if facts.pytriton else
                                   "the nvidia-pytriton wheel is not installed (gpu_check.sh --download-wheels carries it)")
        checks.step("5. Triton (nvidia-pytriton) serving GPU copies: mme capacity's GPU path", 150, check.triton,
                    skip=triton_skip)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = GpuCheckReport(facts=facts, device=device, model=options.model, batches=list(options.batches),
                            threshold=options.threshold, seconds=round(time.monotonic() - checks.started, 1),
                            steps=checks.steps)
    write_report(report, out)
    print(markdown(report))
    print(f"written {out}/gpu_check.json, {out}/gpu_check.md, {out}/facts.json")
    return 1 if any(s.status == "failed" for s in checks.steps) else 0
