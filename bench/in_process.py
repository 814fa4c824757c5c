"""``mme bench --in-process SECONDS``: the artifact's model run in this process on its sample
request (the tensors the bench sends), one call after another at batch 1, before the load starts: the ceiling one caller
gets on this host without HTTP, the front or Triton. The report puts the endpoint's throughput
next to it (same payload, same run).

ONNX files only (the onnx and cpu-local formats) with ONNX Runtime and the thread count the
artifact serves with; a text ensemble runs its packaged tokenizer first, as Triton does.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from bench.config import InProcessResult
from bench.payload import from_artifact
from mme.errors import UsageError
from mme.progress import Reporter
from mme.stats import percentile
from packager.formats import FORMATS as PACKAGER_FORMATS
from packager.manifest import Manifest
from packager.text_ensemble import step_names
from packager.triton_config import read_config

if TYPE_CHECKING:  # numpy is imported where arrays are made: this module's record travels in BenchConfig
    import numpy as np

ONNX_FORMATS = tuple(name for name, fmt in PACKAGER_FORMATS.items() if fmt.onnx_model)  # onnx, cpu-local
_NUMPY = {"FP32": "float32", "FP16": "float16", "INT64": "int64", "INT32": "int32", "BOOL": "bool", "BYTES": "object"}


def check_in_process_artifact(artifact: str | None) -> Path:
    """The artifact directory --in-process runs, or UsageError saying what it needs."""
    if not artifact:
        raise UsageError("--in-process runs the artifact's model in this process: it needs --artifact DIR")
    manifest = Manifest.load(Path(artifact))
    if manifest.format not in ONNX_FORMATS:
        raise UsageError(f"--in-process runs ONNX files with ONNX Runtime; {artifact} is {manifest.format}: "
                         f"use an artifact in one of {', '.join(ONNX_FORMATS)}")
    return Path(artifact)


def kserve_arrays(body: bytes) -> dict[str, np.ndarray]:
    """The input tensors of a KServe v2 JSON request body."""
    request = json.loads(body)
    arrays = {}
    for entry in request.get("inputs", ()):
        dtype = np.dtype(_NUMPY[entry["datatype"]]).type
        data = entry["data"]
        if dtype is np.object_:
            data = [d.encode("utf-8") if isinstance(d, str) else d for d in np.ravel(np.array(data, dtype=object))]
        arrays[entry["name"]] = np.array(data, dtype=dtype).reshape(entry["shape"])
    return arrays


def model_call(directory: Path) -> tuple[Callable[[dict[str, np.ndarray]], Any], str, str]:
    """One in-process call of the artifact's model on the JSON sample's arrays: (call, runtime, pipeline)."""
    import onnxruntime as ort

    manifest = Manifest.load(directory)
    text = manifest.details.values.get("text_input")
    threads = int(manifest.details.values.get("intra_op_num_threads") or 0)
    model_dir = directory / (step_names(manifest.model)[1] if text else manifest.model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(model_dir / "1" / "model.onnx"), sess_options=options,
                                   providers=["CPUExecutionProvider"])
    runtime = f"onnxruntime {ort.__version__}, {threads or 'all'} intra-op threads"
    if not text:
        return (lambda arrays: session.run(None, arrays)), runtime, "model"
    tokenizer = _tokenizer(directory / step_names(manifest.model)[0])

    def call(arrays: dict[str, np.ndarray]) -> Any:
        texts = [v.decode("utf-8") for v in arrays["TEXT"][:, 0]]
        ids, mask = tokenizer.encode(texts)
        return session.run(None, {"input_ids": ids, "attention_mask": mask})

    return call, runtime, "packaged tokenizer + encoder"


def _tokenizer(model_dir: Path) -> Any:
    """The artifact's own tokenizer (its model.py), set up from its config.pbtxt as Triton sets it up."""
    version_dir = model_dir / "1"
    spec = importlib.util.spec_from_file_location("mme_packaged_tokenizer", version_dir / "model.py")
    if spec is None or spec.loader is None:
        raise UsageError(f"{version_dir / 'model.py'} cannot be loaded; package the model again")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    params = {key: value.string_value for key, value in read_config(model_dir / "config.pbtxt").parameters.items()}
    return module.WordPieceTokenizer.from_parameters(str(version_dir), params)


def measure_in_process(directory: Path, seconds: float, reporter: Reporter) -> InProcessResult:
    """Call the model on the artifact's sample request one call after another for ``seconds``
    (after one untimed call); percentiles as the report's (:func:`mme.stats.percentile`)."""
    call, runtime, pipeline = model_call(directory)
    arrays = kserve_arrays(from_artifact(directory).body)
    reporter.info(f"==> in-process baseline: {pipeline} of {directory} with {runtime}, batch 1, {seconds:g} s")
    call(arrays)  # first-call allocations are not the steady state
    latencies = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        call(arrays)
        latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - start
    ms = [s * 1000.0 for s in latencies]  # at least one: the loop runs once whatever ``seconds``
    result = InProcessResult(len(latencies), elapsed, len(latencies) / elapsed, percentile(ms, 50) or 0.0,
                             percentile(ms, 95) or 0.0, runtime, pipeline, "the artifact's sample request")
    reporter.info(f"  {result.requests_per_s:.1f} requests/s in-process (p50 {result.p50_ms:.1f} ms, "
                  f"{result.requests} calls)")
    return result
