"""serving.models.extract: safe verification and unpacking of MME model tarballs."""

from __future__ import annotations

import gzip
import io
import os
import random
import tarfile
from pathlib import Path

import pytest

from mme.fsutil import sha256_of
from packager.manifest import Manifest
from mme.archive import (
    ArtifactTooLarge,
    CorruptArtifact,
    DiskBudget,
    ExceedsDiskBudget,
    ExtractLimits,
    TooManyMembers,
    UnsafeArtifact,
    safe_extract,
)
from serving.models.extract import InvalidModelLayout, extract_model_tarball
from tests.serving.models.store_helpers import CONFIG, ENSEMBLE_CONFIG, Member, Zeros, model_members, tree, write_tarball


def test_real_artifact_unpacks_to_one_model_directory(packaged_test_resnet, tmp_path: Path) -> None:
    dest = tmp_path / "cache" / "abc" / "model"
    result = extract_model_tarball(packaged_test_resnet.tarball, dest)

    assert result.root == dest
    assert result.layout == "model-dir"
    assert result.models == ("test_resnet",)
    assert result.sha256 == sha256_of(packaged_test_resnet.tarball)
    assert result.tarball_bytes == packaged_test_resnet.tarball.stat().st_size
    manifest = Manifest.load(packaged_test_resnet.directory)
    packaged = {f.path: f.sha256 for f in manifest.files if f.path.startswith("test_resnet/")}
    assert packaged, "the manifest lists the model directory's files"
    for rel, digest in packaged.items():
        assert sha256_of(dest / rel) == digest, rel
    assert result.total_bytes == sum(f.bytes for f in manifest.files if f.path.startswith("test_resnet/"))
    assert tree(dest.parent) == tree(dest.parent.parent / "abc")  # nothing but the model: no staging left
    assert [p.name for p in dest.parent.iterdir()] == ["model"]
    print(f"\nextract test_resnet ({result.tarball_bytes} B -> {result.total_bytes} B): {result.seconds * 1000:.1f} ms")


def test_tarball_made_like_mme_package_is_accepted(tiny_tarball: Path, tmp_path: Path) -> None:
    result = extract_model_tarball(tiny_tarball, tmp_path / "m")
    assert result.layout == "model-dir" and result.models == ("tiny",)
    assert (tmp_path / "m" / "tiny" / "config.pbtxt").read_text() == CONFIG


def test_root_config_is_moved_into_a_model_directory(make_tarball, tmp_path: Path) -> None:
    tarball = make_tarball([Member("config.pbtxt", CONFIG.encode()), Member("1", kind=tarfile.DIRTYPE),
                            Member("1/model.py", b"pass\n")])
    result = extract_model_tarball(tarball, tmp_path / "m")
    assert result.layout == "root-config" and result.models == ("model",)
    assert sorted(tree(tmp_path / "m")) == ["model", "model/1", "model/1/model.py", "model/config.pbtxt"]


def test_repeated_directory_entries_are_fine(make_tarball, tmp_path: Path) -> None:
    members = model_members() + [Member("tiny/", kind=tarfile.DIRTYPE), Member("tiny/1", kind=tarfile.DIRTYPE)]
    assert extract_model_tarball(make_tarball(members), tmp_path / "m").models == ("tiny",)


def test_dot_prefixed_members_are_fine(make_tarball, tmp_path: Path) -> None:
    members = [Member(".", kind=tarfile.DIRTYPE)] + [Member(f"./{m.name}", m.data, m.kind) for m in model_members()]
    result = extract_model_tarball(make_tarball(members), tmp_path / "m")
    assert result.models == ("tiny",)


def test_ensemble_with_its_steps_is_accepted(make_tarball, tmp_path: Path) -> None:
    members = model_members("pre") + model_members("net") + model_members("pipeline", ENSEMBLE_CONFIG)
    result = extract_model_tarball(make_tarball(members), tmp_path / "m")
    assert result.layout == "ensemble"
    assert result.models == ("pipeline", "net", "pre")


def test_existing_destination_is_replaced_only_on_success(make_tarball, tmp_path: Path) -> None:
    dest = tmp_path / "m"
    extract_model_tarball(make_tarball(model_members("old")), dest)
    with pytest.raises(CorruptArtifact):
        extract_model_tarball(make_tarball([Member("x")], compress=False), dest)
    assert tree(dest) == ["old", "old/1", "old/1/model.py", "old/config.pbtxt"]
    extract_model_tarball(make_tarball(model_members("new")), dest)
    assert tree(dest) == ["new", "new/1", "new/1/model.py", "new/config.pbtxt"]
    assert tree(tmp_path) == ["m", "m/new", "m/new/1", "m/new/1/model.py", "m/new/config.pbtxt", "tarballs",
                              "tarballs/t0.tar.gz", "tarballs/t1.tar.gz", "tarballs/t2.tar.gz"]


def _bad_cases(real: Path | None = None) -> dict[str, tuple[list[Member], type[Exception], str]]:
    good = model_members()
    return {
        "traversal": (good + [Member("../evil.txt", b"x")], UnsafeArtifact, "'..'"),
        "nested-traversal": (good + [Member("tiny/../../evil.txt", b"x")], UnsafeArtifact, "'..'"),
        "absolute": (good + [Member("/tmp/evil-mme-test.txt", b"x")], UnsafeArtifact, "absolute"),
        "symlink-escape": (good + [Member("tiny/1/link", kind=tarfile.SYMTYPE, linkname="../../../etc/passwd")], UnsafeArtifact, "symlink"),
        "symlink-absolute": (good + [Member("tiny/1/link", kind=tarfile.SYMTYPE, linkname="/etc/passwd")], UnsafeArtifact, "symlink"),
        "symlink-inside": (good + [Member("tiny/1/link", kind=tarfile.SYMTYPE, linkname="model.py")], UnsafeArtifact, "symlink"),
        "hardlink-absolute": (good + [Member("tiny/1/hard", kind=tarfile.LNKTYPE, linkname="/etc/passwd")], UnsafeArtifact, "hard link"),
        "hardlink-escape": (good + [Member("tiny/1/hard", kind=tarfile.LNKTYPE, linkname="../outside")], UnsafeArtifact, "hard link"),
        "char-device": (good + [Member("tiny/1/dev", kind=tarfile.CHRTYPE)], UnsafeArtifact, "device"),
        "block-device": (good + [Member("tiny/1/dev", kind=tarfile.BLKTYPE)], UnsafeArtifact, "device"),
        "fifo": (good + [Member("tiny/1/fifo", kind=tarfile.FIFOTYPE)], UnsafeArtifact, "FIFO"),
        "duplicate": (good + [Member("tiny/1/model.py", b"again")], UnsafeArtifact, "twice"),
        "file-then-dir": (good + [Member("tiny/1/model.py/x", b"x")], UnsafeArtifact, "not a directory"),
        "dir-then-file": (good + [Member("tiny/1", b"x")], UnsafeArtifact, "twice"),
        "bomb-header": (good + [Member("tiny/1/huge.bin", b"", size=100 * 1024**3)], ArtifactTooLarge, "max_total_bytes"),
        "missing-config": ([Member("tiny", kind=tarfile.DIRTYPE), Member("tiny/1/model.py", b"x")], InvalidModelLayout, "config.pbtxt"),
        "no-model-at-all": ([Member("README.md", b"hello")], InvalidModelLayout, "no config.pbtxt"),
        "bad-config": (model_members(config="platform: [not valid\n"), InvalidModelLayout, "not a valid Triton model config"),
        "unknown-config-field": (model_members(config="no_such_field: 1\n"), InvalidModelLayout, "not a valid Triton model config"),
        "two-models": (model_members("a") + model_members("b"), InvalidModelLayout, "one ensemble"),
        "ensemble-missing-step": (model_members("pre") + model_members("pipeline", ENSEMBLE_CONFIG), InvalidModelLayout, "net"),
        "empty": ([], CorruptArtifact, ""),
    }


@pytest.mark.parametrize("case", sorted(_bad_cases()))
def test_bad_tarball_is_refused_and_leaves_nothing(case: str, make_tarball, tmp_path: Path) -> None:
    members, error, words = _bad_cases()[case]
    tarball = make_tarball(members)
    cache = tmp_path / "cache"
    with pytest.raises(error, match=None) as info:
        extract_model_tarball(tarball, cache / "key" / "model")
    assert words in str(info.value)
    assert tarball.name in str(info.value)
    assert "\n" not in str(info.value)
    assert tree(cache) == ["key"]  # the parent the cache made; no staging, no model
    assert not (tmp_path / "evil.txt").exists() and not Path("/tmp/evil-mme-test.txt").exists()
    assert not (tmp_path / "outside").exists()


def test_links_inside_the_model_can_be_allowed(make_tarball, tmp_path: Path) -> None:
    members = model_members() + [Member("tiny/1/link.py", kind=tarfile.SYMTYPE, linkname="model.py"),
                                 Member("tiny/1/hard.py", kind=tarfile.LNKTYPE, linkname="tiny/1/model.py")]
    dest = tmp_path / "m"
    extract_model_tarball(make_tarball(members), dest, ExtractLimits(allow_links=True))
    assert os.readlink(dest / "tiny/1/link.py") == "model.py"
    assert (dest / "tiny/1/hard.py").read_bytes() == (dest / "tiny/1/model.py").read_bytes()
    escaping = model_members() + [Member("tiny/1/link", kind=tarfile.SYMTYPE, linkname="../../..")]
    with pytest.raises(UnsafeArtifact, match="points outside"):
        extract_model_tarball(make_tarball(escaping), tmp_path / "n", ExtractLimits(allow_links=True))


def test_size_and_member_limits(make_tarball, tmp_path: Path) -> None:
    tarball = make_tarball(model_members() + [Member("tiny/1/weights.bin", b"\0" * 10_000)])
    with pytest.raises(ArtifactTooLarge, match="max_total_bytes"):
        extract_model_tarball(tarball, tmp_path / "a", ExtractLimits(max_total_bytes=5_000))
    with pytest.raises(TooManyMembers, match="more than 3 members"):
        extract_model_tarball(tarball, tmp_path / "b", ExtractLimits(max_members=3))
    assert extract_model_tarball(tarball, tmp_path / "c", ExtractLimits(max_total_bytes=20_000, max_members=5)).members == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c", "tarballs"]
    defaults = ExtractLimits()
    assert defaults.max_total_bytes >= 2 * 1024**3  # roberta-large fp32 ONNX is ~1.4 GB
    assert defaults.allow_links is False


def test_the_shared_extractor_unpacks_any_archive_within_the_limits(make_tarball, tmp_path: Path) -> None:
    """mme.archive.safe_extract, as a SageMaker job's output is pulled back (packager.remote.catalogue_jobs):
    no model layout required, the same limits, scaled per model the archive holds."""
    members = [Member("a", kind=tarfile.DIRTYPE), Member("a/x.bin", b"\0" * 10_000),
               Member("b/x.bin", kind=tarfile.LNKTYPE, linkname="a/x.bin")]
    done = safe_extract(make_tarball(members), tmp_path / "out", ExtractLimits(allow_links=True))
    assert (done.members, done.total_bytes) == (3, 10_000) and (tmp_path / "out/b/x.bin").stat().st_size == 10_000
    one = ExtractLimits(max_total_bytes=6_000, max_members=2)
    with pytest.raises(ArtifactTooLarge, match="max_total_bytes"):
        safe_extract(make_tarball(members[:2]), tmp_path / "small", one)
    assert safe_extract(make_tarball(members[:2]), tmp_path / "twice", one.times(2)).total_bytes == 10_000
    with pytest.raises(UnsafeArtifact, match="hard link"):
        safe_extract(make_tarball(members), tmp_path / "nolinks")


def test_truncated_and_garbage_tarballs_are_corrupt(packaged_test_resnet, tmp_path: Path) -> None:
    data = packaged_test_resnet.tarball.read_bytes()
    cases = {
        "truncated-half.tar.gz": data[: len(data) // 2],
        "truncated-trailer.tar.gz": data[:-4],  # only the gzip length/CRC trailer is missing
        "bad-crc.tar.gz": data[:-8] + bytes(b ^ 0xFF for b in data[-8:-4]) + data[-4:],
        "random.tar.gz": os.urandom(4096),
        "gzip-magic-random.tar.gz": b"\x1f\x8b\x08\x00" + os.urandom(4096),
        "gzip-not-tar.tar.gz": gzip.compress(os.urandom(4096)),
        "plain-tar.tar.gz": write_tarball(tmp_path / "plain.tar", model_members(), compress=False).read_bytes(),
        "trailing-garbage.tar.gz": data + b"garbage that is not gzip",
        "empty-file.tar.gz": b"",
    }
    for name, payload in cases.items():
        tarball = tmp_path / name
        tarball.write_bytes(payload)
        with pytest.raises(CorruptArtifact) as info:
            extract_model_tarball(tarball, tmp_path / "cache" / "model")
        assert name in str(info.value), name
        assert not (tmp_path / "cache").exists() or tree(tmp_path / "cache") == [], name


def test_a_gzip_bomb_under_the_size_cap_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """300 MiB of zeros compress to about 0.3 MB (1,000x): the member's header declares its size,
    so the ratio bound stops it before a byte of it reaches the disk."""
    bomb = tmp_path / "bomb.tar.gz"
    size = 300 * 2**20
    with gzip.open(bomb, "wb", compresslevel=1) as gz, tarfile.open(fileobj=gz, mode="w|") as tar:
        for member in model_members():
            info = tarfile.TarInfo(member.name)
            info.type = member.kind
            if member.data is not None:
                info.size = len(member.data)
            tar.addfile(info, io.BytesIO(member.data or b""))
        info = tarfile.TarInfo("tiny/1/weights.bin")
        info.size = size
        tar.addfile(info, Zeros(size))
    assert bomb.stat().st_size < size / 100
    out = tmp_path / "out"
    with pytest.raises(ArtifactTooLarge, match="gzip bomb"):
        extract_model_tarball(bomb, out / "model")
    assert not out.exists() or tree(out) == []
    assert extract_model_tarball(bomb, tmp_path / "trusted", ExtractLimits(max_ratio=10_000)).total_bytes >= size


def test_extraction_stops_at_the_disk_budget_before_reading_the_rest(tmp_path: Path) -> None:
    """Ten incompressible 1 MiB files then a corrupt tail, with a 2.5 MiB budget: the third file's
    header passes the budget, so extraction stops there (ExceedsDiskBudget, not CorruptArtifact:
    the tail was never read) and nothing is left."""
    rng = random.Random(3)
    members = model_members() + [Member(f"tiny/1/w{i}.bin", rng.randbytes(2**20)) for i in range(10)]
    tarball = write_tarball(tmp_path / "big.tar.gz", members)
    tarball.write_bytes(tarball.read_bytes()[:-4096] + b"\xff" * 4096)  # a tail no gzip reader gets past
    with pytest.raises(CorruptArtifact):
        extract_model_tarball(tarball, tmp_path / "unbounded" / "model")
    out = tmp_path / "out"
    budget = DiskBudget(5 * 2**19, "the test's budget (raise it)")
    with pytest.raises(ExceedsDiskBudget, match=r"big\.tar\.gz unpacks to more than the 2,621,440 bytes the test's budget") as caught:
        extract_model_tarball(tarball, out / "model", budget=budget)
    assert caught.value.retryable is False
    assert not out.exists() or tree(out) == []
