"""The SageMaker Triton serving image (``sagemaker-tritonserver``) for a region and release.

URI: ``<account>.dkr.ecr.<region>.amazonaws.com[.cn]/<sagemaker_image>``, where
``sagemaker_image`` (``sagemaker-tritonserver:24.09-py3``) comes from ``mme/versions.toml``.
AWS publishes the image from different accounts depending on the release:

* 23.12 and later: the Deep Learning Containers registries, as the SageMaker Python SDK
  lists them (``src/sagemaker/image_uri_config/sagemaker-tritonserver.json``, releases
  23.12 to 24.09: the same table for each).
* earlier releases (the articles deployed 22.10): the per-region accounts of the
  SageMaker Triton example notebooks (their ``account_id_map``).

A region missing from the table, or any other image (a private copy in ECR), takes
``--image-uri``.
"""

from __future__ import annotations

import re

from mme.versions import Release, release as triton_release, sagemaker_releases
from mme.aws.errors import AwsError

DLC_ACCOUNTS = {
    "af-south-1": "626614931356",
    "ap-east-1": "871362719292",
    "ap-northeast-1": "763104351884",
    "ap-northeast-2": "763104351884",
    "ap-northeast-3": "364406365360",
    "ap-south-1": "763104351884",
    "ap-southeast-1": "763104351884",
    "ap-southeast-2": "763104351884",
    "ap-southeast-3": "907027046896",
    "ca-central-1": "763104351884",
    "ca-west-1": "204538143572",
    "cn-north-1": "727897471807",
    "cn-northwest-1": "727897471807",
    "eu-central-1": "763104351884",
    "eu-north-1": "763104351884",
    "eu-south-1": "692866216735",
    "eu-west-1": "763104351884",
    "eu-west-2": "763104351884",
    "eu-west-3": "763104351884",
    "il-central-1": "780543022126",
    "me-south-1": "217643126080",
    "sa-east-1": "763104351884",
    "us-east-1": "763104351884",
    "us-east-2": "763104351884",
    "us-west-1": "763104351884",
    "us-west-2": "763104351884",
}

LEGACY_ACCOUNTS = {
    "af-south-1": "774647643957",
    "ap-east-1": "110948597952",
    "ap-northeast-1": "941853720454",
    "ap-northeast-2": "151534178276",
    "ap-south-1": "763008648453",
    "ap-southeast-1": "324986816169",
    "ap-southeast-2": "355873309152",
    "ca-central-1": "464438896020",
    "cn-north-1": "472730292857",
    "cn-northwest-1": "474822919863",
    "eu-central-1": "746233611703",
    "eu-north-1": "601324751636",
    "eu-south-1": "966458181534",
    "eu-west-1": "802834080501",
    "eu-west-2": "205493899709",
    "eu-west-3": "254080097072",
    "me-south-1": "836785723513",
    "sa-east-1": "756306329178",
    "us-east-1": "785573368785",
    "us-east-2": "007439368137",
    "us-west-1": "710691900526",
    "us-west-2": "301217895009",
}

FIRST_DLC_RELEASE = (23, 12)
_RELEASE = re.compile(r"^(\d{2})\.(\d{2})$")
_IMAGE = re.compile(r"^\S{1,255}$")  # botocore ContainerImage: max 255, pattern [\S]+


def accounts_for(rel: Release) -> dict[str, str]:
    match = _RELEASE.match(rel.name)
    if match and (int(match[1]), int(match[2])) < FIRST_DLC_RELEASE:
        return LEGACY_ACCOUNTS
    return DLC_ACCOUNTS


def ecr_domain(region: str) -> str:
    return "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"


def triton_image_uri(region: str, release_name: str | None = None) -> str:
    """The SageMaker Triton image for ``region`` and a release of ``mme/versions.toml``."""
    rel = triton_release(release_name)
    account = accounts_for(rel).get(region)
    if account is None:
        raise AwsError(
            f"no {rel.sagemaker_image} image is known for region {region}; pass --image-uri with the image's ECR URI "
            f"(regions known: {', '.join(sorted(accounts_for(rel)))})"
        )
    return f"{account}.dkr.ecr.{region}.{ecr_domain(region)}/{rel.sagemaker_image}"


def check_image_uri(uri: str, option: str = "--image-uri") -> str:
    if not _IMAGE.match(uri) or "/" not in uri:
        raise AwsError(f"{option} {uri!r} is not a container image URI; write <account>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag>")
    return uri


def release_of_image(uri: str) -> Release | None:
    """The release whose SageMaker Triton image ``uri`` is (``.../sagemaker-tritonserver:25.09-py3``,
    any registry), or None: another image, or a release ``mme/versions.toml`` does not know."""
    repository_tag = uri.rsplit("/", 1)[-1]
    return next((r for r in sagemaker_releases() if r.sagemaker_image == repository_tag), None)
