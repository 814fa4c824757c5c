"""State files: what a deployment (or a compile job) created, for ``mme delete`` and re-runs.

One JSON file per endpoint, ``.mme/deployments/<endpoint>.json``, replaced atomically.
``mme deploy`` writes a resource as ``requested`` *before* the create call that makes it,
and ``created`` after, so a Ctrl-C at any moment leaves a file that names everything that
might exist; ``mme delete`` deletes each named resource, tolerating the ones that never
came to be, then removes the file. No credentials are ever written here.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from mme.fsutil import write_json_atomic
from mme.aws.errors import AwsError

SCHEMA_VERSION = 1
DEFAULT_DEPLOYMENTS_DIR = Path(".mme/deployments")
DEFAULT_COMPILE_DIR = Path(".mme/compile")
KINDS = ("endpoint", "endpoint-config", "model")  # deletion order
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Resource:
    kind: str  # "model" | "endpoint-config" | "endpoint"
    name: str
    status: str  # "planned" | "requested" | "created" | "existing" | "deleted"


@dataclass(frozen=True)
class DeploymentSpec:
    """What a deployment is: the endpoint, where, and what it serves on which instances.
    A deploy plan carries it; the state file records it."""

    endpoint: str
    region: str
    mode: str  # "multi" | "single"
    s3_uri: str
    model_data_url: str
    instance_type: str
    image_uri: str

    def spec(self) -> dict[str, Any]:
        """These fields alone, by name (to build a Deployment from a plan)."""
        return {f.name: getattr(self, f.name) for f in fields(DeploymentSpec)}


@dataclass(frozen=True)
class Deployment(DeploymentSpec):
    resources: tuple[Resource, ...]
    status: str  # "deploying" | "interrupted" | "Creating" | "InService" | "Failed" | ...
    created_at: str
    updated_at: str
    failure_reason: str | None = None
    s3_endpoint_url: str | None = None
    schema_version: int = SCHEMA_VERSION

    def resource(self, kind: str) -> Resource:
        for res in self.resources:
            if res.kind == kind:
                return res
        raise KeyError(kind)

    def with_resource(self, kind: str, status: str) -> "Deployment":
        resources = tuple(replace(r, status=status) if r.kind == kind else r for r in self.resources)
        return replace(self, resources=resources, updated_at=now_iso())

    def with_status(self, status: str, failure_reason: str | None = None) -> "Deployment":
        return replace(self, status=status, failure_reason=failure_reason, updated_at=now_iso())

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["resources"] = [asdict(r) for r in self.resources]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Deployment":
        data = dict(data)
        data["resources"] = tuple(Resource(**r) for r in data.get("resources", ()))
        return cls(**data)


class StateDir:
    """JSON documents named by a resource name, written atomically."""

    def __init__(self, directory: Path, what: str = "deployment") -> None:
        self.directory = Path(directory)
        self.what = what

    def path(self, name: str) -> Path:
        if not _SAFE.match(name):
            raise AwsError(f"{name!r} cannot name a state file; use letters, digits, '.', '_' and '-'")
        return self.directory / f"{name}.json"

    def read(self, name: str) -> dict[str, Any] | None:
        path = self.path(name)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise AwsError(f"{path} is not valid JSON ({exc}); fix or remove it (it lists what a {self.what} created)") from None
        if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
            raise AwsError(f"{path} has an unknown schema version; this mme reads {SCHEMA_VERSION}")
        return data

    def write(self, name: str, data: dict[str, Any]) -> Path:
        path = self.path(name)
        try:
            write_json_atomic(path, data)
        except OSError as exc:
            raise AwsError(f"cannot write state file {path} ({exc.strerror}); pass a writable --state-dir") from None
        return path

    def remove(self, name: str) -> bool:
        try:
            self.path(name).unlink()
        except FileNotFoundError:
            return False
        return True


class DeploymentStore:
    """Deployment state files under ``directory`` (default ``.mme/deployments``)."""

    def __init__(self, directory: Path = DEFAULT_DEPLOYMENTS_DIR) -> None:
        self.directory = Path(directory)
        self._dir = StateDir(self.directory, "deployment")

    def path(self, endpoint: str) -> Path:
        return self._dir.path(endpoint)

    def load(self, endpoint: str) -> Deployment | None:
        data = self._dir.read(endpoint)
        if data is None:
            return None
        try:
            return Deployment.from_dict(data)
        except TypeError as exc:
            raise AwsError(f"{self.path(endpoint)} is not a deployment state file ({exc}); fix or remove it") from None

    def save(self, deployment: Deployment) -> Path:
        return self._dir.write(deployment.endpoint, deployment.to_dict())

    def remove(self, endpoint: str) -> bool:
        return self._dir.remove(endpoint)


class DeploymentTracker:
    """A deployment's state while a run changes it, saved on every change (so a Ctrl-C at any
    moment leaves a file naming everything that might exist)."""

    def __init__(self, store: DeploymentStore, deployment: Deployment) -> None:
        self.store = store
        self.deployment = deployment
        self.store.save(deployment)

    def mark(self, kind: str, status: str) -> None:
        self.deployment = self.deployment.with_resource(kind, status)
        self.store.save(self.deployment)

    def found(self, kind: str) -> None:
        """The resource exists: ours if a run of this deployment asked for it, else it was there before."""
        current = self.deployment.resource(kind).status
        if current in ("planned", "requested"):
            self.mark(kind, "existing" if current == "planned" else "created")

    def status(self, status: str, reason: str | None = None) -> None:
        self.deployment = self.deployment.with_status(status, reason)
        self.store.save(self.deployment)
