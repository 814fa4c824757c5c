"""The options of ``mme package``: one table, :data:`OPTIONS`. Each row is one setting: the
request field it sets, its command-line flag, whether a catalogue entry takes it as a TOML key
(the row's name), how its values are read, its default, its help and its choices. Everything
else is read off the table:

* :func:`add_package_options` adds the ``mme package`` arguments;
* :func:`request_from_args` turns parsed arguments into a :class:`packager.request.PackageRequest`;
* :func:`request_from_toml` turns a catalogue entry's values into the same request, each error
  naming the entry and the key (no command line is built or parsed);
* :func:`command_line` writes a catalogue entry's values as the ``mme package`` arguments that mean
  the same, for people (the entry's log and progress line).

Defaults live here only; the dataclasses' own defaults agree (tests/packager/test_options.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from mme.argtypes import non_negative_float, non_negative_int, positive_float, positive_int
from mme.errors import UsageError
from mme.progress import Reporter
from packager.formats import FORMATS, parse_formats
from packager.formats.base import ExportOptions
from packager.formats.gpu import PRECISIONS
from packager.model import ModelRequest
from packager.option_kinds import Choice, Consts, Flag, Kind, LocalPath, Names, Number, Numbers, Switch
from packager.registry import family_names
from packager.request import PackageRequest
from packager.triton_options import TritonOptions

if TYPE_CHECKING:
    from packager.request import PackageRequest


@dataclass(frozen=True)
class Deprecated:
    """An old spelling of an option that still works, with a one-line warning."""

    name: str  # argparse dest and TOML key
    flag: str
    kind: Kind
    to_option: Callable[[Any], Any]  # its value -> the option's value
    help: str
    metavar: str | None = None


@dataclass(frozen=True)
class PackageOption:
    """One row of the table: one setting of ``mme package``."""

    name: str  # argparse dest and, where ``toml``, the catalogue's key
    field: str  # the PackageRequest field it sets: "formats", "model.image_size", "triton.max_batch_size"
    flag: str | None
    kind: Kind
    default: Any
    help: str
    toml: bool = True  # a catalogue entry may set it
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    to_field: Callable[[Any], Any] | None = None  # the option's value -> the field's (default: as is)
    group: str = ""  # options of the same group exclude each other
    consts: tuple[tuple[Any, str, str], ...] = ()  # Consts: (value, flag, help)
    toml_note: str = ""  # what a TOML error adds
    deprecated: Deprecated | None = None

    @property
    def key(self) -> str | None:
        return self.name if self.toml else None

    def help_text(self) -> str:
        shown = self.kind.cli_default(self.default)
        if "default:" in self.help or shown in (None, False, "", ()):
            return self.help
        return f"{self.help} (default: {'on' if shown is True else shown})"

    def field_value(self, value: Any) -> Any:
        return self.to_field(value) if self.to_field else value


_TEXT, _CHOICE, _FLAG, _PATH = Kind(), Choice(), Flag(), LocalPath()
_POSITIVE_INT, _COUNT = Number(positive_int, True), Number(non_negative_int, True)
_GIB = Number(positive_float, False)
_INSTANCE_KINDS = (("gpu", "KIND_GPU"), ("cpu", "KIND_CPU"))

OPTIONS: tuple[PackageOption, ...] = (
    PackageOption("formats", "formats", "--formats", Names(), "torchscript,onnx,cpu-local",
                  f"comma-separated: {', '.join(FORMATS)}, or 'all'", to_field=parse_formats),
    PackageOption("out", "out", "--out", _PATH, Path("artifacts"), "output root", toml=False),
    PackageOption("family", "family", "--family", _CHOICE, None, "force the model family",
                  choices=tuple(family_names())),
    PackageOption("weights", "model.weights", None, Consts(), "auto", "", group="weights", consts=(
        ("pretrained", "--pretrained", "require pretrained weights from the hub (default: use them when reachable)"),
        ("random", "--no-pretrained", "random weights, same architecture and size (benchmarks)")),
        toml_note=' (weights_path = "DIR" for local weights)'),
    PackageOption("weights_path", "model.weights_path", "--weights", _PATH, None,
                  "local checkpoint file, or a local Hugging Face model directory", metavar="PATH", group="weights"),
    PackageOption("image_size", "model.image_size", "--image-size", _POSITIVE_INT, None,
                  "square image side (default: the model's, usually 224)"),
    PackageOption("seq_len", "model.seq_len", "--seq-len", _POSITIVE_INT, None,
                  "max sequence length for text models (default: 128)"),
    PackageOption("max_batch_size", "triton.max_batch_size", "--max-batch-size", _POSITIVE_INT, 16,
                  "Triton max_batch_size"),
    PackageOption("opset", "export.opset", "--opset", _POSITIVE_INT, 18, "ONNX opset, 17 or newer"),
    PackageOption("precision", "export.precision", "--precision", _CHOICE, "fp32",
                  "precision of the TensorRT formats: fp32 (TF32 off), tf32 (matrix products in TF32 on Ampere+), "
                  "fp16", choices=PRECISIONS),
    PackageOption("hardware_compatible", "export.hardware_compatible", "--hardware-compatible", _FLAG, False,
                  "build TensorRT engines that load on every Ampere-or-newer GPU (compute capability 8.0+), not only "
                  "on this GPU's architecture; somewhat slower"),
    PackageOption("atol", "atol", "--atol", Number(positive_float, False), None,
                  "absolute validation tolerance: an output passes where |export - PyTorch| <= atol + rtol x "
                  "|PyTorch| (default: the family's, 1e-4; 1e-2 for tf32, 5e-2 for fp16 engines)"),
    PackageOption("rtol", "rtol", "--rtol", Number(non_negative_float, False), None,
                  "relative validation tolerance beside --atol, numpy.allclose's (default: 1e-3 for fp32, room for "
                  "large logits and another device's arithmetic; 1e-2 for tf32 and fp16 engines; 0: absolute only)"),
    PackageOption("dynamic_batching", "triton.dynamic_batching", "--dynamic-batching", Switch(), True,
                  "enable Triton's dynamic batcher"),
    PackageOption("preferred_batch_sizes", "triton.preferred_batch_sizes", "--preferred-batch-sizes", Numbers(), (),
                  "dynamic batcher preferred batch sizes (default: none)", metavar="N,N"),
    PackageOption("max_queue_delay_us", "triton.max_queue_delay_us", "--max-queue-delay-us", _COUNT, 100,
                  "dynamic batcher delay"),
    PackageOption("instance_count", "triton.instance_count", "--instance-count", _POSITIVE_INT, 1,
                  "model instances per GPU/CPU"),
    PackageOption("instance_kind", "triton.instance_kind", "--instance-kind", _CHOICE, None,
                  "override KIND_GPU / KIND_CPU", choices=tuple(k for k, _ in _INSTANCE_KINDS), to_field=lambda v: dict(_INSTANCE_KINDS).get(v)),
    PackageOption("warmup", "triton.warmup", "--warmup", _FLAG, False, "add a batch-1 model_warmup to config.pbtxt"),
    PackageOption("cpu_threads", "export.cpu_threads", "--cpu-threads", _COUNT, 2,
                  "ONNX Runtime intra-op threads in the cpu-local model (0 = all cores)"),
    PackageOption("workspace_mib", "export.workspace_mib", "--workspace-mib", _POSITIVE_INT, 4096,
                  "TensorRT builder workspace in MiB", metavar="MIB", group="workspace",
                  deprecated=Deprecated("workspace_gib", "--workspace-gib", _GIB, lambda gib: max(1, round(gib * 1024)),
                                        "deprecated: --workspace-mib, in GiB", "GIB")),
    PackageOption("triton_release", "triton_release", "--triton-release", _TEXT, None,
                  "serving release the artifacts target (default: mme/versions.toml's, the newest with a SageMaker "
                  "image; python -m mme.versions --list)"),
    PackageOption("with_tokenizer", "with_tokenizer", "--with-tokenizer", _FLAG, False,
                  "text models (BERT, DistilBERT): package a Triton ensemble of the model's WordPiece tokenizer and "
                  "the encoder, so requests send text (a BYTES tensor TEXT) instead of token ids"),
    PackageOption("seed", "model.seed", "--seed", _COUNT, 0, "seed for random weights and sample inputs"),
)


def option(name: str) -> PackageOption:
    return next(o for o in OPTIONS if o.name == name)


def add_package_options(parser: Any) -> None:
    """The table's arguments on ``parser`` (``mme package``'s)."""
    groups: dict[str, Any] = {}
    for row in OPTIONS:
        if row.group and row.group not in groups:
            groups[row.group] = parser.add_mutually_exclusive_group()
        target = groups[row.group] if row.group else parser
        row.kind.add(target, row)
        if row.deprecated:
            old = row.deprecated
            target.add_argument(old.flag, dest=old.name, type=old.kind.parse, metavar=old.metavar, help=old.help)


def add_option(parser: Any, name: str, **overrides: Any) -> None:
    """One row's argument on another command's parser (``mme compile --workspace-mib``)."""
    row = option(name)
    row.kind.add(parser, dataclasses.replace(row, group="", deprecated=None, **overrides))


def request_from_args(args: argparse.Namespace, reporter: Reporter | None = None) -> "PackageRequest":
    """The PackageRequest of parsed ``mme package`` arguments."""
    values = {row.name: getattr(args, row.name) for row in OPTIONS}
    for row in OPTIONS:
        old = row.deprecated
        if old and getattr(args, old.name, None) is not None:
            values[row.name] = old.to_option(getattr(args, old.name))
            (reporter or Reporter()).warn(f"{old.flag} is deprecated; use {row.flag} {values[row.name]}")
    return request_from_values(args.model, values)


def _toml_keys() -> dict[str, tuple[PackageOption, Kind, Callable[[Any], Any]]]:
    """TOML key -> (the option it sets, how its values are read, its value -> the option's)."""
    keys: dict[str, tuple[PackageOption, Kind, Callable[[Any], Any]]] = {}
    for row in OPTIONS:
        if row.key:
            keys[row.key] = (row, row.kind, lambda value: value)
        if row.deprecated:
            keys[row.deprecated.name] = (row, row.deprecated.kind, row.deprecated.to_option)
    return keys


def check_toml_keys(table: Iterable[str], where: str, also: Iterable[str] = ()) -> None:
    """UsageError naming ``where`` and the closest key for a key no option has."""
    known = set(_toml_keys()) | set(also)
    for key in table:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(sorted(known))}"
            raise UsageError(f"{where}: unknown key {key!r}{hint}")


def _read(key: str, value: Any, where: str) -> tuple[PackageOption, Any]:
    """The option a (known) TOML key sets and its value, checked as the command line checks it."""
    row, kind, to_option = _toml_keys()[key]
    try:
        read = to_option(kind.from_toml(row, value))
        row.field_value(read)  # what only the field's own check refuses (an unknown format)
    except TypeError as exc:
        raise UsageError(f"{where}: {key} must be {exc} (got {value!r})") from None
    except ValueError as exc:
        raise UsageError(f"{where}: {key} {exc}") from None
    except UsageError as exc:
        raise UsageError(f"{where}: {key}: {exc}") from None
    return row, read


def toml_values(table: Mapping[str, Any], where: str, reporter: Reporter | None = None) -> dict[str, Any]:
    """Option name -> value of a catalogue entry's TOML ``table``; UsageError names ``where`` and the key."""
    check_toml_keys(table, where)
    values: dict[str, Any] = {}
    groups: dict[str, str] = {}  # as on the command line, the options of a group exclude each other
    for key, value in table.items():
        row, read = _read(key, value, where)
        if key != row.key:  # a deprecated spelling
            if row.key in table:
                raise UsageError(f"{where}: {key} and {row.key} set the same option; keep {row.key} only")
            (reporter or Reporter()).warn(f"{where}: {key} is deprecated; use {row.key} = {read}")
        if row.group and read != row.default and groups.setdefault(row.group, key) != key:
            raise UsageError(f"{where}: {groups[row.group]} and {key} exclude each other; keep one")
        values[row.name] = read
    return values


def request_from_toml(name: str, table: Mapping[str, Any], out: Path, where: str,
                      reporter: Reporter | None = None) -> "PackageRequest":
    """The PackageRequest of a catalogue entry (``table``: its keys, merged over [defaults])."""
    return request_from_values(name, {**toml_values(table, where, reporter), "out": out})


def command_line(table: Mapping[str, Any]) -> tuple[str, ...]:
    """The ``mme package`` arguments that mean what a checked catalogue ``table`` means, in its order."""
    argv: list[str] = []
    for key, value in table.items():
        row, read = _read(key, value, "catalogue")
        argv += row.kind.argv(row, read)
    return tuple(argv)


def request_from_values(model: str, values: Mapping[str, Any]) -> "PackageRequest":
    """The request for ``model`` with ``values`` (option name -> value; the table's defaults for the rest)."""
    # Imported here, not at the top: packager.triton_config loads Triton's protobuf schema (grpc,
    # tritonclient), which the command line's parser, built for every mme command, does not need.
    parts: dict[str, dict[str, Any]] = {"": {}, "model": {"name": model}, "export": {}, "triton": {}}
    for row in OPTIONS:
        part, _, field = row.field.rpartition(".")
        parts[part][field] = row.field_value(values.get(row.name, row.default))
    if parts["model"]["weights_path"] is not None:
        parts["model"]["weights"] = "local"
    return PackageRequest(model=ModelRequest(**parts["model"]), export=ExportOptions(**parts["export"]),
                          triton=TritonOptions(**parts["triton"]), **parts[""])

