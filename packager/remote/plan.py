"""What ``mme compile --on sagemaker`` will do, worked out before anything is written: the
request, the ONNX artifact it starts from, the TensorRT optimisation profile taken from the
manifest, the training job's name and its CreateTrainingJob request.

Job names are derived from the model, instance type, precision and ONNX sha256, so running
the same command again finds the same job (``--retry`` numbers a new attempt).

The job starts the entry script through NVIDIA's entrypoint (``/opt/nvidia/nvidia_entrypoint.sh``,
which the SageMaker Triton image inherits from NGC's): it loads the image's CUDA forward
compatibility libraries when the host's driver is older than the image's CUDA, which a bare
``python3`` entrypoint would lose. AWS documents no NVIDIA driver for training hosts, so the
image's CUDA is checked only as far as it can be (``mme.hosts.check_training_host``): a warning,
never a refusal.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mme.aws.errors import AwsError
from mme.aws.images import check_image_uri, triton_image_uri
from mme.aws.session import TAGS, S3Uri, check_bucket, check_instance_type, check_role_arn, enum_values
from mme.aws.state import DEFAULT_COMPILE_DIR, StateDir
from mme.fsutil import sha256_of
from mme.hosts import check_training_host, training_warning
from mme.instances import instance_gpu
from mme.progress import Reporter
from mme.versions import release as triton_release
from mme.versions import require_sagemaker_image
from packager.compat import check_release_on_gpu
from packager.formats.gpu import PRECISIONS, opt_batch, tensorrt_major
from packager.manifest import Manifest

ENTRY_SCRIPT = Path(__file__).with_name("trt_build_entry.py")
# NVIDIA's entrypoint wrapper in NGC images (and so in SageMaker's Triton images, built FROM
# nvcr.io/nvidia/tritonserver:<release>-py3-min: triton-inference-server/server build.py): it sources
# /opt/nvidia/entrypoint.d/* (CUDA compatibility set-up) and then execs its arguments.
NVIDIA_ENTRYPOINT = "/opt/nvidia/nvidia_entrypoint.sh"
CODE_DIR = "/opt/ml/input/data/code"
ONNX_FILE = "model.onnx"
BUILD_CONFIG = "build_config.json"


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
    workspace_mib: int = 4096  # TensorRT builder workspace: mme package's --workspace-mib (packager.options)
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
    onnx = directory / manifest.model / "1" / ONNX_FILE
    config = directory / manifest.model / "config.pbtxt"
    for path in (onnx, config):
        if not path.is_file():
            raise AwsError(f"{path} is missing; re-run 'mme package' for this artifact")
    external = [p.name for p in onnx.parent.iterdir() if p.name != ONNX_FILE]
    if external:
        raise AwsError(f"{onnx.parent} holds external data files ({', '.join(external[:3])}); only single-file ONNX models are compiled remotely")
    return OnnxArtifact(directory, manifest, onnx, config, sha256_of(onnx))


def manifest_profile_shapes(manifest: Manifest, max_batch: int) -> dict[str, dict[str, list[int]]]:
    """min/opt/max shape per input: batch 1..max (opt: ``opt_batch``), dynamic axes 1..their
    max (opt at the max), as ``packager.formats.gpu.profile_shapes`` builds them locally."""
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
    host_line: str = ""  # what is known of the training host's driver (mme.hosts.HostVerdict.line)

    def lines(self) -> list[str]:
        head = [
            f"compile plan: TensorRT plan on {self.instance_type} in {self.region} (training job {self.job_name})",
            f"  image:   {self.image_uri}",
            *([f"  {self.host_line}"] if self.host_line else []),
            f"  inputs:  {self.input_uri}{ONNX_FILE}, {self.code_uri}{ENTRY_SCRIPT.name}, {self.code_uri}{BUILD_CONFIG}",
            f"  output:  {self.output_uri}{self.job_name}/output/model.tar.gz -> {self.out_dir}",
            f"  state:   {self.state_path}",
            f"  {BUILD_CONFIG}:",
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
            "ContainerEntrypoint": [NVIDIA_ENTRYPOINT, "python3", f"{CODE_DIR}/{ENTRY_SCRIPT.name}"],
            "ContainerArguments": [f"{CODE_DIR}/{BUILD_CONFIG}"],
        },
        "InputDataConfig": [channel("model", input_uri), channel("code", code_uri)],
        "OutputDataConfig": {"S3OutputPath": output_uri},
        "ResourceConfig": {"InstanceType": request.instance_type, "InstanceCount": 1, "VolumeSizeInGB": request.volume_gb},
        "StoppingCondition": {"MaxRuntimeInSeconds": request.max_runtime_s},
        "Tags": [dict(t) for t in TAGS],
    }


def check_compile_request(request: CompileRequest) -> None:
    check_instance_type(request.instance_type, "TrainingInstanceType", "--instance-type", "training jobs (where the plan is built)")
    check_role_arn(request.role_arn)
    if request.image_uri:
        check_image_uri(request.image_uri)
    if request.precision not in PRECISIONS:
        raise AwsError(f"--precision {request.precision!r} must be {', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]}")
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
    own = f"your image {request.image_uri}" if request.image_uri else f"release {rel.name}"
    host = check_training_host(None if request.image_uri else rel.cuda, request.instance_type, image=own)
    warning = training_warning(host)
    if warning:
        reporter.warn(warning)
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
        "onnx": ONNX_FILE,
        "model": artifact.model,
        "onnx_sha256": artifact.sha256,
        "precision": request.precision,
        "fp16_graph": fp16_graph,
        "hardware_compatible": request.hardware_compatible,
        "workspace_mib": request.workspace_mib,
        "max_batch_size": max_batch,
        "shapes": manifest_profile_shapes(manifest, max_batch),
        "allow_pip": True,
    }
    return CompilePlan(
        job_base=base, job_name=name, attempt=attempt, region=region, instance_type=request.instance_type,
        image_uri=image, release=rel.name, input_uri=input_uri, code_uri=code_uri, output_uri=output_uri,
        build_config=build_config, create_training_job=_job_request(name, request, image, input_uri, code_uri, output_uri),
        out_dir=Path(request.out) if request.out else artifact.directory.parent / "tensorrt",
        state_path=store.path(base), max_batch_size=max_batch, precision=request.precision, fp16_graph=fp16_graph,
        host_line=host.line(),
    )
