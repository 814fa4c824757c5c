"""``mme delete``: remove what a deployment created, in order endpoint -> endpoint config ->
model, then (with ``--delete-s3``) the objects under its S3 prefix and its state file.

The names come from the state file when there is one, else from the endpoint's own
description, else from the names ``mme deploy`` gives. A resource that is already gone
counts as deleted, so the command is safe to run twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mme.aws.errors import AwsError, DeployError, S3Error
from mme.aws.session import S3Uri, aws_errors, explain, is_not_found, s3_fail
from mme.aws.state import KINDS, Deployment, DeploymentStore
from mme.progress import Reporter
from serving.deploy.resources import BY_KIND, ENDPOINT, ENDPOINT_CONFIG, describe


@dataclass(frozen=True)
class DeletePlan:
    endpoint: str
    region: str
    resources: tuple[tuple[str, str], ...]  # (kind, name) in deletion order
    s3_uri: str | None  # prefix (or object) to delete, when --delete-s3
    state_path: Path | None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def lines(self) -> list[str]:
        out = [f"delete plan for endpoint {self.endpoint} in {self.region}"]
        out += [f"  delete {kind} {name}" for kind, name in self.resources]
        if self.s3_uri:
            out.append(f"  delete every object under {self.s3_uri}")
        if self.state_path:
            out.append(f"  remove state file {self.state_path}")
        out += [f"  note: {n}" for n in self.notes]
        return out


def plan_delete(endpoint: str, sm: Any, region: str, deployment: Deployment | None, delete_s3: bool,
                s3_override: str | None, state_path: Path) -> DeletePlan:
    s3_uri = None
    if delete_s3:  # checked before any call
        s3_uri = s3_override or (deployment.s3_uri if deployment is not None else None)
        if s3_uri is None:
            raise DeployError(f"--delete-s3: no state file for {endpoint} records its S3 prefix; pass --s3 s3://bucket/prefix")
        uri = S3Uri.parse(s3_uri, "--s3" if s3_override else "the state file's s3_uri")
        if not uri.prefix:
            raise DeployError(f"--delete-s3 refuses to empty the whole bucket {uri.bucket}; the deployment's prefix must not be the bucket root")
        s3_uri = uri.url()
    notes: list[str] = []
    if deployment is not None:
        by_kind = {r.kind: r.name for r in deployment.resources}
        resources = tuple((kind, by_kind[kind]) for kind in KINDS if kind in by_kind)
    else:
        desc = describe(sm, ENDPOINT, endpoint)
        if desc is not None:
            config = desc["EndpointConfigName"]
            cfg = describe(sm, ENDPOINT_CONFIG, config)
            models = [v["ModelName"] for v in (cfg or {}).get("ProductionVariants", ()) if v.get("ModelName")]
            resources = (("endpoint", endpoint), ("endpoint-config", config)) + tuple(("model", m) for m in models)
        else:
            notes.append(f"no state file and no endpoint {endpoint}: trying the names mme deploy gives")
            resources = (("endpoint", endpoint), ("endpoint-config", f"{endpoint}-config"), ("model", f"{endpoint}-model"))
    return DeletePlan(endpoint, region, resources, s3_uri, state_path if deployment is not None else None, tuple(notes))


def delete_prefix(s3: Any, uri: S3Uri) -> int:
    """Delete every object under the prefix (and abort its pending multipart uploads)."""
    deleted = 0
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=uri.bucket, Prefix=uri.prefix):
            keys = [{"Key": obj["Key"]} for obj in page.get("Contents", ())]
            if not keys:
                continue
            reply = s3.delete_objects(Bucket=uri.bucket, Delete={"Objects": keys, "Quiet": True})
            errors = reply.get("Errors", ())
            if errors:
                first = errors[0]
                raise S3Error(
                    f"could not delete {len(errors)} objects under {uri} (first: {first.get('Key')}: {first.get('Code')}); "
                    "grant s3:DeleteObject on the prefix and run mme delete again"
                )
            deleted += len(keys)
        for upload in s3.list_multipart_uploads(Bucket=uri.bucket, Prefix=uri.prefix).get("Uploads", ()):
            s3.abort_multipart_upload(Bucket=uri.bucket, Key=upload["Key"], UploadId=upload["UploadId"])
    except aws_errors() as exc:
        raise s3_fail(exc, "delete objects under", uri.url(), "s3:ListBucket and s3:DeleteObject") from None
    return deleted


def run_delete(plan: DeletePlan, sm: Any, s3: Any | None, store: DeploymentStore, reporter: Reporter) -> dict[str, str]:
    """Delete each resource (a missing one counts as deleted), then the S3 prefix, then the state file."""
    outcome: dict[str, str] = {}
    deployment = store.load(plan.endpoint)
    for kind, name in plan.resources:
        resource = BY_KIND[kind]
        try:
            getattr(sm, resource.delete)(**{resource.name_param: name})
            outcome[f"{kind} {name}"] = "deleted"
            reporter.info(f"  {kind} {name}: deleted")
        except aws_errors() as exc:
            if not is_not_found(exc):
                raise DeployError(
                    explain(exc, "delete", f"{kind} {name}", resource.delete_permission)
                    + f"; then run mme delete --endpoint {plan.endpoint} again"
                ) from None
            outcome[f"{kind} {name}"] = "not found"
            reporter.info(f"  {kind} {name}: not found (already gone)")
        if deployment is not None and any(r.kind == kind for r in deployment.resources):
            deployment = deployment.with_resource(kind, "deleted")
            store.save(deployment)
    if plan.s3_uri:
        if s3 is None:
            raise AwsError("internal: --delete-s3 without an S3 client")
        count = delete_prefix(s3, S3Uri.parse(plan.s3_uri))
        outcome[plan.s3_uri] = f"{count} objects deleted"
        reporter.info(f"  {plan.s3_uri}: {count} objects deleted")
    if store.remove(plan.endpoint):
        reporter.info(f"  state file {store.path(plan.endpoint)}: removed")
    return outcome
