"""What ``mme deploy`` checks about the endpoint's instance before it creates anything: the host
image (``InferenceAmiVersion``) botocore knows, the image's CUDA against the host's NVIDIA driver
(:mod:`mme.hosts`), and an engine against the release's TensorRT and the instance's GPU
(:mod:`packager.compat`)."""

from __future__ import annotations

from typing import Any

from mme.aws.errors import DeployError
from mme.aws.session import enum_values
from mme.hosts import AMI_OPTION, FORWARD, HostVerdict, check_host, nvidia_amis, require_starts
from mme.instances import instance_gpu
from mme.progress import Reporter
from packager.compat import EngineFacts, check_artifact, check_gpu


def check_ami_version(name: str) -> str:
    """An InferenceAmiVersion botocore's SageMaker model knows (ProductionVariantInferenceAmiVersion)."""
    known = enum_values("ProductionVariantInferenceAmiVersion")
    if name not in known:
        raise DeployError(f"{AMI_OPTION} {name!r} is not a host image SageMaker knows; choose one of: {', '.join(known)}")
    return name


def check_host_for_endpoint(rel: Any, instance_type: str, ami: str | None, own_image: str | None,
                            reporter: Reporter) -> HostVerdict:
    """The image's CUDA against the NVIDIA driver of the host the endpoint gets (the AMI given, or
    the instance family's default host, or the AMI the image needs): refuse in one line what cannot
    start; warn where it cannot be checked (the user's own image) or starts only by forward
    compatibility."""
    image = f"your image {own_image}" if own_image else f"release {rel.name}"
    verdict = require_starts(check_host(None if own_image else rel.cuda, instance_type, ami, image=image))
    if verdict.starts is None and own_image:
        newest = nvidia_amis()[-1]
        hint = "" if ami else f"; pass {AMI_OPTION} (e.g. {newest.ami}: {newest.specs})"
        reporter.warn(f"{verdict.reason}: if it was built for a newer CUDA than that host's driver runs, the endpoint "
                      f"fails to start{hint}")
    elif verdict.starts is None:
        reporter.warn(verdict.reason)
    elif verdict.how == FORWARD:
        reporter.warn(f"{verdict.reason}: it starts only if the image keeps NVIDIA's entrypoint"
                      + (f"; {verdict.alternative} runs it without" if verdict.alternative else ""))
    return verdict


def check_engine_for_endpoint(metadata: dict[str, str], rel: Any, instance_type: str, own_image: bool) -> None:
    """Refuse, before anything is created, what would fail to load on the endpoint: an engine
    for another TensorRT or Torch-TensorRT than the release's (unless the image is the user's
    own), or for another GPU than the instance's, or a release that does not run on that GPU."""
    facts = EngineFacts.from_s3_metadata(metadata)
    gpu = instance_gpu(instance_type)
    where = gpu.describe(instance_type)
    if own_image:
        check_gpu(facts, gpu.compute_capability, where)
    else:
        check_artifact(facts, rel, compute_capability=gpu.compute_capability, where=where)
