"""``mme capacity --endpoint NAME``: the articles' copy-counting loop against a deployed endpoint.

A SageMaker endpoint has no shell, so memory is read the way the articles do it: a tiny
``gpu-metrics`` Triton python-backend model (``metrics_model/``) deployed in the same S3
prefix answers each request with the GPU memory used and total (NVML), or, on a host
without a GPU (the local MME of ``mme serve``), the resident memory of the Triton process
tree against the host's RAM. The loop:

  invoke gpu-metrics                       -> baseline
  for i = 1..max_copies:
      ensure <model>-v{i}.tar.gz in S3     (server-side copy of <model>.tar.gz; kept when it matches)
      invoke it with the sample request    (the endpoint downloads and loads it)
      invoke gpu-metrics                   -> step i
      stop once utilisation reaches the threshold

This module only takes the readings (``sizing.capacity.Readings``); the report is the local
loop's, built by the same ``sizing.capacity.build_report``: baseline, the first copy apart
(on a GPU it carries the one-time CUDA/cuDNN/cuBLAS/ONNX Runtime start-up), the per-copy
footprint mean/min/max over the copies after it (copies already loaded by an earlier run left
out: when copy 1 is one of them, its start-up is in the baseline), the copies that fit under
the threshold, the prediction (baseline + first copy + (n - 1) x per copy), and projections
onto other instance types' usable GPU memory.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mme.aws.errors import AwsError
from mme.aws.s3 import CONTENT_TYPE, SHA_KEY, TransferSettings, copy_object, head, matches, verify
from mme.aws.session import S3Uri, aws_errors, error_code, error_message, s3_fail
from mme.errors import UsageError
from mme.fsutil import deterministic_tar_gz, sha256_of
from mme.progress import Reporter
from packager.manifest import Manifest
from packager.model_config import mc
from packager.triton_config import to_text, write_config
from serving.deploy.s3push import Artifact, execute_push, load_artifact, plan_push
from serving.models.copies import copy_indices, copy_name
from serving.monitor.memory import DEFAULT_MEMORY_THRESHOLD
from sizing.capacity_report import CapacityReport, CopyCost, Readings, build_capacity_report

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

METRICS_MODEL = "gpu-metrics"
METRICS_TARBALL = f"{METRICS_MODEL}.tar.gz"
METRICS_OUTPUTS = ("used_bytes", "total_bytes", "utilization", "source")
METRICS_REQUEST = json.dumps(
    {"inputs": [{"name": "request", "shape": [1], "datatype": "INT32", "data": [0]}]}
).encode()
GPU_KIND = "GPU memory (NVML) via the gpu-metrics model"
HOST_KIND = "host RSS of the Triton process tree via the gpu-metrics model"
MIB = 1 << 20
PRELOADED_BYTES = 2 * MIB  # a copy that adds less than this was already loaded


# --- the metrics model ----------------------------------------------------------------


def metrics_config() -> "ModelConfig":
    """The metrics model's Triton config (no name: the MME loads it under its target name)."""
    config = mc.ModelConfig(backend="python", max_batch_size=0)
    config.input.add(name="request", data_type=mc.TYPE_INT32, dims=[1])
    for name, dtype in zip(METRICS_OUTPUTS, (mc.TYPE_INT64, mc.TYPE_INT64, mc.TYPE_FP32, mc.TYPE_STRING)):
        config.output.add(name=name, data_type=dtype, dims=[1])
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    return config


def metrics_config_text() -> str:
    """config.pbtxt of the metrics model, through Triton's protobuf schema (``packager.triton_config``)."""
    return to_text(metrics_config())


def build_metrics_tarball(dest_dir: Path) -> Path:
    """``dest_dir/gpu-metrics.tar.gz``: gpu-metrics/config.pbtxt + gpu-metrics/1/model.py, byte-identical each time."""
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    model_py = resources.files("serving").joinpath("metrics_model/model.py").read_text()
    with tempfile.TemporaryDirectory(prefix="mme-gpu-metrics-") as tmp:
        root = Path(tmp) / METRICS_MODEL
        (root / "1").mkdir(parents=True)
        write_config(metrics_config(), root / "config.pbtxt")
        (root / "1" / "model.py").write_text(model_py)
        dest = dest_dir / METRICS_TARBALL
        deterministic_tar_gz(root, METRICS_MODEL, dest)
    return dest


def push_metrics_model(s3: Any, destination: S3Uri) -> tuple[str, bool]:
    """Put gpu-metrics.tar.gz under the prefix unless the same bytes are there; (key, written)."""
    key = destination.key(METRICS_TARBALL)
    with tempfile.TemporaryDirectory(prefix="mme-gpu-metrics-") as tmp:
        tarball = build_metrics_tarball(Path(tmp))
        sha, data = sha256_of(tarball), tarball.read_bytes()
    if matches(head(s3, destination.bucket, key), sha, len(data)):
        return key, False
    try:
        s3.put_object(Bucket=destination.bucket, Key=key, Body=data, ContentType=CONTENT_TYPE,
                      Metadata={SHA_KEY: sha, "mme-model": METRICS_MODEL})
    except aws_errors() as exc:
        raise s3_fail(exc, "upload to", destination.url(key), "s3:PutObject") from None
    verify(s3, destination.bucket, key, sha, len(data))
    return key, True


# --- invoking the endpoint ------------------------------------------------------------


@dataclass(frozen=True)
class MemoryReading:
    used_bytes: int
    total_bytes: int
    utilization: float
    source: str


class EndpointInvoker:
    """boto3 ``sagemaker-runtime`` InvokeEndpoint with a TargetModel (the articles' client)."""

    def __init__(self, runtime: Any, endpoint: str) -> None:
        self.runtime = runtime
        self.endpoint = endpoint

    def invoke(self, target: str, body: bytes, content_type: str) -> bytes:
        try:
            reply = self.runtime.invoke_endpoint(EndpointName=self.endpoint, TargetModel=target,
                                                 ContentType=content_type, Body=body)
        except aws_errors() as exc:
            code = error_code(exc)
            if code in ("ValidationError", "ValidationException") and "endpoint" in error_message(exc).lower():
                raise AwsError(f"endpoint {self.endpoint!r}: {error_message(exc)}; check --endpoint, --region "
                               "(and --endpoint-url for a local endpoint)") from None
            raise AwsError(f"invoking {target} on endpoint {self.endpoint!r} failed ({code or type(exc).__name__}: "
                           f"{error_message(exc)}); is it a multi-model endpoint serving the --s3 prefix?") from None
        return reply["Body"].read()

    def memory(self) -> MemoryReading:
        raw = self.invoke(METRICS_TARBALL, METRICS_REQUEST, "application/json")
        try:
            outputs = {o["name"]: o["data"][0] for o in json.loads(raw)["outputs"]}
            return MemoryReading(int(outputs["used_bytes"]), int(outputs["total_bytes"]),
                                 float(outputs["utilization"]), str(outputs["source"]))
        except (ValueError, KeyError, IndexError, TypeError):
            raise AwsError(f"the {METRICS_MODEL} model answered something unexpected ({raw[:200]!r}); "
                           f"delete {METRICS_TARBALL} from the prefix and run again") from None


def runtime_client(session: Any, endpoint_url: str | None) -> Any:
    """sagemaker-runtime with a long read timeout: the first request for a copy waits for its load."""
    from botocore.config import Config

    config = Config(retries={"mode": "standard", "max_attempts": 3}, read_timeout=600, connect_timeout=10)
    return session.client("sagemaker-runtime", endpoint_url=endpoint_url, config=config)


# --- the loop -------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteCapacityRequest:
    endpoint: str
    destination: S3Uri
    artifact: Path
    threshold: float = DEFAULT_MEMORY_THRESHOLD
    max_copies: int = 200
    settle_seconds: float = 0.2  # between a copy's first request and the memory reading


@dataclass(frozen=True)
class RemoteCapacityResult:
    report: CapacityReport
    source: str  # the metrics model's source: nvml:..., host-rss:...
    copied: tuple[str, ...]  # copies created by server-side copy during this run
    reused: tuple[str, ...]  # copies already in S3 with the right bytes
    stopped: str  # "threshold" | "max-copies"


def _ensure_copy(s3: Any, artifact: Artifact, destination: S3Uri, base_key: str, base_etag: str | None,
                 index: int, settings: TransferSettings) -> tuple[str, bool]:
    key = destination.key(copy_name(artifact.tarball.name, index))
    if matches(head(s3, destination.bucket, key), artifact.sha256, artifact.size):
        return key, False
    copy_object(s3, destination.bucket, base_key, key, base_etag,
                artifact.metadata(copy_of=base_key.rsplit("/", 1)[-1]), settings)
    verify(s3, destination.bucket, key, artifact.sha256, artifact.size)
    return key, True


def measure_remote_capacity(s3: Any, invoker: EndpointInvoker, request: RemoteCapacityRequest, *,
                            instances: dict[str, dict] | None = None, reporter: Reporter | None = None,
                            settings: TransferSettings = TransferSettings()) -> RemoteCapacityResult:
    reporter = reporter or Reporter(quiet=True)
    if not 0 < request.threshold <= 1:
        raise UsageError(f"--threshold must be in (0, 1] (got {request.threshold})")
    if request.max_copies < 1:
        raise UsageError(f"--max-copies must be 1 or more (got {request.max_copies})")
    artifact = load_artifact(request.artifact, allow_random_weights=True)  # a load test: outputs do not matter
    sample = Manifest.load(artifact.directory).sample_request.json_file
    sample_path = artifact.directory / sample
    if not sample_path.is_file():
        raise UsageError(f"{sample_path} is missing; re-run 'mme package' for this artifact")
    body = sample_path.read_bytes()
    dest = request.destination

    # The base tarball (uploaded only when S3 lacks these bytes) and the metrics model beside it.
    plan = plan_push(s3, artifact, dest, 0)
    execute_push(s3, plan, settings, reporter)
    base_etag = verify(s3, dest.bucket, plan.base_key, artifact.sha256, artifact.size).get("ETag")
    metrics_key, written = push_metrics_model(s3, dest)
    reporter.info(f"  {METRICS_MODEL}: {dest.url(metrics_key)} ({'uploaded' if written else 'already there'})")

    invoker.memory()  # the first request loads the metrics model; its own footprint belongs to the baseline
    time.sleep(request.settle_seconds)
    first = invoker.memory()
    source = first.source
    readings = Readings(artifact.model, artifact.format, GPU_KIND if source.startswith("nvml") else HOST_KIND,
                        first.total_bytes, request.threshold, first.used_bytes)
    reporter.info(f"==> capacity of {artifact.model} ({artifact.format}) on endpoint {invoker.endpoint}: baseline "
                  f"{first.used_bytes / MIB:.0f} MiB of {first.total_bytes / MIB:.0f} MiB ({first.utilization:.1%}, {source}), "
                  f"threshold {request.threshold:.0%}")
    copied: list[str] = []
    reused: list[str] = []
    stopped = "max-copies"
    for count, index in enumerate(copy_indices(request.max_copies), start=1):
        key, made = _ensure_copy(s3, artifact, dest, plan.base_key, base_etag, index, settings)
        (copied if made else reused).append(key)
        started = time.perf_counter()
        invoker.invoke(key.rsplit("/", 1)[-1], body, "application/json")
        seconds = time.perf_counter() - started
        time.sleep(request.settle_seconds)
        reading = invoker.memory()
        step = readings.record(reading.used_bytes, seconds)
        reporter.info(f"  copy {count:>3}: {reading.used_bytes / MIB:8.0f} MiB (+{step.delta_bytes / MIB:.0f} MiB, "
                      f"{'copied' if made else 'in S3'}, first request {seconds:.2f} s, {reading.utilization:.1%} used)")
        if step.delta_bytes < 0:
            reporter.warn(f"memory fell after copy {count}: the endpoint may have unloaded models (its own threshold)")
        elif step.delta_bytes < PRELOADED_BYTES:
            reporter.warn(f"copy {count} added almost nothing: it was probably loaded already (an earlier run); "
                          "its footprint is left out; a fresh endpoint or an unused --s3 prefix gives clean figures")
        if reading.used_bytes >= readings.budget_bytes:
            stopped = "threshold"
            break
    # copies that were already loaded tell nothing about a copy's size
    sized = [s for s in readings.steps if s.delta_bytes >= PRELOADED_BYTES] or readings.steps
    report = build_capacity_report(readings, sized, instances=instances)
    reporter.info(f"  {CopyCost.of(sized).line()}: {report.actual_copies} copies fit under {request.threshold:.0%} "
                  f"(stopped at {stopped}), predicted {report.predicted_copies}")
    return RemoteCapacityResult(report, source, tuple(copied), tuple(reused), stopped)
