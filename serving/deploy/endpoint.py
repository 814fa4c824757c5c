"""``mme deploy``: a SageMaker endpoint on the Triton image (its removal, ``mme delete``, is
in ``serving.deploy.delete``; the three resources' calls in ``serving.deploy.resources``).

Deploy = CreateModel (``Mode: MultiModel`` with the S3 prefix as ``ModelDataUrl``, or one
tarball for ``--mode single``) -> CreateEndpointConfig (one variant) -> CreateEndpoint ->
wait for ``InService``. Everything that can be checked is checked before the first create
call: instance type, role ARN and InferenceAmiVersion against botocore's service model, region,
credentials, bucket, the tarballs under the prefix, the image, and the image's CUDA against the
host's NVIDIA driver (``mme.hosts``): the variant gets the ``InferenceAmiVersion`` the image
needs when the instance family's default host cannot start it. Names are derived from the S3 prefix
unless ``--name`` is given, so the same command run twice finds what the first run made
and goes on from there instead of creating duplicates.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from mme.aws.errors import DeployError, EndpointFailed, Interrupted, S3Error, WaitTimeout
from mme.aws.images import check_image_uri, triton_image_uri
from mme.aws.session import (
    TAGS,
    S3Uri,
    aws_errors,
    check_bucket,
    check_instance_type,
    check_role_arn,
    error_code,
    matches_shape,
    require_credentials,
    require_region,
    s3_fail,
)
from mme.aws.state import (
    DEFAULT_DEPLOYMENTS_DIR,
    Deployment,
    DeploymentSpec,
    DeploymentStore,
    DeploymentTracker,
    Resource,
    now_iso,
)
from mme.polling import poll_until
from mme.progress import Reporter
from mme.versions import release as triton_release
from mme.versions import require_sagemaker_image
from packager.formats import format_of
from serving.deploy.host_checks import check_ami_version, check_engine_for_endpoint, check_host_for_endpoint
from serving.deploy.resources import CREATION_ORDER, ENDPOINT, SageMakerResource, create, describe
from serving.models.copies import is_copy
from serving.triton.sagemaker_serve import DEFAULT_MODEL_ENV, MULTI, SINGLE

VARIANT = "AllTraffic"
FAILED_STATES = ("Failed", "OutOfService", "UpdateRollbackFailed")
NAME_MAX = 56  # + "-config" stays within SageMaker's 63 characters
DEFAULT_MODEL_NAME_ENV = DEFAULT_MODEL_ENV  # what a real-time endpoint's Triton serves (serve's variable)


@dataclass(frozen=True)
class DeployRequest:
    s3: str  # s3://bucket/prefix (multi), or s3://bucket/prefix[/name.tar.gz] (single)
    instance_type: str
    role_arn: str
    mode: str = MULTI
    image_uri: str | None = None
    triton_release: str | None = None
    name: str | None = None
    region: str | None = None
    target: str | None = None  # single mode: the tarball under the prefix
    instance_count: int = 1
    environment: tuple[tuple[str, str], ...] = ()
    wait: bool = True
    timeout_s: float = 3600.0
    poll_interval_s: float = 30.0
    state_dir: Path = DEFAULT_DEPLOYMENTS_DIR
    s3_endpoint_url: str | None = None
    dry_run: bool = False
    inference_ami_version: str | None = None  # the variant's host image (default: the one the image needs, if any)


@dataclass(frozen=True)
class DeployPlan(DeploymentSpec):
    endpoint_config: str
    model: str
    create_model: dict
    create_endpoint_config: dict
    create_endpoint: dict
    state_path: Path
    s3_endpoint_url: str | None = None
    host_line: str = ""  # which host image the variant runs on, and why (mme.hosts.HostVerdict.line)

    def requests(self) -> dict[str, dict]:
        return {
            "CreateModel": self.create_model,
            "CreateEndpointConfig": self.create_endpoint_config,
            "CreateEndpoint": self.create_endpoint,
        }

    def request_for(self, kind: str) -> dict:
        """The create request of one resource kind ("model", "endpoint-config", "endpoint")."""
        return {"model": self.create_model, "endpoint-config": self.create_endpoint_config,
                "endpoint": self.create_endpoint}[kind]

    def lines(self) -> list[str]:
        head = [
            f"deploy plan: endpoint {self.endpoint} in {self.region} ({self.mode}-model, {self.instance_type})",
            f"  model data: {self.model_data_url}",
            f"  image:      {self.image_uri}",
            f"  state file: {self.state_path}",
        ]
        if self.host_line:
            head.insert(3, f"  {self.host_line}")
        body = json.dumps(self.requests(), indent=2).splitlines()
        return head + ["  requests, in order:"] + ["  " + line for line in body]

    def new_state(self) -> Deployment:
        stamp = now_iso()
        resources = tuple(Resource(r.kind, self.request_for(r.kind)[r.name_param], "planned") for r in CREATION_ORDER)
        return Deployment(**self.spec(), resources=resources, status="planned", created_at=stamp, updated_at=stamp,
                          s3_endpoint_url=self.s3_endpoint_url)


# --- checks that need no AWS call ------------------------------------------------------


def sanitize_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:NAME_MAX].strip("-")
    return name or "mme"


def check_name(name: str) -> str:
    if len(name) > NAME_MAX or not matches_shape(name, "EndpointName") or not matches_shape(name + "-config", "EndpointConfigName"):
        raise DeployError(
            f"--name {name!r} is not a valid SageMaker name; use up to {NAME_MAX} letters, digits and '-', starting and ending with a letter or digit"
        )
    return name


def split_s3(text: str, mode: str) -> tuple[S3Uri, str | None]:
    """``s3://b/p/x.tar.gz`` -> (prefix ``p/``, ``x.tar.gz``) in single mode; else (prefix, None)."""
    if text.rstrip("/").endswith(".tar.gz"):
        if mode != SINGLE:
            raise DeployError(
                f"--s3 {text} names one tarball; a multi-model endpoint takes the prefix that holds them "
                "(drop the object name) or use --mode single"
            )
        parent, _, name = text.rstrip("/").rpartition("/")
        return S3Uri.parse(parent), name
    return S3Uri.parse(text), None


def parse_env(items: list[str] | tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]{0,1023}", key):
            raise DeployError(f"--env {item!r} must be KEY=VALUE with KEY made of letters, digits and '_'")
        pairs.append((key, value))
    return tuple(pairs)


def check_deploy_request(request: DeployRequest) -> None:
    if request.mode not in (MULTI, SINGLE):
        raise DeployError(f"--mode {request.mode!r} must be multi or single")
    check_instance_type(request.instance_type, "ProductionVariantInstanceType", "--instance-type", "endpoints")
    check_role_arn(request.role_arn)
    if request.name is not None:
        check_name(request.name)
    if request.image_uri is not None:
        check_image_uri(request.image_uri)
    if request.inference_ami_version is not None:
        check_ami_version(request.inference_ami_version)
    if request.instance_count < 1:
        raise DeployError(f"--instance-count must be 1 or more (got {request.instance_count})")
    if not request.timeout_s > 0 or not request.poll_interval_s > 0:
        raise DeployError("--timeout and --poll-interval must be positive numbers of seconds")
    if len(request.environment) > 100:
        raise DeployError("at most 100 --env entries fit in a SageMaker container's environment")
    split_s3(request.s3, request.mode)


# --- checks against AWS (reads only) ---------------------------------------------------


def _targets(s3: Any, uri: S3Uri) -> list[str]:
    names = []
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=uri.bucket, Prefix=uri.prefix):
            for obj in page.get("Contents", ()):
                name = obj["Key"][len(uri.prefix):]
                if name.endswith(".tar.gz") and "/" not in name:
                    names.append(name)
    except aws_errors() as exc:
        raise s3_fail(exc, "list", uri.url(), "s3:ListBucket") from None
    return sorted(names)


def _object_metadata(s3: Any, uri: S3Uri, name: str) -> dict[str, str]:
    try:
        return dict(s3.head_object(Bucket=uri.bucket, Key=uri.key(name)).get("Metadata", {}))
    except aws_errors() as exc:
        if error_code(exc) in ("404", "NoSuchKey", "NotFound"):
            raise S3Error(f"no object {uri.url(uri.key(name))}; push it first with 'mme push ARTIFACT --s3 {uri}'") from None
        raise s3_fail(exc, "read", uri.url(uri.key(name)), "s3:GetObject") from None


def plan_deploy(request: DeployRequest, session: Any, s3: Any, reporter: Reporter) -> DeployPlan:
    """Validate everything and build the three create requests; makes no SageMaker call."""
    check_deploy_request(request)
    region = require_region(session)
    require_credentials(session)
    uri, target = split_s3(request.s3, request.mode)
    check_bucket(s3, uri.bucket, region)
    found = _targets(s3, uri)
    if not found:
        raise S3Error(f"no .tar.gz under {uri}; push the model first: mme push artifacts/<model>/<format> --s3 {uri}")
    if request.mode == SINGLE:
        target = request.target or target
        if target is None:
            bases = [n for n in found if not is_copy(n)]
            if len(bases) != 1:
                raise DeployError(
                    f"--mode single needs one tarball but {uri} holds {len(bases)} ({', '.join(bases[:5])}); "
                    "pass --target NAME.tar.gz or --s3 s3://bucket/prefix/NAME.tar.gz"
                )
            target = bases[0]
        metadata = _object_metadata(s3, uri, target)
        model_data_url = uri.url(uri.key(target))
    else:
        metadata = _object_metadata(s3, uri, found[0])
        model_data_url = uri.url()
    if (fmt := format_of(metadata.get("mme-format"))) and not fmt.runs_on_sagemaker_image:
        reporter.warn(f"{model_data_url} holds the cpu-local format, which the SageMaker Triton image cannot run; push onnx, torchscript or tensorrt")
    rel = triton_release(request.triton_release or metadata.get("mme-triton-release") or None)
    own_image = request.image_uri or metadata.get("mme-image-uri")
    require_sagemaker_image(rel, own_image, "deploy it")
    image = own_image or triton_image_uri(region, rel.name)
    check_engine_for_endpoint(metadata, rel, request.instance_type, own_image is not None)
    host = check_host_for_endpoint(rel, request.instance_type, request.inference_ami_version, own_image, reporter)
    default_base = uri.prefix.rstrip("/").rsplit("/", 1)[-1] or uri.bucket
    if request.mode == SINGLE and target:
        default_base = target[: -len(".tar.gz")]
    name = request.name or sanitize_name(f"mme-{default_base}")
    check_name(name)
    env = {}
    if request.mode == SINGLE:
        env[DEFAULT_MODEL_NAME_ENV] = metadata.get("mme-model") or (target or "")[: -len(".tar.gz")]
    env.update(dict(request.environment))
    container: dict[str, Any] = {
        "Image": image,
        "Mode": "MultiModel" if request.mode == MULTI else "SingleModel",
        "ModelDataUrl": model_data_url,
    }
    if env:
        container["Environment"] = env
    model_name, config_name = f"{name}-model", f"{name}-config"
    variant: dict[str, Any] = {
        "VariantName": VARIANT, "ModelName": model_name, "InstanceType": request.instance_type,
        "InitialInstanceCount": request.instance_count, "InitialVariantWeight": 1.0,
    }
    if host.ami:
        variant["InferenceAmiVersion"] = host.ami
    return DeployPlan(
        endpoint=name, endpoint_config=config_name, model=model_name, region=region, mode=request.mode,
        s3_uri=uri.url(), model_data_url=model_data_url, instance_type=request.instance_type, image_uri=image,
        create_model={"ModelName": model_name, "ExecutionRoleArn": request.role_arn, "PrimaryContainer": container,
                      "Tags": [dict(t) for t in TAGS]},
        create_endpoint_config={
            "EndpointConfigName": config_name,
            "ProductionVariants": [variant],
            "Tags": [dict(t) for t in TAGS],
        },
        create_endpoint={"EndpointName": name, "EndpointConfigName": config_name, "Tags": [dict(t) for t in TAGS]},
        state_path=DeploymentStore(request.state_dir).path(name),
        s3_endpoint_url=request.s3_endpoint_url, host_line=host.line(),
    )


# --- carrying it out ----------------------------------------------------------------


def _conflict(kind: str, name: str, field_name: str, found: Any, wanted: Any, endpoint: str) -> DeployError:
    return DeployError(
        f"{kind} {name} already exists with {field_name} {found} (this deploy wants {wanted}); remove it with "
        f"'mme delete --endpoint {endpoint}' or choose another --name"
    )


def _endpoint_in_use(existing: dict, plan: DeployPlan, tracker: DeploymentTracker) -> str:
    """An existing endpoint is carried on from unless it has Failed or is going away."""
    status = existing.get("EndpointStatus")
    if status == "Failed":
        reason = existing.get("FailureReason", "no reason given")
        tracker.status("Failed", reason)
        raise EndpointFailed(
            f"endpoint {plan.endpoint} exists and has Failed: {reason}; remove it with 'mme delete --endpoint {plan.endpoint}' and deploy again"
        )
    if status == "Deleting":
        raise DeployError(f"endpoint {plan.endpoint} is being deleted; wait until it is gone, then run mme deploy again")
    return f"exists ({status})"


def _ensure(sm: Any, resource: SageMakerResource, plan: DeployPlan, tracker: DeploymentTracker, reporter: Reporter) -> None:
    """Keep the resource when one of that name matches the plan, refuse when it differs, else create it."""
    request = plan.request_for(resource.kind)
    name = request[resource.name_param]
    existing = describe(sm, resource, name)
    if existing is not None:
        conflict = resource.conflicts(existing, request)
        if conflict is not None:
            raise _conflict(resource.label, name, *conflict, plan.endpoint)
        note = _endpoint_in_use(existing, plan, tracker) if resource is ENDPOINT else "exists, kept"
        tracker.found(resource.kind)
        reporter.info(f"  {resource.what(name)}: {note}")
        return
    tracker.mark(resource.kind, "requested")
    create(sm, resource, request)
    tracker.mark(resource.kind, "created")
    reporter.info(f"  {resource.what(name)}: {resource.created_note}")


def wait_for_endpoint(sm: Any, endpoint: str, timeout_s: float, poll_s: float, reporter: Reporter,
                      sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> dict:
    """Poll DescribeEndpoint until InService; Failed -> EndpointFailed with SageMaker's FailureReason."""
    status = "unknown"

    def check(elapsed: Callable[[], float]) -> dict | None:
        nonlocal status
        desc = describe(sm, ENDPOINT, endpoint)
        if desc is None:
            raise DeployError(f"endpoint {endpoint} disappeared while waiting for it (deleted elsewhere?); run mme deploy again")
        status = desc.get("EndpointStatus", "unknown")
        reporter.info(f"  endpoint {endpoint}: {status} ({elapsed():.0f} s)")
        if status == "InService":
            return desc
        if status in FAILED_STATES:
            raise EndpointFailed(
                f"endpoint {endpoint} {status}: {desc.get('FailureReason', 'no reason given')}; its logs are in CloudWatch "
                f"/aws/sagemaker/Endpoints/{endpoint}; remove it with 'mme delete --endpoint {endpoint}'"
            )
        return None

    def timed_out(elapsed: float) -> WaitTimeout:
        return WaitTimeout(
            f"endpoint {endpoint} still {status} after {elapsed:.0f} s (--timeout {timeout_s:.0f}); it keeps going in "
            f"the background: run the same mme deploy again to wait more, or 'mme delete --endpoint {endpoint}'"
        )

    return poll_until(check, timeout_s=timeout_s, interval_s=poll_s, on_timeout=timed_out, sleep=sleep, clock=clock)


def run_deploy(plan: DeployPlan, sm: Any, store: DeploymentStore, reporter: Reporter, *, wait: bool = True,
               timeout_s: float = 3600.0, poll_s: float = 30.0, sleep: Callable[[float], None] = time.sleep,
               clock: Callable[[], float] = time.monotonic) -> Deployment:
    previous = store.load(plan.endpoint)
    if previous is not None and (previous.model_data_url, previous.instance_type, previous.mode) != (
            plan.model_data_url, plan.instance_type, plan.mode):
        raise DeployError(
            f"{store.path(plan.endpoint)} records endpoint {plan.endpoint} for {previous.model_data_url} on "
            f"{previous.instance_type} ({previous.mode}); delete it first (mme delete --endpoint {plan.endpoint}) or choose another --name"
        )
    tracker = DeploymentTracker(store, (previous or plan.new_state()).with_status("deploying"))
    reporter.info(f"==> deploying {plan.endpoint} ({plan.instance_type}, {plan.mode}-model) in {plan.region}; state in {plan.state_path}")
    try:
        for resource in CREATION_ORDER:
            _ensure(sm, resource, plan, tracker, reporter)
        if not wait:
            tracker.status("Creating")
            return tracker.deployment
        try:
            wait_for_endpoint(sm, plan.endpoint, timeout_s, poll_s, reporter, sleep, clock)
        except EndpointFailed as exc:
            tracker.status("Failed", str(exc))
            raise
        except WaitTimeout:
            tracker.status("Creating")
            raise
        tracker.status("InService")
        return tracker.deployment
    except KeyboardInterrupt:
        tracker.status("interrupted")
        raise Interrupted(
            f"interrupted; what may have been created is listed in {store.path(plan.endpoint)}: remove it with "
            f"'mme delete --endpoint {plan.endpoint}' or run the same mme deploy again to carry on"
        ) from None
