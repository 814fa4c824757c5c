"""What ``mme package --catalogue FILE --on sagemaker`` will do, worked out before anything is
written: the catalogue cut into shards (``--shard-size`` entries each, in file order), one
SageMaker training job per shard in the builder image on the target instance type, its inputs
(the shard as a catalogue of its own, and ``job.json``) and its CreateTrainingJob request.

A shard's name comes from its entries' request fingerprints (the options that shape their
artifacts and this toolkit's version), the instance type and the image, so running the same
command again finds the same jobs; ``--retry`` numbers a new attempt of a shard whose job
failed or left entries unpackaged. An entry edited in the file changes its shard's name only.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import tomli_w

from mme import __version__
from mme.aws.images import check_image_uri
from mme.aws.session import TAGS, S3Uri, check_bucket, check_instance_type, check_role_arn, enum_values
from mme.aws.state import StateDir
from mme.errors import MmeError, UsageError
from mme.instances import instance_gpu
from mme.progress import Reporter
from mme.versions import release as triton_release
from packager.catalogue import CatalogueEntry
from packager.compat import check_release_on_gpu
from packager.formats import FORMATS
from packager.pipeline import check_package_request

DEFAULT_STATE_DIR = Path(".mme/package-jobs")
CHANNEL = "catalogue"
CHANNEL_DIR = f"/opt/ml/input/data/{CHANNEL}"
SHARD_FILE = "catalogue.toml"
JOB_CONFIG = "job.json"
JOB_INFO = "job_info.json"  # what the job wrote about itself (mme version, exit code, GPU), beside the artifacts
MODEL_DIR = "/opt/ml/model"  # SageMaker uploads it as output/model.tar.gz
FAILURE_FILE = "/opt/ml/output/failure"  # SageMaker reports it as FailureReason
# The builder image's own entrypoint wrapper (CUDA forward compatibility), then the job's entry.
ENTRYPOINT = ["/opt/nvidia/nvidia_entrypoint.sh", "python", "-m", "packager.remote.catalogue_entry"]
JOB_SCHEMA_VERSION = 1
_RELEASE_TAG = re.compile(r":(\d{2}\.\d{2})(?:[-_.][A-Za-z0-9_.-]*)?$")


@dataclass(frozen=True)
class JobsRequest:
    """The SageMaker side of a catalogue run: where, on what, how many at once."""

    s3: str  # working prefix: each shard's inputs and output go under <s3>/package/<shard>/
    instance_type: str
    role_arn: str
    image_uri: str  # the builder image (docker/builder), pushed to ECR
    region: str | None = None
    shard_size: int = 1  # catalogue entries per training job
    parallel_jobs: int = 4  # training jobs running at once
    jobs: int = 1  # entries packaged at once inside each job (mme package --jobs)
    volume_gb: int = 50
    max_runtime_s: int = 4 * 3600
    timeout_s: float = 6 * 3600.0
    poll_interval_s: float = 30.0
    state_dir: Path = DEFAULT_STATE_DIR
    s3_endpoint_url: str | None = None
    retry: bool = False
    dry_run: bool = False


@dataclass(frozen=True)
class ShardPlan:
    base: str  # the shard's name: its S3 prefix, its state key, its jobs' names less the attempt
    attempt: int
    entries: tuple[CatalogueEntry, ...]
    input_uri: str
    output_uri: str
    catalogue_toml: str
    job_config: dict[str, Any]
    create_training_job: dict[str, Any]

    @property
    def job_name(self) -> str:
        return f"{self.base}-{self.attempt}"

    @property
    def model_uri(self) -> str:
        """Where SageMaker leaves the job's /opt/ml/model."""
        return f"{self.output_uri}{self.job_name}/output/model.tar.gz"


@dataclass(frozen=True)
class JobsPlan:
    region: str
    instance_type: str
    image_uri: str
    state_name: str
    state_path: Path
    shards: tuple[ShardPlan, ...]

    def lines(self, with_request: bool = True) -> list[str]:
        head = [f"package plan: {sum(len(s.entries) for s in self.shards)} entries in {len(self.shards)} SageMaker "
                f"training jobs on {self.instance_type} in {self.region}",
                f"  image: {self.image_uri}", f"  state: {self.state_path}"]
        for shard in self.shards:
            head.append(f"  job {shard.job_name}: {', '.join(e.name for e in shard.entries)}")
            head.append(f"    inputs {shard.input_uri}{{{SHARD_FILE},{JOB_CONFIG}}} -> output {shard.model_uri}")
        if self.shards and with_request:
            head.append(f"  CreateTrainingJob ({self.shards[0].job_name}):")
            head += ["    " + line for line in json.dumps(self.shards[0].create_training_job, indent=2).splitlines()]
        return head


def check_jobs_request(request: JobsRequest) -> None:
    """The options alone (no AWS call): one line naming the option and the fix."""
    check_instance_type(request.instance_type, "TrainingInstanceType", "--instance-type",
                        "training jobs (where the catalogue is packaged)")
    check_role_arn(request.role_arn)
    check_image_uri(request.image_uri)
    S3Uri.parse(request.s3)


def image_release(image_uri: str) -> str | None:
    """The release a builder image is tagged with (``mme-builder:25.09``), when it says one."""
    found = _RELEASE_TAG.search(image_uri)
    return found.group(1) if found else None


def check_entries(entries: Sequence[CatalogueEntry], requests: Sequence[Any], image_uri: str,
                  instance_type: str) -> dict[int, str]:
    """Why each entry cannot be packaged by a job (entry index -> reason); the others can."""
    tagged = image_release(image_uri)
    gpu = instance_gpu(instance_type)
    refused: dict[int, str] = {}
    for entry, request in zip(entries, requests):
        try:
            if request.model.weights_path is not None:
                raise UsageError(f"weights_path = {str(request.model.weights_path)!r} is a path on this machine, which "
                                 "a SageMaker job cannot read; use hub weights there, or package this entry locally")
            check_package_request(request, build_here=False)
            rel = triton_release(request.triton_release)
            if tagged and tagged != rel.name:
                raise UsageError(f"it targets Triton {rel.name} but --image-uri is the builder of {tagged}; push the "
                                 f"builder of {rel.name} (make docker-build TRITON_RELEASE={rel.name}) or set "
                                 f"triton_release = \"{tagged}\"")
            check_release_on_gpu(rel, gpu.compute_capability, gpu.describe(instance_type))
            needs_gpu = [name for name in request.formats if FORMATS[name].requires_gpu]
            if needs_gpu and gpu.compute_capability is None:
                raise UsageError(f"{', '.join(needs_gpu)} need a GPU and {instance_type} has none ({gpu.gpu}); "
                                 "pass the GPU --instance-type you will serve on")
        except MmeError as exc:
            refused[entry.index] = str(exc)
    return refused


def _slug(text: str, length: int) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:length].strip("-") or "x"


def shard_base(entries: Sequence[CatalogueEntry], fingerprints: Sequence[str], instance_type: str, image_uri: str) -> str:
    digest = hashlib.sha256(json.dumps([list(fingerprints), instance_type, image_uri]).encode()).hexdigest()[:10]
    more = f"-and-{len(entries) - 1}" if len(entries) > 1 else ""
    name = _slug(entries[0].name, 40 - len(more))
    return f"mme-pkg-{name}{more}-{digest}"  # at most 8 + 40 + 11 characters; the attempt makes it <= 63


def shard_toml(entries: Sequence[CatalogueEntry]) -> str:
    """The shard as a catalogue of its own: each entry's merged options (no [defaults])."""
    return tomli_w.dumps({"model": [{"name": e.name, **e.options} for e in entries]})


def state_name(catalogue: Path, out: Path, instance_type: str) -> str:
    digest = hashlib.sha256(json.dumps([str(catalogue.resolve()), str(out.resolve()), instance_type]).encode()).hexdigest()
    return f"{_slug(catalogue.stem, 40)}-{digest[:10]}"


def _job_request(name: str, request: JobsRequest, input_uri: str, output_uri: str) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "RoleArn": request.role_arn,
        "AlgorithmSpecification": {
            "TrainingImage": request.image_uri,
            "TrainingInputMode": "File",
            "ContainerEntrypoint": list(ENTRYPOINT),
            "ContainerArguments": [f"{CHANNEL_DIR}/{JOB_CONFIG}"],
        },
        "InputDataConfig": [{
            "ChannelName": CHANNEL,
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": input_uri,
                                            "S3DataDistributionType": "FullyReplicated"}},
            "InputMode": "File",
        }],
        "OutputDataConfig": {"S3OutputPath": output_uri},
        "ResourceConfig": {"InstanceType": request.instance_type, "InstanceCount": 1, "VolumeSizeInGB": request.volume_gb},
        "StoppingCondition": {"MaxRuntimeInSeconds": request.max_runtime_s},
        "Tags": [dict(t) for t in TAGS],
    }


def plan_jobs(request: JobsRequest, catalogue_path: Path, out: Path, entries: Sequence[CatalogueEntry],
              fingerprints: Sequence[str], skip: set[int], region: str, s3: Any, store: StateDir,
              reporter: Reporter) -> JobsPlan:
    """The shards of ``entries`` (those not refused), less the shards whose entries are all in
    ``skip`` (already packaged here); reads S3 (bucket check) and the state file, writes nothing."""
    if request.instance_type not in enum_values("ProductionVariantInstanceType"):
        reporter.warn(f"{request.instance_type} is not an endpoint instance type: TensorRT engines built there may "
                      "not load where you serve")
    uri = S3Uri.parse(request.s3)
    check_bucket(s3, uri.bucket, region)
    name = state_name(catalogue_path, out, request.instance_type)
    state = store.read(name) or {}
    known = state.get("shards", {})
    size = request.shard_size
    shards = []
    for start in range(0, len(entries), size):
        group = tuple(entries[start:start + size])
        if all(e.index in skip for e in group):
            continue
        base = shard_base(group, fingerprints[start:start + size], request.instance_type, request.image_uri)
        previous = known.get(base, {})
        attempt = int(previous.get("attempt", 1)) + (1 if request.retry and previous.get("status") in RETRYABLE else 0)
        work = S3Uri(uri.bucket, f"{uri.prefix}package/{base}/")
        input_uri, output_uri = work.url(work.key("input/")), work.url(work.key("output/"))
        job_config = {"schema_version": JOB_SCHEMA_VERSION, "catalogue": SHARD_FILE, "out": MODEL_DIR,
                      "failure": FAILURE_FILE, "jobs": request.jobs, "mme_version": __version__,
                      "entries": [e.name for e in group]}
        shards.append(ShardPlan(
            base=base, attempt=attempt, entries=group, input_uri=input_uri, output_uri=output_uri,
            catalogue_toml=shard_toml(group), job_config=job_config,
            create_training_job=_job_request(f"{base}-{attempt}", request, input_uri, output_uri),
        ))
    return JobsPlan(region=region, instance_type=request.instance_type, image_uri=request.image_uri, state_name=name,
                    state_path=store.path(name), shards=tuple(shards))


# a shard's job ended in one of these (or left entries unpackaged): --retry starts attempt + 1
RETRYABLE = ("Failed", "Stopped", "incomplete")

