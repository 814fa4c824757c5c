"""The three SageMaker resources of a deployment, one typed record each: the calls that
describe, create and delete it, the parameter that names it, the fields that must match
for an existing one to be kept, and the permission each call needs.

``mme deploy`` (``endpoint``) and ``mme delete`` (``delete``) both read this table, so a
resource's calls and wording are written once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from mme.aws.errors import DeployError
from mme.aws.session import aws_errors, explain, is_not_found


def _whole(reply: dict) -> dict:
    return reply


def _container(reply: dict) -> dict:
    return reply.get("PrimaryContainer") or (reply.get("Containers") or [{}])[0]


def _first_variant(reply: dict) -> dict:
    return (reply.get("ProductionVariants") or [{}])[0]


@dataclass(frozen=True)
class SageMakerResource:
    kind: str  # as the state file names it: "model" | "endpoint-config" | "endpoint"
    label: str  # as messages name it: "model" | "endpoint config" | "endpoint"
    name_param: str  # ModelName | EndpointConfigName | EndpointName
    describe: str  # boto3 method names
    create: str
    delete: str
    create_permission: str
    delete_permission: str
    compared: tuple[str, ...]  # fields of part() that an existing resource must share with the request
    part: Callable[[dict], dict] = _whole  # where they are, in a Describe* reply and in the Create* request
    created_note: str = "created"  # the progress line once the Create* call returned

    def what(self, name: str) -> str:
        return f"{self.label} {name}"

    def conflicts(self, existing: dict, request: dict) -> tuple[str, Any, Any] | None:
        """The first compared field whose value differs: (field, found, wanted); None when all match."""
        found, wanted = self.part(existing), self.part(request)
        for key in self.compared:
            if found.get(key) != wanted.get(key):
                return key, found.get(key), wanted.get(key)
        return None


MODEL = SageMakerResource(
    "model", "model", "ModelName", "describe_model", "create_model", "delete_model",
    "sagemaker:CreateModel and iam:PassRole on the role", "sagemaker:DeleteModel",
    ("ModelDataUrl", "Image", "Mode"), _container,
)
ENDPOINT_CONFIG = SageMakerResource(
    "endpoint-config", "endpoint config", "EndpointConfigName", "describe_endpoint_config", "create_endpoint_config",
    "delete_endpoint_config", "sagemaker:CreateEndpointConfig", "sagemaker:DeleteEndpointConfig",
    ("ModelName", "InstanceType", "InferenceAmiVersion"), _first_variant,
)
ENDPOINT = SageMakerResource(
    "endpoint", "endpoint", "EndpointName", "describe_endpoint", "create_endpoint", "delete_endpoint",
    "sagemaker:CreateEndpoint", "sagemaker:DeleteEndpoint", ("EndpointConfigName",),
    created_note="creation started (GPU endpoints usually take 5-15 minutes)",
)
CREATION_ORDER = (MODEL, ENDPOINT_CONFIG, ENDPOINT)
BY_KIND = {r.kind: r for r in CREATION_ORDER}


def describe(sm: Any, resource: SageMakerResource, name: str) -> dict | None:
    """The Describe* reply, or None when the resource does not exist."""
    try:
        return getattr(sm, resource.describe)(**{resource.name_param: name})
    except aws_errors() as exc:
        if is_not_found(exc):
            return None
        raise DeployError(explain(exc, "describe", resource.what(name), "sagemaker:Describe*")) from None


def create(sm: Any, resource: SageMakerResource, request: dict) -> dict:
    name = request[resource.name_param]
    try:
        return getattr(sm, resource.create)(**request)
    except aws_errors() as exc:
        raise DeployError(explain(exc, "create", resource.what(name), resource.create_permission)) from None
