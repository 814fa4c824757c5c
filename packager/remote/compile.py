"""``mme compile --on sagemaker``: build a TensorRT plan in a SageMaker training job.

A plan runs only on the TensorRT version and GPU architecture it was built with, so it is
built where it will run: a training job on the target instance type, in the serving image
(the SageMaker Triton image of the artifact's release), as the source article did. The
job reads the ONNX model (channel ``model``) and a small entry script with its build
configuration (channel ``code``: ``trt_build_entry.py`` + ``build_config.json``, the
optimisation profile taken from the manifest's inputs and max batch size) and writes
``model.plan`` + ``build_info.json``, which SageMaker uploads as ``output/model.tar.gz``.
Then the plan is downloaded into ``artifacts/<model>/tensorrt/`` with the Triton model
directory, MME tarball, sample requests and a manifest (format tensorrt, TensorRT version
and GPU from the job). Job names are derived from the model, instance type and ONNX sha256,
so running the same command again waits for (or downloads) the same job.
"""

from __future__ import annotations

import json
import platform
import re
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from mme import __version__
from mme.fsutil import deterministic_tar_gz, sha256_of, staged_directory
from mme.progress import Reporter
from mme.versions import release as triton_release, require_sagemaker_image, same_tensorrt
from packager.compat import check_release_on_gpu
from packager.manifest import BuildDetails, FileEntry, Manifest, TritonSettings, TritonTarget, Validation
from mme.aws.errors import AwsError, CompileFailed, Interrupted, WaitTimeout
from mme.aws.images import check_image_uri, triton_image_uri
from mme.aws.s3 import SHA_KEY, TransferSettings, head, matches, upload_file, verify
from mme.aws.session import (
    S3Uri,
    aws_errors,
    check_bucket,
    check_instance_type,
    check_role_arn,
    enum_values,
    explain,
    is_not_found,
    s3_fail,
)
from mme.aws.state import DEFAULT_COMPILE_DIR, SCHEMA_VERSION, StateDir, now_iso
from serving.instances import instance_gpu

ENTRY_SCRIPT = Path(__file__).with_name("trt_build_entry.py")
CODE_DIR = "/opt/ml/input/data/code"
TAGS = ({"Key": "created-by", "Value": "mme-toolkit"},)
PLAN_FILE = "model.plan"
INFO_FILE = "build_info.json"
MAX_PLAN_BYTES = 32 << 30
_TRT_TO_TRITON = {"FLOAT": "TYPE_FP32", "HALF": "TYPE_FP16", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64",
                  "INT8": "TYPE_INT8", "BOOL": "TYPE_BOOL", "BF16": "TYPE_BF16", "UINT8": "TYPE_UINT8"}


@dataclass(frozen=True)
class CompileRequest:
    artifact: Path  # artifacts/<model>/onnx
    s3: str  # working prefix: inputs, code and job output go under <s3>/compile/<job>/
    instance_type: str
    role_arn: str
    region: str | None = None
    image_uri: str | None = None
    triton_release: str | None = None
    precision: str = "fp16"
    hardware_compatible: bool = False  # an engine for every Ampere-or-newer GPU
    max_batch_size: int | None = None  # default: the manifest's
    workspace_mib: int = 4096
    out: Path | None = None  # default: <artifact>/../tensorrt
    volume_gb: int = 30
    max_runtime_s: int = 3600
    timeout_s: float = 5400.0
    poll_interval_s: float = 30.0
    state_dir: Path = DEFAULT_COMPILE_DIR
    s3_endpoint_url: str | None = None
    retry: bool = False
    dry_run: bool = False


@dataclass(frozen=True)
class OnnxArtifact:
    directory: Path
    manifest: Manifest
    onnx: Path
    config: Path
    sha256: str

    @property
    def model(self) -> str:
        return self.manifest.model


def load_onnx_artifact(directory: Path) -> OnnxArtifact:
    directory = Path(directory)
    if not directory.is_dir():
        raise AwsError(f"--artifact {directory} does not exist; pass artifacts/<model>/onnx made by 'mme package --formats onnx'")
    manifest = Manifest.load(directory)
    if manifest.format != "onnx":
        raise AwsError(
            f"--artifact {directory} is the {manifest.format} format; TensorRT plans are built from the onnx format "
            f"(mme package {manifest.requested_name} --formats onnx)"
        )
    onnx = directory / manifest.model / "1" / "model.onnx"
    config = directory / manifest.model / "config.pbtxt"
    for path in (onnx, config):
        if not path.is_file():
            raise AwsError(f"{path} is missing; re-run 'mme package' for this artifact")
    external = [p.name for p in onnx.parent.iterdir() if p.name != "model.onnx"]
    if external:
        raise AwsError(f"{onnx.parent} holds external data files ({', '.join(external[:3])}); only single-file ONNX models are compiled remotely")
    return OnnxArtifact(directory, manifest, onnx, config, sha256_of(onnx))


def profile_shapes(manifest: Manifest, max_batch: int) -> dict[str, dict[str, list[int]]]:
    """min/opt/max shape per input: batch 1..max (opt: ``opt_batch``), dynamic axes 1..their
    max (opt at the max), as ``packager.formats.gpu.profile_shapes`` builds them locally."""
    from packager.formats.gpu import opt_batch

    axes_max = manifest.details.axes_max
    shapes: dict[str, dict[str, list[int]]] = {"min": {}, "opt": {}, "max": {}}
    for tensor in manifest.inputs:
        low, high = [], []
        for dim, axis in zip(tensor.dims, tensor.dim_axes):
            if dim == -1:
                if axis not in axes_max:
                    raise AwsError(
                        f"input {tensor.name} has a dynamic dimension without a known maximum (axis {axis!r}); re-package with mme package"
                    )
                low.append(1)
                high.append(int(axes_max[axis]))
            else:
                low.append(int(dim))
                high.append(int(dim))
        if max_batch > 0:
            shapes["min"][tensor.name] = [1] + low
            shapes["opt"][tensor.name] = [opt_batch(max_batch)] + high
            shapes["max"][tensor.name] = [max_batch] + high
        elif low != high:  # no batch dimension, but dynamic axes
            shapes["min"][tensor.name] = low
            shapes["opt"][tensor.name] = high
            shapes["max"][tensor.name] = high
    return shapes


def job_base_name(model: str, instance_type: str, sha256: str, precision: str) -> str:
    short = instance_type.removeprefix("ml.").replace(".", "-")
    base = re.sub(r"[^A-Za-z0-9]+", "-", f"mme-trt-{model}")[:30].strip("-")
    return f"{base}-{short}-{precision}-{sha256[:8]}"[:58].strip("-")


@dataclass(frozen=True)
class CompilePlan:
    job_base: str
    job_name: str
    attempt: int
    region: str
    instance_type: str
    image_uri: str
    release: str
    input_uri: str
    code_uri: str
    output_uri: str
    build_config: dict
    create_training_job: dict
    out_dir: Path
    state_path: Path
    max_batch_size: int
    precision: str
    fp16_graph: bool = False  # the job builds from an FP16 ONNX graph converted here (TensorRT 11)

    def lines(self) -> list[str]:
        head = [
            f"compile plan: TensorRT plan on {self.instance_type} in {self.region} (training job {self.job_name})",
            f"  image:   {self.image_uri}",
            f"  inputs:  {self.input_uri}model.onnx, {self.code_uri}{ENTRY_SCRIPT.name}, {self.code_uri}build_config.json",
            f"  output:  {self.output_uri}{self.job_name}/output/model.tar.gz -> {self.out_dir}",
            f"  state:   {self.state_path}",
            "  build_config.json:",
        ]
        head += ["    " + line for line in json.dumps(self.build_config, indent=2).splitlines()]
        head.append("  CreateTrainingJob:")
        return head + ["    " + line for line in json.dumps(self.create_training_job, indent=2).splitlines()]


def _job_request(name: str, request: CompileRequest, image: str, input_uri: str, code_uri: str, output_uri: str) -> dict:
    def channel(channel_name: str, uri: str) -> dict:
        return {
            "ChannelName": channel_name,
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri, "S3DataDistributionType": "FullyReplicated"}},
            "InputMode": "File",
        }

    return {
        "TrainingJobName": name,
        "RoleArn": request.role_arn,
        "AlgorithmSpecification": {
            "TrainingImage": image,
            "TrainingInputMode": "File",
            "ContainerEntrypoint": ["python3", f"{CODE_DIR}/{ENTRY_SCRIPT.name}"],
            "ContainerArguments": [f"{CODE_DIR}/build_config.json"],
        },
        "InputDataConfig": [channel("model", input_uri), channel("code", code_uri)],
        "OutputDataConfig": {"S3OutputPath": output_uri},
        "ResourceConfig": {"InstanceType": request.instance_type, "InstanceCount": 1, "VolumeSizeInGB": request.volume_gb},
        "StoppingCondition": {"MaxRuntimeInSeconds": request.max_runtime_s},
        "Tags": [dict(t) for t in TAGS],
    }


def check_request(request: CompileRequest) -> None:
    check_instance_type(request.instance_type, "TrainingInstanceType", "--instance-type", "training jobs (where the plan is built)")
    check_role_arn(request.role_arn)
    if request.image_uri:
        check_image_uri(request.image_uri)
    if request.precision not in ("fp32", "tf32", "fp16"):
        raise AwsError(f"--precision {request.precision!r} must be fp32, tf32 or fp16")
    if request.max_batch_size is not None and request.max_batch_size < 1:
        raise AwsError(f"--max-batch-size must be 1 or more (got {request.max_batch_size})")
    S3Uri.parse(request.s3)


def plan_compile(request: CompileRequest, region: str, s3: Any, store: StateDir, artifact: OnnxArtifact,
                 reporter: Reporter) -> CompilePlan:
    """Validate and build the job request; reads S3 (bucket check) but writes nothing."""
    if request.instance_type not in enum_values("ProductionVariantInstanceType"):
        reporter.warn(f"{request.instance_type} is not an endpoint instance type: a plan built there may not run where you serve")
    uri = S3Uri.parse(request.s3)
    check_bucket(s3, uri.bucket, region)
    manifest = artifact.manifest
    max_batch = request.max_batch_size or manifest.triton.max_batch_size
    release = request.triton_release or manifest.triton.release or None
    rel = triton_release(release)
    require_sagemaker_image(rel, request.image_uri, "run the compile job in its Triton image")
    gpu = instance_gpu(request.instance_type)
    check_release_on_gpu(rel, gpu.compute_capability, gpu.describe(request.instance_type))
    image = request.image_uri or triton_image_uri(region, rel.name)
    # TensorRT 11 has no FP16 flag: the job builds FP16 from an FP16 graph, converted here.
    fp16_graph = request.precision == "fp16" and (tensorrt_major(rel.tensorrt) or 0) >= 11
    base = job_base_name(artifact.model, request.instance_type, artifact.sha256, request.precision)
    state = store.read(base)
    attempt = 1
    if state and state.get("jobs"):
        attempt = int(state["jobs"][-1]["attempt"]) + (1 if request.retry else 0)
    name = f"{base}-{attempt}"
    work = S3Uri(uri.bucket, f"{uri.prefix}compile/{base}/")
    input_uri, code_uri, output_uri = work.url(work.key("input/")), work.url(work.key("code/")), work.url(work.key("output/"))
    build_config = {
        "onnx": "model.onnx",
        "model": artifact.model,
        "onnx_sha256": artifact.sha256,
        "precision": request.precision,
        "fp16_graph": fp16_graph,
        "hardware_compatible": request.hardware_compatible,
        "workspace_mib": request.workspace_mib,
        "max_batch_size": max_batch,
        "shapes": profile_shapes(manifest, max_batch),
        "allow_pip": True,
    }
    return CompilePlan(
        job_base=base, job_name=name, attempt=attempt, region=region, instance_type=request.instance_type,
        image_uri=image, release=rel.name, input_uri=input_uri, code_uri=code_uri, output_uri=output_uri,
        build_config=build_config, create_training_job=_job_request(name, request, image, input_uri, code_uri, output_uri),
        out_dir=Path(request.out) if request.out else artifact.directory.parent / "tensorrt",
        state_path=store.path(base), max_batch_size=max_batch, precision=request.precision, fp16_graph=fp16_graph,
    )


def tensorrt_major(version: str | None) -> int | None:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


# --- S3 inputs ---------------------------------------------------------------------------


def _put_bytes(s3: Any, uri: str, data: bytes) -> None:
    import hashlib

    target = S3Uri.parse(uri.rsplit("/", 1)[0])
    key = target.key(uri.rsplit("/", 1)[1])
    sha = hashlib.sha256(data).hexdigest()
    if matches(head(s3, target.bucket, key), sha, len(data)):
        return
    try:
        s3.put_object(Bucket=target.bucket, Key=key, Body=data, Metadata={SHA_KEY: sha})
    except aws_errors() as exc:
        raise s3_fail(exc, "upload to", uri, "s3:PutObject") from None
    verify(s3, target.bucket, key, sha, len(data))


def upload_inputs(s3: Any, plan: CompilePlan, artifact: OnnxArtifact, settings: TransferSettings, reporter: Reporter) -> None:
    with tempfile.TemporaryDirectory(prefix=".mme-compile-") as tmp:
        onnx, sha = artifact.onnx, artifact.sha256
        if plan.fp16_graph:
            from packager.formats.tensorrt_plan import fp16_onnx

            reporter.info(f"  converting {artifact.onnx} to an FP16 graph (TensorRT 11 builds FP16 from FP16 graphs)")
            onnx = fp16_onnx(artifact.onnx, Path(tmp) / "model.onnx")
            sha = sha256_of(onnx)
        model_uri = S3Uri.parse(plan.input_uri)
        key = model_uri.key("model.onnx")
        size = onnx.stat().st_size
        if matches(head(s3, model_uri.bucket, key), sha, size):
            reporter.info(f"  {plan.input_uri}model.onnx: unchanged")
        else:
            reporter.info(f"  uploading {onnx} -> {plan.input_uri}model.onnx")
            upload_file(s3, onnx, model_uri.bucket, key, {SHA_KEY: sha}, settings, reporter)
            verify(s3, model_uri.bucket, key, sha, size)
    _put_bytes(s3, plan.code_uri + ENTRY_SCRIPT.name, ENTRY_SCRIPT.read_bytes())
    _put_bytes(s3, plan.code_uri + "build_config.json", (json.dumps(plan.build_config, indent=2) + "\n").encode())


# --- the job -------------------------------------------------------------------------------


def wait_for_job(sm: Any, name: str, timeout_s: float, poll_s: float, reporter: Reporter,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> dict:
    start = clock()
    last = None
    while True:
        try:
            desc = sm.describe_training_job(TrainingJobName=name)
        except aws_errors() as exc:
            raise AwsError(explain(exc, "describe", f"training job {name}", "sagemaker:DescribeTrainingJob")) from None
        status, secondary = desc.get("TrainingJobStatus"), desc.get("SecondaryStatus")
        elapsed = clock() - start
        if (status, secondary) != last:
            reporter.info(f"  training job {name}: {status} / {secondary} ({elapsed:.0f} s)")
            last = (status, secondary)
        if status == "Completed":
            return desc
        if status in ("Failed", "Stopped"):
            raise CompileFailed(
                f"training job {name} {status}: {desc.get('FailureReason', 'no reason given')}; logs in CloudWatch "
                "/aws/sagemaker/TrainingJobs; fix the cause and re-run with --retry to start a new job"
            )
        if elapsed + poll_s > timeout_s:
            raise WaitTimeout(
                f"training job {name} still {status} after {elapsed:.0f} s; it keeps running: run the same mme compile again to wait and download"
            )
        sleep(poll_s)


def _read_job_output(tarball: Path, into: Path) -> tuple[Path, dict]:
    """Take model.plan and build_info.json out of the job's model.tar.gz (regular files only)."""
    wanted = {PLAN_FILE, INFO_FILE}
    found: dict[str, Path] = {}
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                if name not in wanted or not member.isfile() or name in found:
                    continue
                if member.size > MAX_PLAN_BYTES:
                    raise CompileFailed(f"{name} in the job output is {member.size} bytes, more than the {MAX_PLAN_BYTES} allowed")
                source = tar.extractfile(member)
                if source is None:
                    continue
                dest = into / name
                with source, open(dest, "wb") as fh:
                    shutil.copyfileobj(source, fh, 1 << 20)
                found[name] = dest
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise CompileFailed(f"the job output {tarball.name} is not a readable tar.gz ({exc}); re-run with --retry") from None
    if PLAN_FILE not in found:
        raise CompileFailed(f"the job output has no {PLAN_FILE}; see the job's logs and re-run with --retry")
    info = {}
    if INFO_FILE in found:
        try:
            info = json.loads(found[INFO_FILE].read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            info = {}
    return found[PLAN_FILE], info


def _tensorrt_config(onnx_config: Path, max_batch: int, io_dtypes: dict) -> str:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    config = text_format.Parse(onnx_config.read_text(), mc.ModelConfig())
    config.ClearField("backend")
    config.ClearField("parameters")
    config.ClearField("default_model_filename")
    config.platform = "tensorrt_plan"
    config.max_batch_size = max_batch
    for tensor in list(config.input) + list(config.output):
        triton = _TRT_TO_TRITON.get(str(io_dtypes.get(tensor.name, "")).upper())
        if triton:
            tensor.data_type = mc.DataType.Value(triton)
    if not config.instance_group:
        config.instance_group.add(count=1)
    for group in config.instance_group:
        group.kind = mc.ModelInstanceGroup.Kind.Value("KIND_GPU")
    return text_format.MessageToString(config)


def write_tensorrt_artifact(plan: CompilePlan, artifact: OnnxArtifact, plan_file: Path, info: dict, job: dict) -> Path:
    """The tensorrt artifact directory, laid out like 'mme package' lays it out, swapped in atomically."""
    onnx_manifest = artifact.manifest
    name = artifact.model
    rel = triton_release(plan.release)
    with staged_directory(plan.out_dir) as staging:
        model_dir = staging / name
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(_tensorrt_config(artifact.config, plan.max_batch_size, info.get("io_dtypes") or {}))
        shutil.copyfile(plan_file, model_dir / "1" / PLAN_FILE)
        sample = onnx_manifest.sample_request
        for sample_file in (sample.json_file, sample.binary_file):
            if (artifact.directory / sample_file).is_file():
                shutil.copyfile(artifact.directory / sample_file, staging / sample_file)
        tarball = staging / f"{name}.tar.gz"
        deterministic_tar_gz(model_dir, name, tarball)
        files = tuple(
            FileEntry(p.relative_to(staging).as_posix(), sha256_of(p), p.stat().st_size)
            for p in sorted(staging.rglob("*")) if p.is_file()
        )
        version = str(info.get("tensorrt") or "unknown")
        details = BuildDetails.from_dict({
            "tensorrt": version,
            "precision": plan.precision,
            "builder_settings": {"command": info.get("command")} if info.get("command") else {},
            "hardware_compatibility": "ampere_plus" if plan.build_config.get("hardware_compatible") else "none",
            "gpu": info.get("gpu", "unknown"),
            "compute_capability": info.get("compute_capability", "unknown"),
            "built_on": plan.instance_type,
            "builder": info.get("builder", "unknown"),
            "training_job": plan.job_name,
            "training_image": plan.image_uri,
            "onnx_sha256": artifact.sha256,
            "profile_shapes": plan.build_config["shapes"],
            "task": onnx_manifest.details.task,
            "axes_max": onnx_manifest.details.axes_max,
        })
        triton = TritonSettings(
            platform="tensorrt_plan",
            backend=None,
            max_batch_size=plan.max_batch_size,
            instance_kind="KIND_GPU",
            dynamic_batching=onnx_manifest.triton.dynamic_batching,
            target=TritonTarget.from_release(rel),
        )
        versions = dict(onnx_manifest.versions) | {"mme-toolkit": __version__, "python": platform.python_version(), "tensorrt": version}
        seconds = job.get("TrainingTimeInSeconds") or job.get("BillableTimeInSeconds")
        manifest = Manifest(
            model=name, requested_name=onnx_manifest.requested_name, format="tensorrt", source=onnx_manifest.source,
            triton=triton, tarball=tarball.name, files=files, parameters=onnx_manifest.parameters,
            inputs=onnx_manifest.inputs, outputs=onnx_manifest.outputs, sample_request=sample, versions=versions,
            validation=Validation(passed=None, skipped=f"built remotely by SageMaker training job {plan.job_name}; "
                                  "not compared with PyTorch here (run the model on the endpoint to check it)"),
            timings_s={"compile_job": float(seconds)} if seconds else {},
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            details=details,
        )
        manifest.write(staging)
    return plan.out_dir


def download_and_write(s3: Any, plan: CompilePlan, artifact: OnnxArtifact, job: dict, reporter: Reporter) -> Path:
    model_uri = (job.get("ModelArtifacts") or {}).get("S3ModelArtifacts")
    if not model_uri:
        raise CompileFailed(f"training job {plan.job_name} completed without model artifacts; re-run with --retry")
    location = S3Uri.parse(model_uri.rsplit("/", 1)[0])
    key = location.key(model_uri.rsplit("/", 1)[1])
    with tempfile.TemporaryDirectory(prefix=".mme-compile-") as tmp:
        local = Path(tmp) / "model.tar.gz"
        reporter.info(f"  downloading {model_uri}")
        try:
            s3.download_file(location.bucket, key, str(local))
        except aws_errors() as exc:
            raise s3_fail(exc, "download", model_uri, "s3:GetObject") from None
        plan_file, info = _read_job_output(local, Path(tmp))
        expected = triton_release(plan.release).tensorrt
        built = str(info.get("tensorrt") or "")
        if expected and built and built != "unknown" and not same_tensorrt(built, expected):
            reporter.warn(
                f"the job built with TensorRT {built} but release {plan.release} serves TensorRT {expected}: the plan "
                "loads only on a release with the TensorRT it was built with (the manifest records the real one)"
            )
        return write_tensorrt_artifact(plan, artifact, plan_file, info, job)


class _CompileState:
    """The compile state file: the jobs started for one (model, instance, precision, ONNX) and their fate."""

    def __init__(self, store: StateDir, plan: CompilePlan) -> None:
        self.store = store
        self.plan = plan
        self.data: dict = {}

    def load(self) -> None:
        self.data = self.store.read(self.plan.job_base) or {
            "schema_version": SCHEMA_VERSION, "job_base": self.plan.job_base, "region": self.plan.region,
            "instance_type": self.plan.instance_type, "out_dir": str(self.plan.out_dir), "jobs": [], "created_at": now_iso(),
        }

    def job(self, name: str) -> dict | None:
        return next((j for j in self.data["jobs"] if j["name"] == name), None)

    def set_job(self, name: str, status: str) -> None:
        job = self.job(name)
        if job is None:
            job = {"name": name, "attempt": self.plan.attempt}
            self.data["jobs"].append(job)
        job["status"] = status
        self.data["updated_at"] = now_iso()
        self.store.write(self.plan.job_base, self.data)


def run_compile(plan: CompilePlan, artifact: OnnxArtifact, sm: Any, s3: Any, store: StateDir, reporter: Reporter, *,
                timeout_s: float = 5400.0, poll_s: float = 30.0, settings: TransferSettings = TransferSettings(),
                sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> Path:
    state = _CompileState(store, plan)
    state.load()
    reporter.info(f"==> compiling {artifact.model} to TensorRT on {plan.instance_type} (job {plan.job_name}); state in {plan.state_path}")
    try:
        existing = None
        try:
            existing = sm.describe_training_job(TrainingJobName=plan.job_name)
        except aws_errors() as exc:
            if not is_not_found(exc):
                raise AwsError(explain(exc, "describe", f"training job {plan.job_name}", "sagemaker:DescribeTrainingJob")) from None
        if existing is not None and existing.get("TrainingJobStatus") in ("Failed", "Stopped"):
            raise CompileFailed(
                f"training job {plan.job_name} {existing['TrainingJobStatus']}: {existing.get('FailureReason', 'no reason given')}; "
                "fix the cause and re-run with --retry to start a new job"
            )
        if existing is None:
            upload_inputs(s3, plan, artifact, settings, reporter)
            state.set_job(plan.job_name, "requested")
            try:
                sm.create_training_job(**plan.create_training_job)
            except aws_errors() as exc:
                raise AwsError(explain(exc, "create", f"training job {plan.job_name}",
                                       "sagemaker:CreateTrainingJob and iam:PassRole on the role")) from None
            state.set_job(plan.job_name, "created")
        else:
            reporter.info(f"  training job {plan.job_name} exists ({existing.get('TrainingJobStatus')}): following it")
        try:
            job = wait_for_job(sm, plan.job_name, timeout_s, poll_s, reporter, sleep, clock)
        except CompileFailed:
            state.set_job(plan.job_name, "Failed")
            raise
        state.set_job(plan.job_name, "Completed")
        out = download_and_write(s3, plan, artifact, job, reporter)
        state.set_job(plan.job_name, "downloaded")
        return out
    except KeyboardInterrupt:
        raise Interrupted(
            f"interrupted; the training job (if it started) keeps running in SageMaker: run the same mme compile again "
            f"to follow it and download the plan (state in {plan.state_path})"
        ) from None
