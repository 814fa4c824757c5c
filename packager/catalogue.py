"""``mme package --catalogue FILE``: the catalogue file, read and checked.

The catalogue is TOML: a ``[defaults]`` table and one ``[[model]]`` table per entry, with
``mme package``'s options as keys (:data:`packager.options.OPTIONS`: ``formats``, ``image_size``,
``seq_len``, ``max_batch_size``, ``with_tokenizer``, ...)::

    [defaults]
    formats = ["onnx", "cpu-local"]
    weights = "random"

    [[model]]
    name = "resnet18"
    image_size = 160

Every entry becomes its typed :class:`packager.request.PackageRequest` here, each key checked as
``mme package`` checks the option, before anything runs; an error names the file, the entry and
the key. Running the entries is :mod:`packager.catalogue_run`'s; the summary
:mod:`packager.catalogue_summary`'s.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mme.errors import UsageError
from mme.progress import Reporter
from packager.layout import place_file
from packager.manifest import Manifest, is_artifact_directory
from packager.model import triton_model_name
from packager.options import check_toml_keys, command_line, option, request_from_toml
from packager.request import PackageRequest, request_fingerprint


@dataclass(frozen=True)
class CatalogueEntry:
    """One ``[[model]]`` of the catalogue, merged over ``[defaults]``, and its request."""

    index: int  # 1-based, in file order
    name: str
    options: dict[str, Any]  # its keys as the file gives them (weights_path made absolute)
    request: PackageRequest  # written under load_catalogue's ``out``

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", self.name.replace("/", "--")).strip(".-") or f"entry-{self.index}"

    @property
    def command_line(self) -> tuple[str, ...]:
        """The ``mme package`` arguments (less --out) that package it as the catalogue does: for people."""
        return (self.name, *command_line(self.options))


@dataclass(frozen=True)
class Catalogue:
    path: Path
    entries: tuple[CatalogueEntry, ...]


def load_catalogue(path: Path, out: Path | None = None, reporter: Reporter | None = None) -> Catalogue:
    """Read and check a catalogue whose artifacts go under ``out`` (default: ``--out``'s default);
    UsageError names the file, the entry and the fix."""
    out = option("out").default if out is None else out
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--catalogue {path}: no such file; write a TOML file with [defaults] and [[model]] tables "
                         "(see 'mme package --help')") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--catalogue {path}: cannot read it ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"--catalogue {path} is not valid TOML ({exc})") from None
    unknown = sorted(set(data) - {"defaults", "model"})
    if unknown:
        raise UsageError(f"{path}: unknown table {unknown[0]!r}; a catalogue has [defaults] and [[model]] tables")
    defaults = data.get("defaults", {})
    models = data.get("model", [])
    if not isinstance(defaults, dict) or not isinstance(models, list) or not all(isinstance(m, dict) for m in models):
        raise UsageError(f"{path}: [defaults] must be a table and each model a [[model]] table")
    if not models:
        raise UsageError(f"{path} lists no models; add [[model]] tables with name = \"...\"")
    check_toml_keys(defaults, f"{path}: [defaults]")
    entries: list[CatalogueEntry] = []
    seen: dict[str, int] = {}
    for index, table in enumerate(models, start=1):
        name = table.get("name")
        if not isinstance(name, str) or not name:
            raise UsageError(f"{path}: [[model]] {index} has no name; add name = \"resnet50\" (a timm or Hugging Face "
                             "name)")
        where = f"{path}: [[model]] {index} ({name})"
        check_toml_keys(table, where, also=("name",))
        options = {**defaults, **{k: v for k, v in table.items() if k != "name"}}
        if isinstance(options.get("weights_path"), str) and not Path(options["weights_path"]).is_absolute():
            options["weights_path"] = str((path.parent / options["weights_path"]).resolve())
        entry = CatalogueEntry(index, name, options, request_from_toml(name, options, out, where, reporter))
        if entry.slug in seen:
            raise UsageError(f"{where} packages {name} again (as [[model]] {seen[entry.slug]}); artifacts are "
                             "kept per model name: merge the two entries")
        seen[entry.slug] = index
        entries.append(entry)
    return Catalogue(path, tuple(entries))


def entry_request(entry: CatalogueEntry, out: Path) -> PackageRequest:
    """The PackageRequest of ``entry`` writing under ``out``."""
    return dataclasses.replace(entry.request, out=out)


def catalogue_artifacts(path: Path, out: Path, fmt: str | None) -> list[Path]:
    """The artifact directory of each entry of a packaged catalogue, checked to exist."""
    directories = []
    for entry in load_catalogue(path, out).entries:
        formats = entry.request.formats
        chosen = fmt or formats[0]
        if chosen not in formats:
            raise UsageError(f"[[model]] {entry.index} ({entry.name}) is not packaged as {chosen} "
                             f"(its formats: {', '.join(formats)}); drop --format or package it")
        directory = out / triton_model_name(entry.name) / chosen
        if not is_artifact_directory(directory):
            raise UsageError(f"{directory} is not packaged; run 'mme package --catalogue {path} --out {out}' first")
        directories.append(directory)
    return directories


def fleet_directory(directories: list[Path], into: Path) -> Path:
    """One directory holding every artifact's tarball (hard links where possible), as the S3
    prefix ``mme push --catalogue`` fills: what ``mme serve --catalogue`` serves."""
    into.mkdir(parents=True, exist_ok=True)
    for directory in directories:
        name = Manifest.load(directory).tarball
        place_file(directory / name, into / name)
    return into


LOGS_DIR = "catalogue-logs"  # each entry's request, result and log, under --out


def up_to_date(request: PackageRequest, out: Path) -> tuple[bool, str]:
    """Whether every format of ``request`` is packaged under ``out`` for the same options: (yes, why not)."""
    fingerprint = request_fingerprint(request)
    root = out / triton_model_name(request.model.name)
    for fmt in request.formats:
        directory = root / fmt
        if not is_artifact_directory(directory):
            return False, f"{fmt}: not packaged"
        try:
            manifest = Manifest.load(directory)
        except Exception as exc:  # an unreadable manifest is a reason to package again, not to stop
            return False, f"{fmt}: {exc}"
        if manifest.details.values.get("request_sha256") != fingerprint:
            return False, f"{fmt}: packaged with other options"
        if manifest.validation.passed is not True:
            return False, f"{fmt}: not validated"
        for entry in manifest.files:
            path = directory / entry.path
            if not path.is_file() or path.stat().st_size != entry.bytes:
                return False, f"{fmt}: {entry.path} missing or changed"
    return True, ""
