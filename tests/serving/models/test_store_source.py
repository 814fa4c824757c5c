"""serving.models.store: target-name validation, local directory and S3 (real moto server) sources."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mme.fsutil import sha256_of
from serving.models.store import (
    InvalidTargetName,
    LocalDirSource,
    S3Source,
    SourceUnavailable,
    TargetNotFound,
    source_from_uri,
    validate_target_name,
)

BUCKET = "mme-models"


@pytest.mark.parametrize("name", ["resnet50-v3.tar.gz", "a", "dir/sub/model-v1.tar.gz", "x" * 1024,
                                  "with space.tar.gz", "weird~!@#$%^&*()_+=[]{};:'\",<>?\\|.tar.gz"])
def test_valid_target_names(name: str) -> None:
    assert validate_target_name(name) == name


@pytest.mark.parametrize("name, words", [
    ("", "empty"),
    ("x" * 1025, "1025 characters"),
    (" leading-space.tar.gz", "printable ASCII"),
    ("tab\there.tar.gz", "printable ASCII"),
    ("new\nline", "printable ASCII"),
    ("caf\u00e9.tar.gz", "printable ASCII"),
    ("/abs/model.tar.gz", "starts with '/'"),
    ("../model.tar.gz", "'..'"),
    ("dir/../../model.tar.gz", "'..'"),
    ("dir/./model.tar.gz", "'.'"),
    ("dir//model.tar.gz", "empty"),
    ("dir/", "empty"),
    (None, "empty"),
])
def test_invalid_target_names(name, words: str) -> None:
    with pytest.raises(InvalidTargetName, match=None) as info:
        validate_target_name(name)
    assert words in str(info.value)
    assert "\n" not in str(info.value)


def test_local_source_lists_stats_and_downloads(tiny_tarball: Path, tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "team").mkdir(parents=True)
    for target in ("tiny-v1.tar.gz", "tiny-v2.tar.gz", "team/tiny-v3.tar.gz"):
        (root / target).write_bytes(tiny_tarball.read_bytes())
    source = source_from_uri(str(root))
    assert isinstance(source, LocalDirSource)
    listed = source.list_targets()
    assert [o.target for o in listed] == ["team/tiny-v3.tar.gz", "tiny-v1.tar.gz", "tiny-v2.tar.gz"]
    info = source.stat("team/tiny-v3.tar.gz")
    assert info.size == tiny_tarball.stat().st_size and info in listed
    dest = tmp_path / "dl.tar.gz"
    assert source.download("tiny-v1.tar.gz", dest) == source.stat("tiny-v1.tar.gz")
    assert sha256_of(dest) == sha256_of(tiny_tarball)
    with pytest.raises(TargetNotFound, match="no model 'nope.tar.gz'"):
        source.stat("nope.tar.gz")
    with pytest.raises(TargetNotFound):
        source.download("team", tmp_path / "x")  # a directory is not a model
    with pytest.raises(InvalidTargetName):
        source.stat("../models/tiny-v1.tar.gz")
    assert isinstance(source_from_uri(f"file://{root}"), LocalDirSource)


def test_source_uri_errors(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable, match="does not exist"):
        source_from_uri(str(tmp_path / "missing"))
    with pytest.raises(SourceUnavailable, match="unsupported model source"):
        source_from_uri("gs://bucket/models")
    with pytest.raises(SourceUnavailable, match="not a valid S3 bucket name"):
        source_from_uri("s3://Bad_Bucket/models")
    with pytest.raises(SourceUnavailable, match="only applies to s3://"):
        source_from_uri(str(tmp_path), endpoint_url="http://127.0.0.1:1")


def test_s3_uri_prefix_forms(aws_env) -> None:
    for uri, prefix in [("s3://bkt/models", "models/"), ("s3://bkt/models/", "models/"), ("s3://bkt", ""),
                        ("s3://bkt/", ""), ("s3://bkt/a/b/", "a/b/")]:
        source = source_from_uri(uri, endpoint_url="http://127.0.0.1:1")
        assert isinstance(source, S3Source) and source.bucket == "bkt" and source.prefix == prefix, uri


@pytest.fixture
def s3(moto_server, aws_env):
    import boto3

    client = boto3.client("s3", endpoint_url=moto_server.endpoint_url)
    existing = [b["Name"] for b in client.list_buckets().get("Buckets", [])]
    if BUCKET not in existing:
        client.create_bucket(Bucket=BUCKET)
    yield client
    for obj in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=obj["Key"])


def test_s3_source_against_moto_server(s3, moto_server, tiny_tarball: Path, tmp_path: Path) -> None:
    data = tiny_tarball.read_bytes()
    for key in ("mme/tiny-v1.tar.gz", "mme/tiny-v2.tar.gz", "mme/sub/tiny-v3.tar.gz", "other/ignored.tar.gz"):
        s3.put_object(Bucket=BUCKET, Key=key, Body=data)
    source = source_from_uri(f"s3://{BUCKET}/mme", endpoint_url=moto_server.endpoint_url)
    assert isinstance(source, S3Source)

    listed = source.list_targets()
    assert [o.target for o in listed] == ["sub/tiny-v3.tar.gz", "tiny-v1.tar.gz", "tiny-v2.tar.gz"]
    info = source.stat("tiny-v1.tar.gz")
    assert info.size == len(data) and info.location == f"s3://{BUCKET}/mme/tiny-v1.tar.gz"
    assert info.version and '"' not in info.version  # the ETag, unquoted

    dest = tmp_path / "dl.tar.gz"
    start = time.perf_counter()
    assert source.download("sub/tiny-v3.tar.gz", dest).size == len(data)
    print(f"\nmoto startup {moto_server.startup_seconds:.2f} s; S3 download of {len(data)} B {1000 * (time.perf_counter() - start):.1f} ms")
    assert dest.read_bytes() == data

    s3.put_object(Bucket=BUCKET, Key="mme/tiny-v1.tar.gz", Body=data + b"changed")
    assert source.stat("tiny-v1.tar.gz").version != info.version

    with pytest.raises(TargetNotFound, match=r"Failed to download model data\(bucket: mme-models, key: mme/nope.tar.gz\)"):
        source.stat("nope.tar.gz")
    with pytest.raises(TargetNotFound):
        source.download("nope.tar.gz", tmp_path / "nope")
    missing = source_from_uri("s3://no-such-bucket-here/mme", endpoint_url=moto_server.endpoint_url)
    with pytest.raises(SourceUnavailable, match="no-such-bucket-here does not exist"):
        missing.list_targets()


def test_s3_unreachable_is_source_unavailable(aws_env, tmp_path: Path) -> None:
    from tests.serving.models.store_helpers import free_port

    source = S3Source(BUCKET, "mme", endpoint_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(SourceUnavailable, match="cannot reach S3"):
        source.stat("tiny.tar.gz")


def test_copies_are_v0_to_n_minus_1_as_the_articles_locust_file_asks_for_them(tmp_path: Path) -> None:
    """`mme serve --copies 3` answers for resnet50-v0 ... -v2, the names the first article's
    notebook makes and its Locust file picks (-v{randint(0, N-1)}), and not for -v3."""
    from serving.models.copies import CopiesSource
    from serving.models.store import LocalDirSource, TargetNotFound

    (tmp_path / "resnet50.tar.gz").write_bytes(b"tarball")
    source = CopiesSource(LocalDirSource(tmp_path), 3)
    listed = sorted(info.target for info in source.list_targets())
    assert listed == ["resnet50-v0.tar.gz", "resnet50-v1.tar.gz", "resnet50-v2.tar.gz", "resnet50.tar.gz"]
    for i in range(3):
        assert source.stat(f"resnet50-v{i}.tar.gz").target == f"resnet50-v{i}.tar.gz"
    with pytest.raises(TargetNotFound):
        source.stat("resnet50-v3.tar.gz")
