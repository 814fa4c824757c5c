"""The one table of ``mme package`` options (packager/options.py): the command line, a catalogue's
TOML and the dataclasses agree on every option, and each setting has one name, one unit and one
list of choices across commands."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest

from mme.cli import build_parser
from mme.errors import UsageError
from mme.progress import Reporter
from packager.catalogue import load_catalogue
from packager.formats.base import ExportOptions
from packager.formats.gpu import PRECISIONS
from packager.model import ModelRequest
from packager.options import OPTIONS, command_line, option, request_from_args, request_from_values
from packager.registry import family_names
from packager.remote.plan import CompileRequest
from packager.request import PackageRequest
from packager.triton_options import TritonOptions

# a value other than the default for every catalogue key, as TOML writes it
NOT_DEFAULTS = {
    "formats": ["onnx", "cpu-local"], "family": "timm", "weights": "random", "image_size": 64, "seq_len": 32,
    "max_batch_size": 4, "opset": 17, "precision": "tf32", "hardware_compatible": True, "atol": 0.001, "rtol": 0.0,
    "dynamic_batching": False, "preferred_batch_sizes": [2, 4], "max_queue_delay_us": 50, "instance_count": 2,
    "instance_kind": "cpu", "warmup": True, "cpu_threads": 3, "workspace_mib": 2048, "triton_release": "25.09",
    "with_tokenizer": True, "seed": 7,
}


def package_parser() -> argparse.ArgumentParser:
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices["package"]


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["package", *argv])


def test_every_option_is_one_argument_of_mme_package_and_every_toml_key_one_flag():
    flags = {s for action in package_parser()._actions for s in action.option_strings}
    for row in OPTIONS:
        row_flags = [row.flag] if row.flag else [flag for _, flag, _ in row.consts]
        assert row_flags and set(row_flags) <= flags, row.name
        if row.key:  # the catalogue's key means what the flag means
            assert row.key == row.name
    keys = {row.key for row in OPTIONS if row.key}
    assert keys == set(NOT_DEFAULTS) | {"weights_path"}, "a key without a test value here, or one too many"
    assert [row.name for row in OPTIONS if not row.key] == ["out"]  # where artifacts go: the command line's


def test_the_dataclasses_defaults_are_the_tables():
    from_table = request_from_values("m", {})
    from_classes = PackageRequest(ModelRequest("m"), formats=from_table.formats, out=from_table.out)
    assert from_table == from_classes
    assert from_table.formats == ("torchscript", "onnx", "cpu-local") and from_table.out == Path("artifacts")
    assert ExportOptions() == from_table.export and TritonOptions() == from_table.triton
    # mme compile's workspace is the same setting, in the same unit, with the same default
    assert CompileRequest.__dataclass_fields__["workspace_mib"].default == option("workspace_mib").default


def test_the_command_line_a_catalogue_entry_and_the_defaults_agree(tmp_path):
    assert request_from_args(parse("m")) == request_from_values("m", {})
    (tmp_path / "c.toml").write_text('[[model]]\nname = "m"\n')
    (entry,) = load_catalogue(tmp_path / "c.toml").entries
    assert entry.request == request_from_values("m", {}) and entry.command_line == ("m",)


def test_every_catalogue_key_becomes_the_request_its_flag_makes(tmp_path):
    import tomli_w

    (tmp_path / "c.toml").write_text(tomli_w.dumps({"model": [{"name": "m", **NOT_DEFAULTS}]}))
    (entry,) = load_catalogue(tmp_path / "c.toml", tmp_path / "out").entries
    default = request_from_values("m", {})
    assert entry.request != default
    by_flags = request_from_args(parse(*entry.command_line, "--out", str(tmp_path / "out")))
    assert by_flags == entry.request
    for name in NOT_DEFAULTS:  # each key moved its field off the default
        part, _, field = option(name).field.rpartition(".")
        got, was = (getattr(getattr(r, part) if part else r, field) for r in (entry.request, default))
        assert got != was, name
    assert entry.request.triton.instance_kind == "KIND_CPU" and entry.request.model.weights == "random"


@pytest.mark.parametrize("table, message", [
    ("max_batch_size = 0", "[[model]] 1 (m): max_batch_size must be a positive integer, got '0'"),
    ("rtol = -1.0", "[[model]] 1 (m): rtol must be a number of 0 or more, got '-1.0'"),
    ('precision = "int8"', 'precision must be one of "fp32", "tf32", "fp16" (got \'int8\')'),
    ('family = "keras"', 'family must be one of "huggingface", "timm" (got \'keras\')'),
    ('weights = "local"', '"auto", "pretrained" or "random" (weights_path = "DIR" for local weights)'),
    ("preferred_batch_sizes = [2, 0]", "preferred_batch_sizes must be a positive integer, got '0'"),
    ("dynamic_batching = 1", "dynamic_batching must be true or false (got 1)"),
    ('formats = "onnx,tflite"', "[[model]] 1 (m): formats: unknown format 'tflite'"),
    ("workspace_gib = 2.0\nworkspace_mib = 1024", "workspace_gib and workspace_mib set the same option"),
])
def test_a_bad_value_names_the_entry_and_the_key(tmp_path, table, message):
    (tmp_path / "c.toml").write_text(f'[[model]]\nname = "m"\n{table}\n')
    with pytest.raises(UsageError) as info:
        load_catalogue(tmp_path / "c.toml")
    assert message in str(info.value) and str(info.value).startswith(str(tmp_path / "c.toml"))


def test_the_old_workspace_in_gib_still_works_with_a_one_line_warning(tmp_path):
    stream = io.StringIO()
    request = request_from_args(parse("m", "--workspace-gib", "2"), Reporter(stream=stream))
    assert request.export.workspace_mib == 2048
    assert stream.getvalue() == "WARNING: --workspace-gib is deprecated; use --workspace-mib 2048\n"
    with pytest.raises(UsageError, match="not allowed with argument"):
        parse("m", "--workspace-gib", "2", "--workspace-mib", "1024")
    (tmp_path / "c.toml").write_text('[[model]]\nname = "m"\nworkspace_gib = 0.5\n')
    stream = io.StringIO()
    (entry,) = load_catalogue(tmp_path / "c.toml", reporter=Reporter(stream=stream)).entries
    assert entry.request.export.workspace_mib == 512 and entry.command_line == ("m", "--workspace-mib", "512")
    assert stream.getvalue().count("\n") == 1 and "workspace_gib is deprecated; use workspace_mib = 512" in stream.getvalue()
    assert command_line({"workspace_mib": 512}) == ("--workspace-mib", "512")


def test_precision_choices_and_the_workspace_are_one_definition_across_commands():
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))

    def action(command: list[str], flag: str) -> argparse.Action:
        parser = subparsers.choices[command[0]]
        for word in command[1:]:
            parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
        return next(a for a in parser._actions if flag in a.option_strings)

    for command in (["package"], ["compile"], ["gpu-check", "run"]):
        assert tuple(action(command, "--precision").choices or ()) == PRECISIONS, command
    package, compile_ = action(["package"], "--workspace-mib"), action(["compile"], "--workspace-mib")
    assert (package.default, package.type, package.help) == (compile_.default, compile_.type, compile_.help) == (
        4096, option("workspace_mib").kind.parse, "TensorRT builder workspace in MiB (default: 4096)")
    assert tuple(action(["package"], "--family").choices or ()) == tuple(family_names())
