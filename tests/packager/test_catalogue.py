"""``mme package --catalogue``: a fleet packaged in parallel, resumable, one failure not stopping
the others, and a summary per entry."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from mme.cli import main
from packager.catalogue import load_catalogue
from tests.packager.conftest import load_manifest, run_cli

FLEET = ("test_resnet", "test_vit", "test_convnext", "test_efficientnet", "test_byobnet", "test_nfnet",
         "test_vit2", "test_convnext2")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return path


def fleet_toml(extra: str = "") -> str:
    models = "\n".join(f'[[model]]\nname = "{name}"\n' for name in FLEET)
    return f'[defaults]\nformats = ["onnx"]\nweights = "random"\nmax_batch_size = 2\n\n{models}\n{extra}'


@pytest.mark.parametrize("text, message", [
    ('[[model]]\nname = "test_resnet"\nimage_sise = 64\n', "[[model]] 1 (test_resnet): unknown key 'image_sise'; did you mean 'image_size'?"),
    ('[[model]]\nname = "test_resnet"\nimage_size = "big"\n', "image_size must be an integer (got 'big')"),
    ('[[model]]\nname = "test_resnet"\n[[model]]\nname = "test_resnet"\n', "packages test_resnet again"),
    ('[defaults]\nformats = ["onnx"]\n', "lists no models"),
    ('[[model]]\nimage_size = 64\n', "[[model]] 1 has no name"),
    ('[[model]]\nname = "test_resnet"\nformats = ["onxx"]\n', "[[model]] 1 (test_resnet): "),
    ('[modles]\nx = 1\n', "unknown table 'modles'"),
    ('[[model]\nname = "x"\n', "is not valid TOML"),
])
def test_a_bad_catalogue_is_one_line_and_nothing_is_written(tmp_path, capsys, text, message):
    out = tmp_path / "artifacts"
    code, _, err = run_cli(capsys, "package", "--catalogue", str(write(tmp_path, text)), "--out", str(out))
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], err
    assert not out.exists()


def test_entries_merge_over_defaults_and_relative_weights_resolve_next_to_the_file(tmp_path):
    catalogue = load_catalogue(write(tmp_path, '[defaults]\nformats = "onnx,cpu-local"\nseq_len = 64\n\n'
                                     '[[model]]\nname = "bert-base-uncased"\nseq_len = 32\nwith_tokenizer = true\n'
                                     'weights_path = "weights/bert"\n[[model]]\nname = "prajjwal1/bert-tiny"\n'
                                     'dynamic_batching = false\npreferred_batch_sizes = [2, 4]\n'))
    first, second = catalogue.entries
    assert first.command_line == ("bert-base-uncased", "--formats", "onnx,cpu-local", "--seq-len", "32", "--with-tokenizer",
                          "--weights", str((tmp_path / "weights" / "bert").resolve()))
    assert second.command_line == ("prajjwal1/bert-tiny", "--formats", "onnx,cpu-local", "--seq-len", "64",
                           "--no-dynamic-batching", "--preferred-batch-sizes", "2,4")
    assert second.slug == "prajjwal1--bert-tiny"


@pytest.mark.integration
def test_eight_models_package_with_two_jobs_then_resume_and_one_failure_does_not_stop_the_rest(tmp_path, capsys):
    out = tmp_path / "artifacts"
    broken = '[[model]]\nname = "test_vit3"\natol = 1e-30\n'  # validation cannot pass: fails in its own process
    typo = '[[model]]\nname = "test_resnett"\n'  # refused before anything runs
    path = write(tmp_path, fleet_toml(broken + typo))
    code = main(["-q", "package", "--catalogue", str(path), "--jobs", "2", "--out", str(out)])
    assert code == 2  # two entries failed
    summary = json.loads((out / "catalogue-summary.json").read_text())
    status = {e["name"]: e["status"] for e in summary["entries"]}
    assert [status[name] for name in FLEET] == ["packaged"] * len(FLEET)
    assert status["test_vit3"] == "failed" and status["test_resnett"] == "failed"
    errors = {e["name"]: e["error"] for e in summary["entries"]}
    assert "differs from PyTorch" in errors["test_vit3"] and "test_resnett" in errors["test_resnett"]
    assert Path(next(e["log"] for e in summary["entries"] if e["name"] == "test_vit3")).is_file()
    assert summary["counts"] == {"packaged": 8, "up to date": 0, "failed": 2} and summary["jobs"] == 2
    for entry in summary["entries"][:len(FLEET)]:
        (row,) = entry["formats"]
        assert row["format"] == "onnx" and row["tarball_mb"] > 0 and row["max_abs_diff"] < 1e-3
        assert {"load", "export", "validate", "tarball"} <= set(row["stages_s"]) and entry["peak_rss_mib"] > 100
        assert load_manifest(out / entry["name"] / "onnx").details.values["request_sha256"]
    with open(out / "catalogue-summary.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 10 and {r["status"] for r in rows} == {"packaged", "failed"}
    markdown = (out / "catalogue-summary.md").read_text()
    assert markdown.startswith("# Catalogue fleet.toml: 8 packaged, 0 up to date, 2 failed")
    tarball = out / "test_resnet" / "onnx" / "test_resnet.tar.gz"
    before = tarball.stat().st_mtime_ns

    # again, with one entry's options changed and the broken ones gone: only that one is packaged
    changed = fleet_toml().replace('name = "test_nfnet"\n', 'name = "test_nfnet"\nimage_size = 64\n')
    capsys.readouterr()
    code = main(["package", "--catalogue", str(write(tmp_path, changed)), "--jobs", "2", "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "catalogue-summary.json").read_text())
    status = {e["name"]: e["status"] for e in summary["entries"]}
    assert status.pop("test_nfnet") == "packaged" and set(status.values()) == {"up to date"}
    assert tarball.stat().st_mtime_ns == before
    assert "catalogue: 1 packaged, 7 up to date, 0 failed" in capsys.readouterr().out


def test_an_entry_sets_the_relative_tolerance_as_mme_package_does(tmp_path):
    from packager.catalogue import entry_request

    catalogue = load_catalogue(write(tmp_path, '[defaults]\nrtol = 0.01\n[[model]]\nname = "test_resnet"\n'
                                               '[[model]]\nname = "test_vit"\nrtol = 0\n'))
    first, second = catalogue.entries
    assert first.command_line[-2:] == ("--rtol", "0.01") and entry_request(first, tmp_path).rtol == 0.01
    assert entry_request(second, tmp_path).rtol == 0.0  # absolute only, by atol alone
