"""GPU check helper (run by tests/gpu/gpu_check.sh; not a pytest module).

    python tests/gpu/gpu_check.py detect            what this host has, as shell assignments
    python tests/gpu/gpu_check.py compare [opts]    TorchScript vs TensorRT for one model:
        latency at each batch size, GPU memory per loaded copy (NVML), copies that fit

``compare`` packages the model with ``mme package`` (random weights; the same code path
users run), then loads the artifacts in this process. Whatever cannot run on this host
(no TensorRT, no NVML, no ONNX Runtime CUDA provider) is skipped and said so. Exit codes:
0 ran, 1 something failed, 4 no usable GPU.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import importlib.util
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

EXIT_NO_GPU = 4
MIB = 1 << 20


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# --------------------------------------------------------------------------- detect
def detect() -> dict[str, object]:
    """What this host offers, without failing on anything missing."""
    facts: dict[str, object] = {
        "torch": _version("torch"),
        "torch_cuda": False,
        "gpu_count": 0,
        "gpu_name": "",
        "nvml_gpus": -1,  # -1: NVML unavailable (nvidia-ml-py missing or no driver)
        "nvidia_smi": shutil.which("nvidia-smi") is not None,
        "tensorrt": "",
        "torch_tensorrt": "",
        "onnxruntime_cuda": False,
        "pytest": _importable("pytest"),
        "docker": "",
        "no_gpu_reason": "",
    }
    try:
        from serving.memory import gpu_device_count

        count = gpu_device_count()
        facts["nvml_gpus"] = -1 if count is None else count
    except Exception:  # noqa: BLE001 - detection must not fail
        pass
    if facts["torch"]:
        try:
            import torch

            facts["torch_cuda"] = bool(torch.cuda.is_available())
            if facts["torch_cuda"]:
                facts["gpu_count"] = torch.cuda.device_count()
                facts["gpu_name"] = torch.cuda.get_device_name(0)
            elif facts["nvml_gpus"] and int(facts["nvml_gpus"]) > 0:
                facts["no_gpu_reason"] = (
                    f"the driver sees {facts['nvml_gpus']} GPU(s) but PyTorch cannot use them "
                    f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}; a CPU-only torch or a driver too old?)"
                )
            else:
                nvml = "NVML is unavailable" if facts["nvml_gpus"] == -1 else "NVML reports no GPU"
                facts["no_gpu_reason"] = f"PyTorch sees no CUDA device and {nvml}"
        except Exception as exc:  # noqa: BLE001
            facts["no_gpu_reason"] = f"importing torch failed: {str(exc).splitlines()[0]}"
    else:
        facts["no_gpu_reason"] = "PyTorch is not installed in this Python"
    if _importable("tensorrt"):
        facts["tensorrt"] = _version("tensorrt") or _version("tensorrt-cu13") or _version("tensorrt-cu12") or "unknown"
    if _importable("torch_tensorrt"):
        facts["torch_tensorrt"] = _version("torch-tensorrt") or "unknown"
    if _importable("onnxruntime"):
        try:
            import onnxruntime

            facts["onnxruntime_cuda"] = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
        except Exception:  # noqa: BLE001
            pass
    try:
        from serving.triton.docker import docker_engine_problem

        facts["docker"] = docker_engine_problem(timeout_s=10.0) or "ok"
    except Exception as exc:  # noqa: BLE001
        facts["docker"] = f"unknown ({str(exc).splitlines()[0]})"
    return facts


def print_shell(facts: dict[str, object]) -> None:
    for key, value in facts.items():
        if isinstance(value, bool):
            value = int(value)
        elif value is None:
            value = ""
        print(f"{key.upper()}={shlex.quote(str(value))}")


# --------------------------------------------------------------------------- memory
@dataclass
class MemoryProbe:
    """GPU memory in use: this process's (NVML) where the driver tells, else the whole
    device's (NVML), else the device's from cudaMemGetInfo."""

    index: int
    method: str = ""

    def read(self) -> tuple[int, int]:
        """(used bytes, total bytes)."""
        import torch

        torch.cuda.synchronize()
        try:
            from serving.memory import gpu_memory

            reading = gpu_memory(self.index)
        except Exception:  # noqa: BLE001
            reading = None
        if reading is not None:
            mine = [p.used_bytes for p in reading.processes if p.pid == os.getpid() and p.used_bytes is not None]
            if mine:
                self.method = "NVML, this process"
                return mine[0], reading.total_bytes
            self.method = "NVML, whole device (per-process figures unavailable here)"
            return reading.used_bytes, reading.total_bytes
        free, total = torch.cuda.mem_get_info()
        self.method = "cudaMemGetInfo, whole device (NVML unavailable: pip install nvidia-ml-py)"
        return total - free, total


def nvml_index() -> int:
    """The NVML index of torch's device 0 (CUDA_VISIBLE_DEVICES given as indices), else 0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


# --------------------------------------------------------------------------- loaded copies
class Loaded:
    """One loaded copy of a model that runs one batch on preallocated GPU inputs."""

    def infer(self, batch: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class TorchScriptCopy(Loaded):
    def __init__(self, path: Path, input_shape: tuple[int, ...]):
        import warnings

        import torch

        # Triton's libtorch backend still loads TorchScript: torch's deprecation notice is noise here.
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)

        self.torch = torch
        self.module = torch.jit.load(str(path), map_location="cuda").eval()
        self.input_shape = input_shape
        self.inputs: dict[int, object] = {}

    def infer(self, batch: int) -> None:
        torch = self.torch
        if batch not in self.inputs:
            self.inputs[batch] = torch.randn((batch, *self.input_shape), device="cuda")
        with torch.inference_mode():
            self.module(self.inputs[batch])

    def close(self) -> None:
        self.module = None
        self.inputs.clear()


class TensorRTCopy(Loaded):
    def __init__(self, path: Path, input_name: str, output_names: list[str], input_shape: tuple[int, ...]):
        import tensorrt as trt
        import torch

        self.trt, self.torch = trt, torch
        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = self.runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise RuntimeError(f"TensorRT could not deserialize {path} (built with another TensorRT or GPU?)")
        self.context = self.engine.create_execution_context()
        self.input_name, self.output_names, self.input_shape = input_name, output_names, input_shape
        self.buffers: dict[int, list] = {}

    def _dtype(self, name: str):
        dt, torch = self.trt.DataType, self.torch
        table = {dt.FLOAT: torch.float32, dt.HALF: torch.float16, dt.INT32: torch.int32, dt.INT8: torch.int8}
        for attr, tdtype in (("INT64", torch.int64), ("BOOL", torch.bool), ("BF16", torch.bfloat16)):
            if hasattr(dt, attr):
                table[getattr(dt, attr)] = tdtype
        return table[self.engine.get_tensor_dtype(name)]

    def _bind(self, batch: int) -> None:
        torch = self.torch
        if batch not in self.buffers:
            x = torch.randn((batch, *self.input_shape), device="cuda").to(self._dtype(self.input_name))
            self.context.set_input_shape(self.input_name, tuple(x.shape))
            outs = [torch.empty(tuple(self.context.get_tensor_shape(n)), dtype=self._dtype(n), device="cuda")
                    for n in self.output_names]
            self.buffers[batch] = [x, *outs]
        x, *outs = self.buffers[batch]
        self.context.set_input_shape(self.input_name, tuple(x.shape))
        self.context.set_tensor_address(self.input_name, x.data_ptr())
        for name, out in zip(self.output_names, outs):
            self.context.set_tensor_address(name, out.data_ptr())

    def infer(self, batch: int) -> None:
        self._bind(batch)
        stream = self.torch.cuda.current_stream()
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execution failed")

    def close(self) -> None:
        self.buffers.clear()
        self.context = None
        self.engine = None


class OnnxRuntimeCopy(Loaded):
    def __init__(self, path: Path, input_name: str, input_shape: tuple[int, ...]):
        import numpy as np
        import onnxruntime

        self.np = np
        self.session = onnxruntime.InferenceSession(str(path), providers=["CUDAExecutionProvider"])
        self.input_name, self.input_shape = input_name, input_shape
        self.inputs: dict[int, object] = {}

    def infer(self, batch: int) -> None:
        if batch not in self.inputs:
            self.inputs[batch] = self.np.random.default_rng(0).standard_normal((batch, *self.input_shape), dtype=self.np.float32)
        self.session.run(None, {self.input_name: self.inputs[batch]})

    def close(self) -> None:
        self.session = None


# --------------------------------------------------------------------------- measurements
@dataclass
class Candidate:
    label: str
    load: Callable[[], Loaded]
    note: str = ""


@dataclass
class Result:
    label: str
    note: str = ""
    latency_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # batch -> p50/p90/mean/items_per_s
    first_copy_mib: float | None = None
    further_copy_mib: float | None = None
    copies_measured: int = 0
    copies_that_fit: int | None = None
    memory_method: str = ""
    error: str = ""


def time_batches(loaded: Loaded, batches: list[int], warmup: int, iters: int) -> dict[str, dict[str, float]]:
    import torch

    out: dict[str, dict[str, float]] = {}
    for batch in batches:
        for _ in range(warmup):
            loaded.infer(batch)
        torch.cuda.synchronize()
        samples = []
        for _ in range(iters):
            start = time.perf_counter()
            loaded.infer(batch)
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - start) * 1000.0)
        samples.sort()
        mean = statistics.fmean(samples)
        out[str(batch)] = {
            "p50_ms": round(samples[len(samples) // 2], 3),
            "p90_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.9))], 3),
            "mean_ms": round(mean, 3),
            "items_per_s": round(batch / (mean / 1000.0), 1),
        }
    return out


def measure_copies(candidate: Candidate, probe: MemoryProbe, copies: int, max_batch: int,
                   threshold: float) -> tuple[float, float | None, int | None, int]:
    """Load ``copies`` copies one by one (each runs one max-batch inference, as a served
    copy would); memory after each. Returns first-copy MiB, mean further-copy MiB, copies
    that fit under ``threshold`` of the GPU, and the copies actually loaded."""
    import torch

    gc.collect()
    torch.cuda.empty_cache()
    base_used, total = probe.read()
    device_used_at_base = torch.cuda.mem_get_info()
    device_used_at_base = device_used_at_base[1] - device_used_at_base[0]
    loaded: list[Loaded] = []
    readings = [base_used]
    try:
        for _ in range(copies):
            copy = candidate.load()
            loaded.append(copy)
            copy.infer(max_batch)
            readings.append(probe.read()[0])
    finally:
        for copy in loaded:
            copy.close()
        loaded.clear()
        gc.collect()
        torch.cuda.empty_cache()
    deltas = [b - a for a, b in zip(readings, readings[1:])]
    first = deltas[0]
    further = statistics.fmean(deltas[1:]) if len(deltas) > 1 else None
    budget = threshold * total - device_used_at_base
    fit = None
    if first > 0:
        if budget < first:
            fit = 0
        elif further and further > 0:
            fit = 1 + int((budget - first) // further)
    return first / MIB, (further / MIB if further is not None else None), fit, len(deltas)


def input_dims(manifest: dict) -> tuple[int, ...]:
    """The one input's shape without the batch axis; this check times single-input,
    fixed-shape models (image classifiers such as resnet50)."""
    inputs = manifest["inputs"]
    dims = tuple(int(d) for d in inputs[0]["dims"])
    if len(inputs) != 1 or any(d <= 0 for d in dims) or any(a is not None for a in inputs[0].get("axes", [])):
        raise SystemExit(f"gpu-check: {manifest['requested_name']} has inputs this check cannot feed "
                         "(it times single-input image models such as resnet50)")
    return dims


def package(model: str, formats: str, out: Path, max_batch: int, precision: str, atol: float | None) -> tuple[int, str]:
    """``mme package`` in a child process (its own CUDA context: memory figures stay clean)."""
    argv = [sys.executable, "-m", "mme", "-q", "package", model, "--no-pretrained", "--formats", formats,
            "--out", str(out), "--max-batch-size", str(max_batch), "--precision", precision]
    if atol is not None:
        argv += ["--atol", str(atol)]
    print("    $ " + " ".join(shlex.quote(a) for a in argv[1:]), flush=True)
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    tail = (done.stderr or done.stdout).strip().splitlines()
    return done.returncode, (tail[-1] if tail else "")


def compare(args: argparse.Namespace) -> int:
    facts = detect()
    if not facts["torch_cuda"]:
        print(f"gpu-check: no usable NVIDIA GPU ({facts['no_gpu_reason']}); nothing to compare")
        return EXIT_NO_GPU
    import torch

    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    max_batch = max(batches)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="mme-gpu-check-"))
    skipped: list[str] = []
    failed: list[str] = []
    candidates: list[Candidate] = []

    print(f"==> packaging {args.model} (random weights) into {work}", flush=True)
    code, last = package(args.model, "torchscript", work, max_batch, "fp32", None)
    if code != 0:
        failed.append(f"torchscript packaging (exit {code}): {last}")
    else:
        manifest = json.loads((work / args.model / "torchscript" / "manifest.json").read_text())
        shape = input_dims(manifest)
        ts_path = work / args.model / "torchscript" / manifest["model"] / "1" / "model.pt"
        candidates.append(Candidate("torchscript fp32", lambda p=ts_path, s=shape: TorchScriptCopy(p, s)))

    if facts["tensorrt"]:
        code, last = package(args.model, "tensorrt", work, max_batch, args.precision, args.atol)
        if code != 0:
            failed.append(f"tensorrt packaging (exit {code}): {last}")
        else:
            manifest = json.loads((work / args.model / "tensorrt" / "manifest.json").read_text())
            plan = work / args.model / "tensorrt" / manifest["model"] / "1" / "model.plan"
            inp = manifest["inputs"][0]
            outs = [o["name"] for o in manifest["outputs"]]
            shape = input_dims(manifest)
            candidates.append(Candidate(f"tensorrt {args.precision}",
                                        lambda p=plan, n=inp["name"], o=outs, s=shape: TensorRTCopy(p, n, o, s),
                                        note=f"TensorRT {facts['tensorrt']}"))
    else:
        skipped.append("tensorrt: the tensorrt package is not importable here (pip install -e '.[gpu]', or make docker-package)")

    if facts["onnxruntime_cuda"]:
        code, last = package(args.model, "onnx", work, max_batch, "fp32", None)
        if code != 0:
            failed.append(f"onnx packaging (exit {code}): {last}")
        else:
            manifest = json.loads((work / args.model / "onnx" / "manifest.json").read_text())
            onnx_path = work / args.model / "onnx" / manifest["model"] / "1" / "model.onnx"
            inp = manifest["inputs"][0]
            candidates.append(Candidate("onnxruntime-cuda fp32",
                                        lambda p=onnx_path, n=inp["name"], s=input_dims(manifest): OnnxRuntimeCopy(p, n, s),
                                        note="host<->device copies included"))
    else:
        skipped.append("onnxruntime-cuda: this onnxruntime has no CUDAExecutionProvider (the CPU wheel)")

    probe = MemoryProbe(nvml_index())
    results: list[Result] = []
    for cand in candidates:
        result = Result(cand.label, cand.note)
        print(f"==> {cand.label}: latency at batch {args.batches}, then {args.copies} copies for memory", flush=True)
        try:
            one = cand.load()
            try:
                result.latency_ms = time_batches(one, batches, args.warmup, args.iters)
            finally:
                one.close()
                del one
            first, further, fit, n = measure_copies(cand, probe, args.copies, max_batch, args.threshold)
            result.first_copy_mib = round(first, 1)
            result.further_copy_mib = None if further is None else round(further, 1)
            result.copies_that_fit, result.copies_measured = fit, n
            result.memory_method = probe.method
        except Exception as exc:  # noqa: BLE001 - report and go on with the next format
            result.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            failed.append(f"{cand.label}: {result.error}")
        results.append(result)

    _, total = probe.read()
    report = {
        "model": args.model,
        "gpu": facts["gpu_name"],
        "gpu_memory_gib": round(total / (1 << 30), 1),
        "threshold": args.threshold,
        "torch": facts["torch"],
        "tensorrt": facts["tensorrt"] or None,
        "batches": batches,
        "results": [asdict(r) for r in results],
        "skipped": skipped,
        "failed": failed,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    print_report(report)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2))
        print(f"written {out}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


def print_report(report: dict) -> None:
    print()
    print(f"{report['model']} on {report['gpu']} ({report['gpu_memory_gib']} GiB), torch {report['torch']}, "
          f"TensorRT {report['tensorrt'] or 'absent'}")
    print(f"{'format':<24}{'batch':>6}{'p50 ms':>10}{'p90 ms':>10}{'items/s':>10}")
    for r in report["results"]:
        for batch, lat in r["latency_ms"].items():
            print(f"{r['label']:<24}{batch:>6}{lat['p50_ms']:>10.2f}{lat['p90_ms']:>10.2f}{lat['items_per_s']:>10.1f}")
    print()
    print(f"{'format':<24}{'1st copy MiB':>14}{'next copies MiB':>17}{'copies fit':>12}  (under {report['threshold']:.0%} of the GPU)")
    for r in report["results"]:
        if r["error"]:
            print(f"{r['label']:<24}  FAILED: {r['error']}")
            continue
        further = "-" if r["further_copy_mib"] is None else f"{r['further_copy_mib']:.1f}"
        fit = "-" if r["copies_that_fit"] is None else str(r["copies_that_fit"])
        print(f"{r['label']:<24}{r['first_copy_mib']:>14.1f}{further:>17}{fit:>12}")
    methods = sorted({r["memory_method"] for r in report["results"] if r["memory_method"]})
    if methods:
        print(f"memory measured with: {'; '.join(methods)}")
    by_label = {r["label"]: r for r in report["results"] if not r["error"]}
    ts = by_label.get("torchscript fp32")
    trt = next((r for label, r in by_label.items() if label.startswith("tensorrt")), None)
    if ts and trt:
        for batch in map(str, report["batches"]):
            if batch in ts["latency_ms"] and batch in trt["latency_ms"]:
                a, b = ts["latency_ms"][batch]["p50_ms"], trt["latency_ms"][batch]["p50_ms"]
                print(f"TensorRT vs TorchScript at batch {batch}: p50 latency {100.0 * (b - a) / a:+.0f}%")
        if ts["copies_that_fit"] and trt["copies_that_fit"] is not None:
            print(f"copies that fit: TorchScript {ts['copies_that_fit']}, TensorRT {trt['copies_that_fit']}")
    for line in report["skipped"]:
        print(f"SKIPPED {line}")
    for line in report["failed"]:
        print(f"FAILED {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("detect", help="print what this host has (shell assignments, or --json)")
    d.add_argument("--json", action="store_true")
    c = sub.add_parser("compare", help="TorchScript vs TensorRT: latency, memory per copy, copies that fit")
    c.add_argument("--model", default="resnet50")
    c.add_argument("--batches", default="1,16", help="batch sizes, comma separated (default: 1,16)")
    c.add_argument("--precision", choices=("fp16", "fp32"), default="fp16", help="TensorRT precision (default: fp16)")
    c.add_argument("--atol", type=float, default=0.1,
                   help="validation tolerance when packaging TensorRT (default 0.1: this check measures speed and "
                        "memory; the gpu-marked tests check accuracy)")
    c.add_argument("--copies", type=int, default=4, help="copies loaded to measure memory per copy (default: 4)")
    c.add_argument("--iters", type=int, default=50)
    c.add_argument("--warmup", type=int, default=10)
    c.add_argument("--threshold", type=float, default=0.9, help="share of GPU memory copies may fill (default: 0.9)")
    c.add_argument("--work", help="where to package (default: a temporary directory, removed after)")
    c.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.command == "detect":
        facts = detect()
        if args.json:
            print(json.dumps(facts, indent=2))
        else:
            print_shell(facts)
        return 0
    if args.copies < 2:
        parser.error("--copies must be 2 or more (the first copy also holds shared buffers)")
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
