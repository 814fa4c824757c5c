"""The SageMaker hosting API, answered locally: models, endpoint configurations and endpoints
as SageMaker keeps them, each endpoint a real local endpoint (``serving.cloud.hosting``).

Operations: CreateModel, DescribeModel, ListModels, DeleteModel; CreateEndpointConfig,
DescribeEndpointConfig, ListEndpointConfigs, DeleteEndpointConfig; CreateEndpoint,
DescribeEndpoint, ListEndpoints, UpdateEndpoint, DeleteEndpoint. Requests are checked against
botocore's service model first (``serving.cloud.api``). Status moves Creating -> InService or
Failed (with a FailureReason), Updating -> InService (the old runtime answers until the new one
does; a failed update leaves it and sets FailureReason), so boto3's ``endpoint_in_service`` and
``endpoint_deleted`` waiters work. DeleteEndpoint returns once the endpoint's servers are gone.

Errors are SageMaker's (ValidationException with its messages) for: a name that exists
("Cannot create already existing ..."), a model or configuration that does not ("Could not
find ..."), an update of an endpoint that is not InService, an image that is not a SageMaker
Triton image of a release ``mme/versions.toml`` knows, and an instance type whose GPU memory
``mme/instances.toml`` does not know (unless ``--memory-limit`` gives it). What is decided when
the endpoint starts ends it Failed, as on SageMaker: model data that cannot be downloaded or
loaded, and an image whose CUDA the instance's host driver cannot run (``mme.hosts``: the
family's default host, or the variant's InferenceAmiVersion).

moto, the S3 test server's project, models these operations too, but not closely enough to
stand in for them: it accepts duplicate names (overwriting), has no UpdateEndpoint, reports
every endpoint InService at once and refuses instance types newer than ml.g4dn (no ml.g5, g6
or p5), so this state is kept here.
"""

from __future__ import annotations

import datetime as dt
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from mme.aws.images import release_of_image
from mme.hosts import check_host
from mme.instances import memory_of_gpu
from mme.versions import Release, sagemaker_releases
from serving.cloud.api import ApiError, ApiRequest, validation
from serving.cloud.hosting import CloudOptions, Hosting, VariantRuntime
from serving.runtime.fleet_router import MAX_INSTANCES
from serving.triton.sagemaker_serve import MULTI, SINGLE

OPERATIONS = frozenset({
    "CreateModel", "DescribeModel", "ListModels", "DeleteModel",
    "CreateEndpointConfig", "DescribeEndpointConfig", "ListEndpointConfigs", "DeleteEndpointConfig",
    "CreateEndpoint", "DescribeEndpoint", "ListEndpoints", "UpdateEndpoint", "DeleteEndpoint",
})
PING_FAILED = ("The primary container for production variant {variant} did not pass the ping health check. "
               "Please check CloudWatch logs for this endpoint. ")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


@dataclass
class _Resource:
    name: str
    arn: str
    request: dict[str, Any]
    created: dt.datetime = field(default_factory=_now)


@dataclass
class _Endpoint(_Resource):
    config: str = ""
    status: str = "Creating"
    failure_reason: str | None = None
    modified: dt.datetime = field(default_factory=_now)
    generation: int = 0  # bumped by each create/update, so a late start cannot overwrite a newer state


class ControlPlane:
    """The hosting resources of one account, every region; thread-safe."""

    def __init__(self, options: CloudOptions, hosting: Hosting) -> None:
        self.options = options
        self.hosting = hosting
        self._lock = threading.Lock()
        self._models: dict[tuple[str, str], _Resource] = {}
        self._configs: dict[tuple[str, str], _Resource] = {}
        self._endpoints: dict[tuple[str, str], _Endpoint] = {}

    def handle(self, request: ApiRequest) -> dict[str, Any]:
        handler: Callable[[ApiRequest], dict[str, Any]] = getattr(self, "_" + _snake(request.operation))
        return handler(request)

    def arn(self, region: str, kind: str, name: str) -> str:
        return f"arn:aws:sagemaker:{region}:{self.options.account}:{kind}/{name.lower()}"

    def endpoint_status(self, region: str, name: str) -> str | None:
        with self._lock:
            endpoint = self._endpoints.get((region, name))
            return None if endpoint is None else endpoint.status

    def endpoints(self) -> list[tuple[str, str, str]]:
        """(region, endpoint, variant) of every endpoint InService."""
        with self._lock:
            found = [(r, e, self._configs.get((r, e_.config))) for (r, e), e_ in self._endpoints.items()
                     if e_.status in ("InService", "Updating")]
        return [(r, e, c.request["ProductionVariants"][0]["VariantName"] if c else "AllTraffic") for r, e, c in found]

    # --- models -------------------------------------------------------------------------------

    def _create_model(self, request: ApiRequest) -> dict[str, Any]:
        p, key = request.params, (request.region, request.params["ModelName"])
        containers = p.get("Containers") or ([p["PrimaryContainer"]] if "PrimaryContainer" in p else [])
        if len(containers) != 1:
            raise validation("the local control plane runs one container per model (PrimaryContainer, or Containers "
                             "with one entry); inference pipelines are not emulated")
        container = containers[0]
        _release_of(container.get("Image", ""))
        if not container.get("ModelDataUrl"):
            raise validation("the local control plane needs the container's ModelDataUrl (s3://bucket/prefix/ for "
                             "MultiModel, s3://bucket/key.tar.gz for SingleModel): models baked into an image are not emulated")
        with self._lock:
            if key in self._models:
                raise validation(f'Cannot create already existing model "{self.arn(request.region, "model", key[1])}".')
            resource = _Resource(key[1], self.arn(request.region, "model", key[1]), p)
            self._models[key] = resource
        return {"ModelArn": resource.arn}

    def _describe_model(self, request: ApiRequest) -> dict[str, Any]:
        model = self._find(self._models, request.region, request.params["ModelName"], "model", "model")
        p = model.request
        reply = {"ModelName": model.name, "ModelArn": model.arn, "CreationTime": model.created,
                 "ExecutionRoleArn": p.get("ExecutionRoleArn"), "EnableNetworkIsolation": p.get("EnableNetworkIsolation", False)}
        reply.update({k: p[k] for k in ("PrimaryContainer", "Containers", "VpcConfig", "InferenceExecutionConfig") if k in p})
        return reply

    def _list_models(self, request: ApiRequest) -> dict[str, Any]:
        rows = [{"ModelName": m.name, "ModelArn": m.arn, "CreationTime": m.created}
                for m in self._in_region(self._models, request.region)]
        return _page(rows, request.params, "Models", "ModelName")

    def _delete_model(self, request: ApiRequest) -> dict[str, Any]:
        self._remove(self._models, request.region, request.params["ModelName"], "model", "model")
        return {}

    # --- endpoint configurations -------------------------------------------------------------

    def _create_endpoint_config(self, request: ApiRequest) -> dict[str, Any]:
        p, key = request.params, (request.region, request.params["EndpointConfigName"])
        for variant in p["ProductionVariants"]:
            self._find(self._models, request.region, variant["ModelName"], "model", "model")
            if "InstanceType" not in variant:
                raise validation(f"production variant {variant['VariantName']}: serverless endpoints are not emulated; "
                                 "give InstanceType and InitialInstanceCount")
            self._memory_of(variant["InstanceType"])
            count = variant.get("InitialInstanceCount", 1)
            if count > MAX_INSTANCES:
                raise ApiError("ResourceLimitExceeded", f"production variant {variant['VariantName']} asks for {count} "
                               f"instances; the local control plane runs at most {MAX_INSTANCES} per endpoint")
        with self._lock:
            if key in self._configs:
                raise validation("Cannot create already existing endpoint configuration "
                                 f'"{self.arn(request.region, "endpoint-config", key[1])}".')
            resource = _Resource(key[1], self.arn(request.region, "endpoint-config", key[1]), p)
            self._configs[key] = resource
        return {"EndpointConfigArn": resource.arn}

    def _describe_endpoint_config(self, request: ApiRequest) -> dict[str, Any]:
        config = self._find(self._configs, request.region, request.params["EndpointConfigName"], "endpoint-config",
                            "endpoint configuration")
        variants = [{"InitialVariantWeight": 1.0, **v} for v in config.request["ProductionVariants"]]
        return {"EndpointConfigName": config.name, "EndpointConfigArn": config.arn, "ProductionVariants": variants,
                "CreationTime": config.created}

    def _list_endpoint_configs(self, request: ApiRequest) -> dict[str, Any]:
        rows = [{"EndpointConfigName": c.name, "EndpointConfigArn": c.arn, "CreationTime": c.created}
                for c in self._in_region(self._configs, request.region)]
        return _page(rows, request.params, "EndpointConfigs", "EndpointConfigName")

    def _delete_endpoint_config(self, request: ApiRequest) -> dict[str, Any]:
        self._remove(self._configs, request.region, request.params["EndpointConfigName"], "endpoint-config",
                     "endpoint configuration")
        return {}

    # --- endpoints -------------------------------------------------------------------------------

    def _create_endpoint(self, request: ApiRequest) -> dict[str, Any]:
        p, region, name = request.params, request.region, request.params["EndpointName"]
        spec = self._runtime_for(region, name, p["EndpointConfigName"])
        with self._lock:
            if (region, name) in self._endpoints:
                raise validation(f'Cannot create already existing endpoint "{self.arn(region, "endpoint", name)}".')
            endpoint = _Endpoint(name, self.arn(region, "endpoint", name), p, config=p["EndpointConfigName"])
            self._endpoints[(region, name)] = endpoint
            generation = endpoint.generation
        self._launch(spec, generation, update=False)
        return {"EndpointArn": endpoint.arn}

    def _update_endpoint(self, request: ApiRequest) -> dict[str, Any]:
        p, region, name = request.params, request.region, request.params["EndpointName"]
        endpoint = self._find(self._endpoints, region, name, "endpoint", "endpoint")
        spec = self._runtime_for(region, name, p["EndpointConfigName"])
        with self._lock:
            if endpoint.status != "InService":
                raise validation(f'Cannot update in-progress endpoint "{endpoint.arn}".')
            endpoint.status, endpoint.modified, endpoint.failure_reason = "Updating", _now(), None
            endpoint.generation += 1
            endpoint.request = {**endpoint.request, "PendingConfig": p["EndpointConfigName"]}
            generation = endpoint.generation
        self._launch(spec, generation, update=True)
        return {"EndpointArn": endpoint.arn}

    def _launch(self, spec: VariantRuntime, generation: int, *, update: bool) -> None:
        refusal = self._host_refusal(spec)
        if refusal is not None:
            self._finished(spec, generation, refusal, update)
            return
        self.hosting.start(spec, lambda reason: self._finished(spec, generation, reason, update))

    def _finished(self, spec: VariantRuntime, generation: int, reason: str | None, update: bool) -> bool:
        """A start ended (``reason`` None: answering). False when the endpoint is no longer wanted."""
        with self._lock:
            endpoint = self._endpoints.get((spec.region, spec.endpoint))
            if endpoint is None or endpoint.generation != generation:
                return False
            endpoint.modified = _now()
            endpoint.failure_reason = reason
            pending = endpoint.request.pop("PendingConfig", None)
            if reason is None and update and pending:
                endpoint.config = pending
            endpoint.status = "InService" if reason is None or update else "Failed"
            return True

    def _describe_endpoint(self, request: ApiRequest) -> dict[str, Any]:
        region = request.region
        endpoint = self._find(self._endpoints, region, request.params["EndpointName"], "endpoint", "endpoint")
        reply: dict[str, Any] = {
            "EndpointName": endpoint.name, "EndpointArn": endpoint.arn, "EndpointConfigName": endpoint.config,
            "EndpointStatus": endpoint.status, "FailureReason": endpoint.failure_reason,
            "CreationTime": endpoint.created, "LastModifiedTime": endpoint.modified,
        }
        if endpoint.status in ("InService", "Updating"):
            with self._lock:
                config = self._configs.get((region, endpoint.config))
                models = {v["ModelName"]: self._models.get((region, v["ModelName"])) for v in (config.request["ProductionVariants"] if config else [])}
            reply["ProductionVariants"] = [_variant_summary(v, models.get(v["ModelName"]))
                                           for v in (config.request["ProductionVariants"] if config else [])]
        return reply

    def _list_endpoints(self, request: ApiRequest) -> dict[str, Any]:
        status = request.params.get("StatusEquals")
        rows = [{"EndpointName": e.name, "EndpointArn": e.arn, "CreationTime": e.created, "LastModifiedTime": e.modified,
                 "EndpointStatus": e.status}
                for e in self._in_region(self._endpoints, request.region) if status in (None, e.status)]
        return _page(rows, request.params, "Endpoints", "EndpointName")

    def _delete_endpoint(self, request: ApiRequest) -> dict[str, Any]:
        region, name = request.region, request.params["EndpointName"]
        self._remove(self._endpoints, region, name, "endpoint", "endpoint")
        self.hosting.stop(region, name)  # the servers and their memory are gone when the reply is sent
        return {}

    # --- what an endpoint runs -------------------------------------------------------------------

    def _runtime_for(self, region: str, endpoint: str, config_name: str) -> VariantRuntime:
        config = self._find(self._configs, region, config_name, "endpoint-config", "endpoint configuration")
        variants = config.request["ProductionVariants"]
        if len(variants) != 1:
            raise validation(f"endpoint configuration {config_name} has {len(variants)} production variants; the local "
                             "control plane runs one per endpoint")
        variant = variants[0]
        model = self._find(self._models, region, variant["ModelName"], "model", "model")
        container = (model.request.get("Containers") or [model.request.get("PrimaryContainer")])[0]
        return VariantRuntime(
            endpoint=endpoint, variant=variant["VariantName"], instance_type=variant["InstanceType"],
            instance_count=variant.get("InitialInstanceCount", 1),
            mode=MULTI if container.get("Mode") == "MultiModel" else SINGLE, model_data_url=container["ModelDataUrl"],
            environment=dict(container.get("Environment") or {}), release=_release_of(container["Image"]),
            memory_limit_bytes=self._memory_of(variant["InstanceType"]), region=region,
        )

    def _memory_of(self, instance_type: str) -> int:
        if self.options.memory_limit_bytes is not None:
            return self.options.memory_limit_bytes
        known = memory_of_gpu(instance_type)
        if known is None:
            raise validation(f"the local control plane does not know the memory of {instance_type} (mme/instances.toml "
                             "knows the GPU types ml.g4dn, g5, g6, g6e, p3 and their families): start mme cloud with "
                             "--memory-limit, or use a GPU instance type")
        return known[0]

    def _host_refusal(self, spec: VariantRuntime) -> str | None:
        """Why the instance's host cannot start the image (its driver against the image's CUDA), or None."""
        with self._lock:
            endpoint = self._endpoints.get((spec.region, spec.endpoint))
            config = self._configs.get((spec.region, endpoint.request.get("PendingConfig", endpoint.config))) if endpoint else None
        ami = config.request["ProductionVariants"][0].get("InferenceAmiVersion") if config else None
        verdict = check_host(spec.release.cuda, spec.instance_type, ami, image=spec.release.sagemaker_image)
        cannot = verdict.starts is False if ami else (verdict.default is not None and not verdict.default.starts)
        if not cannot:
            return None
        why = verdict.reason if ami else verdict.default.reason  # type: ignore[union-attr]
        return PING_FAILED.format(variant=spec.variant) + f"(local control plane: {why})"

    # --- bookkeeping -----------------------------------------------------------------------------

    def _find(self, table: dict, region: str, name: str, kind: str, what: str) -> Any:
        with self._lock:
            found = table.get((region, name))
        if found is None:
            raise validation(f'Could not find {what} "{self.arn(region, kind, name)}".')
        return found

    def _remove(self, table: dict, region: str, name: str, kind: str, what: str) -> None:
        with self._lock:
            if table.pop((region, name), None) is None:
                raise validation(f'Could not find {what} "{self.arn(region, kind, name)}".')

    def _in_region(self, table: dict, region: str) -> list:
        with self._lock:
            return [r for (r_region, _), r in table.items() if r_region == region]


def _release_of(image: str) -> Release:
    release = release_of_image(image)
    if release is None:
        known = ", ".join(r.sagemaker_image for r in sagemaker_releases()[:4])
        raise validation(f"Image {image} is not a SageMaker Triton image of a release mme knows ({known}, ...); the local "
                         "control plane runs only those (mme.aws.images.triton_image_uri builds the URI)")
    return release


def _variant_summary(variant: dict, model: _Resource | None) -> dict[str, Any]:
    container = ((model.request.get("Containers") or [model.request.get("PrimaryContainer")])[0] if model else {}) or {}
    count = variant.get("InitialInstanceCount", 1)
    weight = variant.get("InitialVariantWeight", 1.0)
    return {"VariantName": variant["VariantName"], "CurrentWeight": weight, "DesiredWeight": weight,
            "CurrentInstanceCount": count, "DesiredInstanceCount": count,
            "DeployedImages": [{"SpecifiedImage": container.get("Image", "")}] if container else []}


def _page(rows: list[dict], params: dict, key: str, name_field: str) -> dict[str, Any]:
    """SageMaker's List* filters, sort and NextToken paging (the token is an offset)."""
    contains = (params.get("NameContains") or "").lower()
    rows = [r for r in rows if contains in r[name_field].lower()]
    for bound, keep in (("CreationTimeBefore", lambda t, b: t < b), ("CreationTimeAfter", lambda t, b: t > b)):
        if bound in params:
            limit = dt.datetime.fromtimestamp(params[bound], dt.timezone.utc)
            rows = [r for r in rows if keep(r["CreationTime"], limit)]
    sort_by = {"Name": name_field, "Status": "EndpointStatus"}.get(params.get("SortBy", ""), "CreationTime")
    rows.sort(key=lambda r: r.get(sort_by) or "", reverse=params.get("SortOrder", "Descending") == "Descending")
    start = int(params["NextToken"]) if str(params.get("NextToken", "")).isdigit() else 0
    size = int(params.get("MaxResults", 10))
    reply: dict[str, Any] = {key: rows[start:start + size]}
    if start + size < len(rows):
        reply["NextToken"] = str(start + size)
    return reply


def _snake(operation: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in operation).lstrip("_")
