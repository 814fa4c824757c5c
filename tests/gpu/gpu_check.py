"""The GPU check's measurements (run by tests/gpu/gpu_check.sh; not a pytest module).

    python tests/gpu/gpu_check.py detect [--json]     what this host has (shell assignments)
    python tests/gpu/gpu_check.py run --out DIR       the measurements, written to DIR

It runs on a bare GPU host too: Python 3.12 with torch, timm, transformers, numpy, psutil,
protobuf, grpcio, requests and nvidia-ml-py preinstalled, no network, no TensorRT, no Docker;
the other needs travel as wheels (``gpu_check.sh --download-wheels``, about 60 MiB):
tritonclient, python-rapidjson, gevent, geventhttpclient, greenlet, zope.event,
zope.interface, brotli (``mme package``'s sample requests) and nvidia-pytriton (the Triton
server for step 5). Steps, each timed, each skipped with its reason when the host lacks
what it needs, the whole run held to ``--budget-s``:

1. ``mme package MODEL --formats torchscript`` (random weights, the users' code path), then
   TorchScript latency on CUDA at each ``--batches`` size (percentiles as ``mme report``
   computes them);
2. copies of it loaded on the GPU one by one, memory read after each with the project's
   NVML meter (serving.memory), and the copies that fit under ``--threshold`` predicted as
   ``mme capacity`` predicts them;
3. TensorRT, where installed: the same for a plan of ``--precision``;
4. a Hugging Face encoder traced to TorchScript on the CPU, run on CUDA and compared with
   the CPU run;
5. where the nvidia-pytriton wheel is importable: its tritonserver serving GPU copies of the
   TorchScript model (a python-backend model running it with PyTorch on CUDA), one copy
   invoked and compared with PyTorch, and ``mme capacity``'s GPU path (NVML) against it.

Writes at most four files into DIR: facts.json, gpu_check.json (every figure),
gpu_check.md, and ``mme capacity``'s JSON report. Exit codes: 0 ran (skips are not
failures), 1 something failed, 4 no usable GPU.
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
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

EXIT_NO_GPU = 4
MIB = 1 << 20
GIB = 1 << 30


def _version(*dists: str) -> str | None:
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# --------------------------------------------------------------------------- detect
def tensorrt_status() -> tuple[str, str]:
    """(version or "", why it is missing or differs from the release's, or "")."""
    from mme.versions import release, same_tensorrt

    wanted = release().tensorrt
    installed = _version("tensorrt", "tensorrt-cu13", "tensorrt-cu12")
    if installed is None:
        return "", (f"the tensorrt package is not installed: run make install-gpu (pip's --extra-index-url "
                    f"https://pypi.nvidia.com: PyPI alone has only a stub of tensorrt-cu13-libs {wanted} that downloads "
                    "from NVIDIA's index), or use the builder image (make docker-package)")
    try:
        import tensorrt  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - the reason is the output
        return "", f"tensorrt {installed} is installed but does not import ({str(exc).splitlines()[0]})"
    if wanted and not same_tensorrt(installed, wanted):
        return installed, (f"tensorrt {installed} is installed but release {release().name} serves plans of "
                           f"TensorRT {wanted}: plans built here would not load there")
    return installed, ""


def detect() -> dict[str, object]:
    """What this host offers, without failing on anything missing."""
    facts: dict[str, object] = {
        "python": "%d.%d.%d" % sys.version_info[:3],
        "torch": _version("torch"),
        "torch_cuda": False,
        "gpu_count": 0,
        "gpu_name": "",
        "compute_capability": "",
        "nvml_gpus": -1,  # -1: NVML unavailable (nvidia-ml-py missing or no driver)
        "nvidia_smi": shutil.which("nvidia-smi") is not None,
        "tensorrt": "",
        "tensorrt_reason": "",
        "torch_tensorrt": _version("torch-tensorrt") or "",
        "onnxruntime_cuda": False,
        "pytriton": _version("nvidia-pytriton") or "",
        "tritonclient": _version("tritonclient") or "",
        "pytest": _importable("pytest"),
        "project_tests": all(_importable(m) for m in ("pytest", "boto3", "locust", "aiohttp", "tritonclient")),
        "docker": "",
        "no_gpu_reason": "",
    }
    try:
        from serving.memory import gpu_compute_capability, gpu_device_count

        count = gpu_device_count()
        facts["nvml_gpus"] = -1 if count is None else count
        facts["compute_capability"] = gpu_compute_capability(0) or ""
    except Exception:  # noqa: BLE001 - detection must not fail
        pass
    if facts["torch"]:
        try:
            import torch

            facts["torch_cuda"] = bool(torch.cuda.is_available())
            if facts["torch_cuda"]:
                facts["gpu_count"] = torch.cuda.device_count()
                facts["gpu_name"] = torch.cuda.get_device_name(0)
                major, minor = torch.cuda.get_device_capability(0)
                facts["compute_capability"] = f"{major}.{minor}"
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
    try:
        facts["tensorrt"], facts["tensorrt_reason"] = tensorrt_status()
    except Exception as exc:  # noqa: BLE001
        facts["tensorrt_reason"] = f"could not check TensorRT: {exc}"
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


# --------------------------------------------------------------------------- the run
@dataclass
class Step:
    name: str
    status: str = "skipped"  # ran | skipped | failed
    seconds: float = 0.0
    note: str = ""
    figures: dict[str, Any] = field(default_factory=dict)


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
            except Exception as exc:  # noqa: BLE001 - the check reports and goes on
                step.status = "failed"
                step.note = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
            step.seconds = round(time.monotonic() - start, 1)
        mark = {"ran": "RAN    ", "skipped": "SKIPPED", "failed": "FAILED "}[step.status]
        print(f"    {mark} {name}{': ' + step.note if step.note else ''}", flush=True)
        return step


def package(model: str, formats: str, out: Path, max_batch: int, extra: list[str] = ()) -> Path:
    """``mme package`` in a child process (its own CUDA context: memory figures stay clean)."""
    argv = [sys.executable, "-m", "mme", "-q", "package", model, "--no-pretrained", "--formats", formats,
            "--out", str(out), "--max-batch-size", str(max_batch), *extra]
    print("    $ " + " ".join(shlex.quote(a) for a in argv[1:]), flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(f"mme package {model} --formats {formats} exited {done.returncode}: {tail[-1] if tail else ''}")
    from packager.model import triton_model_name

    return out / triton_model_name(model) / formats


def synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def latency(run_once: Callable[[int], None], batches: list[int], warmup: int, iters: int,
            device: str = "cuda") -> dict[str, dict]:
    from bench.analysis import percentile

    figures: dict[str, dict] = {}
    for batch in batches:
        for _ in range(warmup):
            run_once(batch)
        synchronize(device)
        samples = []
        for _ in range(iters):
            start = time.perf_counter()
            run_once(batch)
            synchronize(device)
            samples.append((time.perf_counter() - start) * 1000.0)
        mean = sum(samples) / len(samples)
        figures[str(batch)] = {"p50_ms": round(percentile(samples, 50), 3), "p90_ms": round(percentile(samples, 90), 3),
                               "p99_ms": round(percentile(samples, 99), 3), "items_per_s": round(batch / (mean / 1000), 1)}
    return figures


def torchscript_runner(path: Path, input_shapes: list[tuple[int, ...]], dtypes: list[str], device: str = "cuda"):
    import torch

    module = torch.jit.load(str(path), map_location=device).eval()
    cache: dict[int, list] = {}

    def inputs(batch: int) -> list:
        if batch not in cache:
            made = []
            for shape, dtype in zip(input_shapes, dtypes):
                if dtype == "float32":
                    made.append(torch.randn((batch, *shape), device=device))
                else:
                    made.append(torch.randint(1, 1000, (batch, *shape), device=device, dtype=torch.int64))
            cache[batch] = made
        return cache[batch]

    def run_once(batch: int):
        with torch.inference_mode():
            return module(*inputs(batch))

    return module, run_once


def manifest_inputs(directory: Path) -> tuple[list[tuple[int, ...]], list[str]]:
    """Input shapes (dynamic axes at their maximum) and dtypes from an artifact's manifest."""
    from packager.manifest import Manifest

    manifest = Manifest.load(directory)
    axes = manifest.details.axes_max
    shapes, dtypes = [], []
    for tensor in manifest.inputs:
        dims = [axes[a] if d == -1 else d for d, a in zip(tensor.dims, tensor.dim_axes)]
        shapes.append(tuple(int(d) for d in dims))
        dtypes.append({"FP32": "float32", "INT64": "int64", "INT32": "int64"}[tensor.datatype])
    return shapes, dtypes


def meter_for(device: str, pids: Callable[[], list[int]]):
    """The project's meter: NVML on the GPU; host RSS for the CPU dry run."""
    from serving.memory import GpuMemoryMeter, HostMemoryMeter

    return GpuMemoryMeter(nvml_index(), pids=pids) if device == "cuda" else HostMemoryMeter(pids)


def empty_cache(device: str) -> None:
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def measure_copies(load_copy: Callable[[], Callable[[], None]], copies: int, threshold: float,
                   device: str = "cuda") -> dict[str, Any]:
    """Load ``copies`` copies one by one (each runs one max-batch inference, as a served copy
    would), reading the GPU with the project's NVML meter after each; predict what fits."""
    from serving.capacity import predict

    meter = meter_for(device, lambda: [os.getpid()])
    empty_cache(device)
    synchronize(device)
    baseline = meter.used()
    readings, alive = [baseline], []
    try:
        for _ in range(copies):
            alive.append(load_copy())
            synchronize(device)
            readings.append(meter.used())
        process = meter.details().get("server_processes_bytes")
    finally:
        alive.clear()
        empty_cache(device)
    deltas = [b - a for a, b in zip(readings, readings[1:])]
    further = deltas[1:] or deltas
    per_copy = sum(further) / len(further)
    total = meter.total()
    return {
        "memory_method": meter.description, "gpu_total_mib": round(total / MIB), "baseline_mib": round(baseline / MIB),
        "first_copy_mib": round(deltas[0] / MIB, 1), "per_copy_mib": round(per_copy / MIB, 1),
        "deltas_mib": [round(d / MIB, 1) for d in deltas], "this_process_mib": None if process is None else round(process / MIB),
        "threshold": threshold,
        "copies_that_fit": predict(baseline + max(0, deltas[0] - per_copy), per_copy, total, threshold),
    }


def nvml_index() -> int:
    """The NVML index of torch's device 0 (CUDA_VISIBLE_DEVICES given as indices), else 0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(visible) if visible.isdigit() else 0


def copy_loader(path: Path, shapes, dtypes, max_batch: int, device: str = "cuda") -> Callable[[], Callable]:
    def load():
        module, run_once = torchscript_runner(path, shapes, dtypes, device)
        run_once(max_batch)
        return module
    return load


# --------------------------------------------------------------------------- step 5: Triton
def gpu_python_model(torchscript: Path, out: Path, device: str = "cuda") -> Path:
    """A python-backend copy of a TorchScript artifact that runs it with PyTorch on CUDA, laid
    out like ``mme package`` output (model directory, tarball, manifest) for ``mme capacity``."""
    from dataclasses import replace

    from mme.fsutil import deterministic_tar_gz
    from packager.layout import file_entries
    from packager.manifest import Manifest, Validation
    from packager.triton_config import read_config, write_config

    manifest = Manifest.load(torchscript)
    name = manifest.model
    artifact = out / "torchscript-cuda-python"
    model_dir = artifact / name
    (model_dir / "1").mkdir(parents=True)
    config = read_config(torchscript / name / "config.pbtxt")
    config.ClearField("platform")
    config.backend = "python"
    for group in config.instance_group:  # the model puts itself on the GPU
        group.kind = type(group).Kind.Value("KIND_CPU")
    config.parameters["device"].string_value = device
    write_config(config, model_dir / "config.pbtxt")
    shutil.copyfile(torchscript / name / "1" / "model.pt", model_dir / "1" / "model.pt")
    shutil.copyfile(Path(__file__).with_name("torchscript_cuda_model.py"), model_dir / "1" / "model.py")
    sample = manifest.sample_request
    for sample_file in (sample.json_file, sample.binary_file):
        if (torchscript / sample_file).is_file():
            shutil.copyfile(torchscript / sample_file, artifact / sample_file)
    tarball = artifact / f"{name}.tar.gz"
    deterministic_tar_gz(model_dir, name, tarball)
    replace(
        manifest, format="torchscript-cuda-python", tarball=tarball.name, files=file_entries(artifact),
        triton=replace(manifest.triton, platform=None, backend="python", instance_kind="KIND_GPU",
                       max_batch_size=config.max_batch_size),
        validation=Validation(passed=None, skipped="a python-backend copy of the torchscript artifact for the GPU "
                              "check, which compares its outputs with PyTorch itself"),
    ).write(artifact)
    return artifact


def kserve_json(name: str, array) -> bytes:
    return json.dumps({"inputs": [{"name": name, "shape": list(array.shape), "datatype": "FP32",
                                   "data": array.ravel().tolist()}]}).encode()


def triton_serves_a_gpu_copy(artifact: Path, torchscript: Path, device: str = "cuda") -> dict[str, Any]:
    """One copy loaded into the wheel's Triton the way the local MME loads it, invoked, and
    compared with PyTorch on CUDA."""
    import numpy as np
    import torch

    from serving.cache import ModelCache
    from serving.container import ContainerClient
    from serving.store import LocalDirSource
    from serving.triton.base import TritonServerConfig
    from serving.triton.local import LocalTritonServer

    from packager.manifest import Manifest

    manifest = Manifest.load(artifact)
    with tempfile.TemporaryDirectory(prefix="mme-gpu-check-cache-") as tmp:
        cache = ModelCache(Path(tmp), LocalDirSource(artifact))
        server = LocalTritonServer(TritonServerConfig(sagemaker_port=0, grpc_port=None, metrics_port=None))
        with server:
            cached = cache.fetch(manifest.tarball)
            started = time.perf_counter()
            with ContainerClient(server.sagemaker_url, timeout_s=120, load_timeout_s=300) as control:
                control.load(cached.container_name, server.model_url(cached.model_dir), target=manifest.tarball)
                load_s = time.perf_counter() - started
                x = np.random.default_rng(0).standard_normal((2, *manifest.inputs[0].dims), dtype=np.float32)
                reply = control.invoke(cached.container_name, kserve_json(manifest.inputs[0].name, x),
                                       "application/json", target=manifest.tarball)
        if reply.status != 200:
            raise RuntimeError(f"invoke answered {reply.status}: {reply.body[:300]!r}")
        out = reply.json()["outputs"][0]
        got = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    module = torch.jit.load(str(torchscript / manifest.model / "1" / "model.pt"), map_location=device).eval()
    with torch.inference_mode():
        want = module(torch.from_numpy(x).to(device)).float().cpu().numpy()
    return {"load_s": round(load_s, 2), "output_shape": list(got.shape),
            "max_abs_diff_vs_pytorch": float(np.max(np.abs(got - want)))}


# --------------------------------------------------------------------------- main steps
def run(args: argparse.Namespace) -> int:
    facts = detect()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "facts.json").write_text(json.dumps(facts, indent=2) + "\n")
    device = args.device
    if device == "cuda" and not facts["torch_cuda"]:
        print(f"gpu-check: no usable NVIDIA GPU ({facts['no_gpu_reason']}); nothing was measured")
        return EXIT_NO_GPU
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    max_batch = max(batches)
    work = Path(tempfile.mkdtemp(prefix="mme-gpu-check-"))
    state: dict[str, Any] = {}
    checks = Run(args.budget_s)

    def torchscript(step: Step) -> None:
        directory = package(args.model, "torchscript", work, max_batch)
        state["torchscript"] = directory
        shapes, dtypes = manifest_inputs(directory)
        state["shapes"] = (shapes, dtypes)
        module, run_once = torchscript_runner(_model_file(directory, "model.pt"), shapes, dtypes, device)
        step.figures["latency_ms"] = latency(run_once, batches, args.warmup, args.iters, device)
        del module

    def copies(step: Step) -> None:
        shapes, dtypes = state["shapes"]
        step.figures.update(measure_copies(copy_loader(_model_file(state["torchscript"], "model.pt"), shapes, dtypes,
                                                       max_batch, device), args.copies, args.threshold, device))

    def tensorrt(step: Step) -> None:
        directory = package(args.model, "tensorrt", work, max_batch, ["--precision", args.precision])
        from packager.manifest import Manifest

        details = Manifest.load(directory).details
        step.figures.update({"engine_precision": details.engine_precision, "layer_precisions": details.layer_precisions,
                             "compute_capability": details.compute_capability})
        runner = tensorrt_runner(_model_file(directory, "model.plan"), *state["shapes"])
        step.figures["latency_ms"] = latency(runner, batches, args.warmup, args.iters)

    def encoder(step: Step) -> None:
        import numpy as np
        import torch

        directory = package(args.encoder, "torchscript", work, max_batch, ["--seq-len", str(args.seq_len)])
        shapes, dtypes = manifest_inputs(directory)
        path = _model_file(directory, "model.pt")
        cpu = torch.jit.load(str(path), map_location="cpu").eval()
        gpu_module, run_once = torchscript_runner(path, shapes, dtypes, device)
        ids = [torch.randint(1, 1000, (2, *s), dtype=torch.int64) if d != "float32" else torch.randn((2, *s))
               for s, d in zip(shapes, dtypes)]
        with torch.inference_mode():
            want = cpu(*ids)
            got = gpu_module(*[t.to(device) for t in ids])
        want = want if isinstance(want, (tuple, list)) else (want,)
        got = got if isinstance(got, (tuple, list)) else (got,)
        diff = max(float(np.max(np.abs(g.float().cpu().numpy() - w.float().numpy()))) for g, w in zip(got, want))
        step.figures.update({"model": args.encoder, "seq_len": args.seq_len, "traced_on": "cpu", "ran_on": device,
                             "max_abs_diff_vs_cpu": diff,
                             "latency_ms": latency(run_once, batches, args.warmup, args.iters, device)})
        if not diff < 1e-2:
            raise RuntimeError(f"the encoder's CUDA outputs differ from its CPU outputs by {diff:.3g}")

    def triton(step: Step) -> None:
        from serving.capacity import measure_capacity, write_report

        artifact = gpu_python_model(state["torchscript"], work, device)
        step.figures["one_copy"] = triton_serves_a_gpu_copy(artifact, state["torchscript"], device)
        if device == "cuda":  # the GPU in use now plus the headroom: the run ends in time
            limit = meter_for(device, list).used() + int(args.triton_headroom_gib * GIB)
        else:  # host RSS of the server's processes starts near zero
            limit = int(args.triton_headroom_gib * GIB)
        report = measure_capacity(artifact, threshold=args.threshold, limit_bytes=limit, probe_copies=3, verify=True,
                                  max_copies=args.triton_max_copies, server_kind="local",
                                  memory="gpu" if device == "cuda" else "host")
        path = write_report(report, out)
        step.figures.update({
            "memory_kind": report.memory_kind, "limit_mib": round(report.limit_bytes / MIB),
            "baseline_mib": round(report.baseline_bytes / MIB), "per_copy_mib": round(report.footprint_mean_bytes / MIB),
            "predicted_copies": report.predicted_copies, "actual_copies": report.actual_copies,
            "load_seconds": [s.load_seconds for s in report.steps], "report": path.name,
            "projections": {p.instance_type: p.copies for p in report.projections},
        })

    ts = checks.step("1. TorchScript latency", 60, torchscript)
    needs_ts = "" if ts.status == "ran" else "needs step 1"
    no_nvml = device == "cuda" and facts["nvml_gpus"] in (-1, 0)
    checks.step("2. GPU memory per copy (NVML) and copies that fit", 30, copies,
                skip=needs_ts or ("NVML is unavailable (nvidia-ml-py)" if no_nvml else ""))
    no_trt = "TensorRT needs the GPU (--device cpu)" if device != "cuda" else facts["tensorrt_reason"]
    checks.step("3. TensorRT", 120, tensorrt, skip=needs_ts or (no_trt if not facts["tensorrt"] or device != "cuda" else ""))
    checks.step("4. Hugging Face encoder traced on CPU, run on CUDA", 60, encoder)
    triton_skip = needs_ts or ("" if facts["pytriton"] else
                               "the nvidia-pytriton wheel is not installed (gpu_check.sh --download-wheels carries it)")
    checks.step("5. Triton (nvidia-pytriton) serving GPU copies: mme capacity's GPU path", 150, triton, skip=triton_skip)
    shutil.rmtree(work, ignore_errors=True)

    report = {"schema_version": 1, "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "facts": facts,
              "device": device, "model": args.model, "batches": batches, "threshold": args.threshold,
              "seconds": round(time.monotonic() - checks.started, 1), "steps": [asdict(s) for s in checks.steps]}
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "gpu_check.md").write_text(markdown(report))
    print(markdown(report))
    print(f"written {out}/gpu_check.json, {out}/gpu_check.md, {out}/facts.json")
    return 1 if any(s.status == "failed" for s in checks.steps) else 0


def _model_file(directory: Path, file_name: str) -> Path:
    from packager.manifest import Manifest

    return directory / Manifest.load(directory).model / "1" / file_name


def tensorrt_runner(plan: Path, shapes, dtypes) -> Callable[[int], None]:
    import tensorrt as trt
    import torch

    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(plan.read_bytes())
    context = engine.create_execution_context()
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    outputs = [n for n in names if n not in inputs]
    buffers: dict[int, list] = {}

    def run_once(batch: int) -> None:
        if batch not in buffers:
            made = [torch.randn((batch, *s), device="cuda") if d == "float32" else
                    torch.randint(1, 1000, (batch, *s), device="cuda", dtype=torch.int64) for s, d in zip(shapes, dtypes)]
            for name, tensor in zip(inputs, made):
                context.set_input_shape(name, tuple(tensor.shape))
            outs = [torch.empty(tuple(context.get_tensor_shape(n)), device="cuda") for n in outputs]
            buffers[batch] = made + outs
        tensors = buffers[batch]
        for name, tensor in zip(inputs + outputs, tensors):
            if name in inputs:
                context.set_input_shape(name, tuple(tensor.shape))
            context.set_tensor_address(name, tensor.data_ptr())
        if not context.execute_async_v3(torch.cuda.current_stream().cuda_stream):
            raise RuntimeError("TensorRT execution failed")

    return run_once


def markdown(report: dict) -> str:
    facts = report["facts"]
    where = (f"{facts['gpu_name']} (compute capability {facts['compute_capability']})" if report["device"] == "cuda"
             else "CPU dry run (--device cpu): every step's code, no GPU figures")
    lines = [f"# GPU check: {where}", "",
             f"torch {facts['torch']}, Python {facts['python']}, TensorRT {facts['tensorrt'] or 'absent'}, "
             f"nvidia-pytriton {facts['pytriton'] or 'absent'}; {report['seconds']} s in all", "",
             "| step | status | seconds | note |", "| --- | --- | --- | --- |"]
    lines += [f"| {s['name']} | {s['status']} | {s['seconds']} | {s['note'] or ''} |" for s in report["steps"]]
    for s in report["steps"]:
        latency_ms = s["figures"].get("latency_ms")
        if latency_ms:
            lines += ["", f"{s['name']}: latency", "", "| batch | p50 ms | p90 ms | p99 ms | items/s |",
                      "| --- | --- | --- | --- | --- |"]
            lines += [f"| {b} | {v['p50_ms']} | {v['p90_ms']} | {v['p99_ms']} | {v['items_per_s']} |"
                      for b, v in latency_ms.items()]
        rest = {k: v for k, v in s["figures"].items() if k != "latency_ms"}
        if rest:
            lines += ["", f"{s['name']}: " + "; ".join(f"{k} {v}" for k, v in rest.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import warnings

    # Triton's libtorch backend still loads TorchScript: torch's deprecation notice is noise here.
    warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=FutureWarning)
    parser = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("detect", help="print what this host has (shell assignments, or --json)")
    d.add_argument("--json", action="store_true")
    r = sub.add_parser("run", help="the measurements (see the module docstring)")
    r.add_argument("--out", required=True, help="directory for facts.json, gpu_check.json/.md and the capacity report")
    r.add_argument("--model", default="resnet50")
    r.add_argument("--encoder", default="distilbert-base-uncased")
    r.add_argument("--seq-len", type=int, default=128)
    r.add_argument("--batches", default="1,16", help="batch sizes, comma separated (default: 1,16)")
    r.add_argument("--precision", choices=("fp32", "tf32", "fp16"), default="fp16", help="TensorRT step (default: fp16)")
    r.add_argument("--copies", type=int, default=6, help="copies loaded in-process for memory per copy (default: 6)")
    r.add_argument("--iters", type=int, default=50)
    r.add_argument("--warmup", type=int, default=10)
    r.add_argument("--threshold", type=float, default=0.9, help="share of GPU memory copies may fill (default: 0.9)")
    r.add_argument("--triton-headroom-gib", type=float, default=4.0,
                   help="step 5 fills the GPU memory in use now plus this much (default: 4), so it ends in time")
    r.add_argument("--triton-max-copies", type=int, default=10)
    r.add_argument("--budget-s", type=float, default=420.0, help="stop starting steps past this (default: 420 s)")
    r.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a dry run of every step's code on the CPU (CI runs it), host memory instead of NVML")
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
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
