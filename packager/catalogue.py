"""``mme package --catalogue FILE``: package every model of a fleet, in parallel, resumably.

The catalogue is TOML: a ``[defaults]`` table and one ``[[model]]`` table per entry, with
``mme package``'s options as keys (``formats``, ``image_size``, ``seq_len``, ``max_batch_size``,
``with_tokenizer``, ...)::

    [defaults]
    formats = ["onnx", "cpu-local"]
    weights = "random"

    [[model]]
    name = "resnet18"
    image_size = 160

Every entry is checked (keys, types, and ``mme package``'s own argument parsing) before anything
runs. Each entry is then packaged by ``mme package`` in its own process (``--jobs N`` at once; a
job starts only while the memory the largest job so far needed is free), so one failing entry
does not stop the others and its log stays in ``<out>/catalogue-logs/``. An entry whose artifacts
are already there for the same options (the manifest's ``request_sha256``, every listed file
present at its recorded size, validation passed) is skipped. The summary is written as
``catalogue-summary.{json,csv,md}`` under ``--out``; the exit code is the number of entries that
failed (0: all packaged or up to date).
"""

from __future__ import annotations

import argparse
import csv
import difflib
import io
import os
import re
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from mme.errors import UsageError
from mme.fsutil import ensure_writable_dir, write_bytes_atomic, write_json_atomic
from mme.progress import Reporter

SUMMARY_SCHEMA_VERSION = 1
SUMMARY_NAME = "catalogue-summary"
LOGS_DIR = "catalogue-logs"
STAGES = ("load", "reference", "tokenizer", "export", "validate", "layout", "tarball")
MIN_FREE_BYTES = 1 << 30  # a job never starts with less than this available
POLL_S = 0.5
MAX_EXIT_CODE = 100


def _str(key: str, value: Any) -> list[str]:
    if not isinstance(value, str) or not value:
        raise TypeError("a non-empty string")
    return [key, value]


def _int(key: str, value: Any) -> list[str]:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("an integer")
    return [key, str(value)]


def _float(key: str, value: Any) -> list[str]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("a number")
    return [key, repr(float(value))]


def _flag(key: str, value: Any) -> list[str]:
    if not isinstance(value, bool):
        raise TypeError("true or false")
    return [key] if value else []


def _switch(key: str, value: Any) -> list[str]:
    if not isinstance(value, bool):
        raise TypeError("true or false")
    return [key if value else key.replace("--", "--no-", 1)]


def _names(key: str, value: Any) -> list[str]:
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",")]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise TypeError('a list of names, e.g. ["onnx", "cpu-local"]')
    return [key, ",".join(value)]


def _ints(key: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise TypeError("a list of integers, e.g. [4, 8]")
    return [key, ",".join(map(str, value))] if value else []


def _weights(key: str, value: Any) -> list[str]:
    choices = {"auto": [], "pretrained": ["--pretrained"], "random": ["--no-pretrained"]}
    if value not in choices:
        raise TypeError('"auto", "pretrained" or "random" (weights_path = "DIR" for local weights)')
    return choices[value]


# catalogue key -> (mme package option, how a TOML value becomes its arguments)
OPTIONS: dict[str, tuple[str, Callable[[str, Any], list[str]]]] = {
    "formats": ("--formats", _names),
    "family": ("--family", _str),
    "weights": ("", _weights),
    "weights_path": ("--weights", _str),
    "image_size": ("--image-size", _int),
    "seq_len": ("--seq-len", _int),
    "max_batch_size": ("--max-batch-size", _int),
    "opset": ("--opset", _int),
    "precision": ("--precision", _str),
    "hardware_compatible": ("--hardware-compatible", _flag),
    "atol": ("--atol", _float),
    "rtol": ("--rtol", _float),
    "dynamic_batching": ("--dynamic-batching", _switch),
    "preferred_batch_sizes": ("--preferred-batch-sizes", _ints),
    "max_queue_delay_us": ("--max-queue-delay-us", _int),
    "instance_count": ("--instance-count", _int),
    "instance_kind": ("--instance-kind", _str),
    "warmup": ("--warmup", _flag),
    "cpu_threads": ("--cpu-threads", _int),
    "workspace_gib": ("--workspace-gib", _float),
    "triton_release": ("--triton-release", _str),
    "seed": ("--seed", _int),
    "with_tokenizer": ("--with-tokenizer", _flag),
}


@dataclass(frozen=True)
class CatalogueEntry:
    """One ``[[model]]`` of the catalogue, merged over ``[defaults]``: its ``mme package`` arguments."""

    index: int  # 1-based, in file order
    name: str
    options: dict[str, Any]
    argv: tuple[str, ...]  # mme package's arguments, without --out

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", self.name.replace("/", "--")).strip(".-") or f"entry-{self.index}"


@dataclass(frozen=True)
class Catalogue:
    path: Path
    entries: tuple[CatalogueEntry, ...]


def load_catalogue(path: Path) -> Catalogue:
    """Read and check a catalogue; UsageError names the file, the entry and the fix."""
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
    _check_keys(path, "[defaults]", defaults, allow_name=False)
    entries: list[CatalogueEntry] = []
    seen: dict[str, int] = {}
    for index, table in enumerate(models, start=1):
        where = f"[[model]] {index}"
        name = table.get("name")
        if not isinstance(name, str) or not name:
            raise UsageError(f"{path}: {where} has no name; add name = \"resnet50\" (a timm or Hugging Face name)")
        where = f"[[model]] {index} ({name})"
        _check_keys(path, where, table, allow_name=True)
        options = {**defaults, **{k: v for k, v in table.items() if k != "name"}}
        if "weights_path" in options and not Path(options["weights_path"]).is_absolute():
            options["weights_path"] = str((path.parent / options["weights_path"]).resolve())
        argv = [name]
        for key, value in options.items():
            flag, convert = OPTIONS[key]
            try:
                argv += convert(flag, value)
            except TypeError as exc:
                raise UsageError(f"{path}: {where}: {key} must be {exc} (got {value!r})") from None
        entry = CatalogueEntry(index, name, options, tuple(argv))
        if entry.slug in seen:
            raise UsageError(f"{path}: {where} packages {name} again (as [[model]] {seen[entry.slug]}); artifacts are "
                             "kept per model name: merge the two entries")
        seen[entry.slug] = index
        entries.append(entry)
    return Catalogue(path, tuple(entries))


def _check_keys(path: Path, where: str, table: dict, allow_name: bool) -> None:
    known = set(OPTIONS) | ({"name"} if allow_name else set())
    for key in table:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(sorted(known))}"
            raise UsageError(f"{path}: {where}: unknown key {key!r}{hint}")


def entry_request(entry: CatalogueEntry, out: Path):
    """The PackageRequest ``mme package`` will build for ``entry`` (its arguments parsed as the
    command line parses them); UsageError names the entry."""
    from mme.cli import build_parser
    from packager.cli import request_from_args

    try:
        args = build_parser().parse_args(["package", *entry.argv, "--out", str(out)])
        return request_from_args(args)
    except UsageError as exc:
        raise UsageError(f"[[model]] {entry.index} ({entry.name}): {exc}") from None


# --- what is already there -------------------------------------------------------------


def up_to_date(request, out: Path) -> tuple[bool, str]:
    """Whether every format of ``request`` is packaged under ``out`` for the same options: (yes, why not)."""
    from packager.manifest import Manifest
    from packager.model import triton_model_name
    from packager.pipeline import request_fingerprint

    fingerprint = request_fingerprint(request)
    root = out / triton_model_name(request.model.name)
    for fmt in request.formats:
        directory = root / fmt
        if not (directory / "manifest.json").is_file():
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


# --- results ---------------------------------------------------------------------------


@dataclass
class EntryResult:
    entry: CatalogueEntry
    status: str = "pending"  # packaged | up to date | failed
    seconds: float = 0.0
    peak_rss_mib: float = 0.0
    error: str = ""
    log: str = ""
    formats: list[dict[str, Any]] = field(default_factory=list)
    job: str = ""  # the SageMaker training job that packaged it (--on sagemaker)

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.entry.index, "name": self.entry.name, "status": self.status,
                "options": dict(self.entry.options), "seconds": round(self.seconds, 2),
                "peak_rss_mib": round(self.peak_rss_mib, 1), "error": self.error, "log": self.log,
                "formats": self.formats, "job": self.job}


def format_rows(request, out: Path) -> list[dict[str, Any]]:
    """Per format of a packaged entry: tarball size, validation max diff and seconds per stage."""
    from packager.manifest import Manifest
    from packager.model import triton_model_name

    rows = []
    for fmt in request.formats:
        directory = out / triton_model_name(request.model.name) / fmt
        try:
            manifest = Manifest.load(directory)
        except Exception:  # a format the entry did not get to
            continue
        tarball = directory / manifest.tarball
        rows.append({"format": fmt, "directory": str(directory),
                     "tarball_mb": round(tarball.stat().st_size / 1e6, 2) if tarball.is_file() else None,
                     "max_abs_diff": manifest.validation.max_abs_diff, "weights": manifest.weights,
                     "parameters": manifest.parameters,
                     "stages_s": {s: manifest.timings_s[s] for s in STAGES if s in manifest.timings_s}})
    return rows


def write_summary(out: Path, catalogue: Catalogue, results: list[EntryResult], jobs: int, wall_s: float,
                  where: str = "local") -> list[Path]:
    counts = {s: sum(r.status == s for r in results) for s in ("packaged", "up to date", "failed")}
    document = {"schema_version": SUMMARY_SCHEMA_VERSION, "catalogue": str(catalogue.path), "out": str(out),
                "jobs": jobs, "where": where, "wall_s": round(wall_s, 2), "counts": counts,
                "entries": [r.to_dict() for r in results]}
    json_path = out / f"{SUMMARY_NAME}.json"
    write_json_atomic(json_path, document)
    header = ["index", "name", "status", "format", "tarball_mb", "max_abs_diff", *[f"{s}_s" for s in STAGES],
              "entry_seconds", "peak_rss_mib", "options", "error", "job"]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    md = [f"# Catalogue {catalogue.path.name}: {counts['packaged']} packaged, {counts['up to date']} up to date, "
          f"{counts['failed']} failed", "", f"{len(results)} entries, --jobs {jobs}, on {where}, {wall_s:.1f} s wall.", "",
          "| # | model | status | format | tarball MB | max abs diff | " + " | ".join(f"{s} s" for s in STAGES)
          + " | entry s | peak RSS MiB | options |", "|" + " --- |" * (10 + len(STAGES))]
    for r in results:
        options = " ".join(f"{k}={v}" for k, v in r.entry.options.items())
        for row in r.formats or [{"format": "", "tarball_mb": None, "max_abs_diff": None, "stages_s": {}}]:
            stages = [row["stages_s"].get(s, "") for s in STAGES]
            writer.writerow([r.entry.index, r.entry.name, r.status, row["format"], row["tarball_mb"],
                             row["max_abs_diff"], *stages, round(r.seconds, 2), round(r.peak_rss_mib, 1), options,
                             r.error, r.job])
            diff = "" if row["max_abs_diff"] is None else f"{row['max_abs_diff']:.2e}"
            status = r.status + (f" (job {r.job})" if r.job else "") + (f": {r.error}" if r.error else "")
            cells = [str(r.entry.index), r.entry.name, status, row["format"],
                     "" if row["tarball_mb"] is None else f"{row['tarball_mb']:.1f}", diff,
                     *[str(v) for v in stages], f"{r.seconds:.1f}", f"{r.peak_rss_mib:.0f}", options]
            md.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    csv_path, md_path = out / f"{SUMMARY_NAME}.csv", out / f"{SUMMARY_NAME}.md"
    write_bytes_atomic(csv_path, buffer.getvalue().encode())
    write_bytes_atomic(md_path, ("\n".join(md) + "\n").encode())
    return [json_path, csv_path, md_path]


# --- the run ----------------------------------------------------------------------------


@dataclass
class _Job:
    result: EntryResult
    process: subprocess.Popen
    log: Any
    started: float


def _tree_rss(process: subprocess.Popen) -> int:
    import psutil

    try:
        parent = psutil.Process(process.pid)
        members = [parent, *parent.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for member in members:
        try:
            total += member.memory_info().rss
        except psutil.Error:
            continue
    return total


def _last_error(log_path: Path) -> str:
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "no log"
    errors = [line for line in lines if line.startswith("mme: error:")]
    if errors:
        return errors[-1].removeprefix("mme: error:").strip()
    tail = [line.strip() for line in lines if line.strip()]
    return tail[-1][:300] if tail else "exited without a message"


def _refusal(request, build_here: bool = True) -> str:
    """Why ``mme package`` would refuse the entry before loading its model ('' when it would not);
    ``build_here=False``: on another host (a SageMaker job), whatever this one has."""
    from mme.errors import MmeError
    from packager.pipeline import check_request
    from packager.registry import resolve

    try:
        check_request(request, build_here=build_here)
        resolve(request.model.name, request.family, request.model.weights_path)
    except MmeError as exc:
        return str(exc)
    return ""


def triage(catalogue: Catalogue, requests: list, out: Path, reporter: Reporter,
           build_here: bool = True) -> tuple[list[EntryResult], list[int]]:
    """Each entry's result so far (refused entries failed, current ones up to date) and the
    indices (0-based) of the entries to package."""
    results = [EntryResult(e) for e in catalogue.entries]
    pending: list[int] = []
    for i, (result, request) in enumerate(zip(results, requests)):
        refused = _refusal(request, build_here)
        current, _ = (False, "") if refused else up_to_date(request, out)
        if refused:  # an unknown model, a GPU format on a host without one...: that entry fails, the others run
            result.status, result.error = "failed", refused
            reporter.warn(f"{result.entry.name} (entry {result.entry.index}): {refused}")
        elif current:
            result.status = "up to date"
            result.formats = format_rows(request, out)
        else:
            pending.append(i)
    return results, pending


def run_catalogue(args: argparse.Namespace) -> int:
    reporter = Reporter(quiet=args.quiet)
    catalogue = load_catalogue(args.catalogue)
    requests = [entry_request(e, args.out) for e in catalogue.entries]  # the file is wrong: nothing runs
    remote = None
    if args.on == "sagemaker":
        from packager.remote.catalogue_jobs import jobs_request_from_args

        remote = jobs_request_from_args(args)  # its options are checked before anything is written
    out = args.out if remote is not None and remote.dry_run else ensure_writable_dir(args.out)
    results, pending = triage(catalogue, requests, out, reporter, build_here=remote is None)
    total = len(results)
    where = f"SageMaker training jobs on {remote.instance_type}" if remote else f"--jobs {args.jobs}"
    reporter.info(f"==> catalogue {catalogue.path}: {total} entries, {sum(r.status == 'up to date' for r in results)} "
                  f"up to date, {len(pending)} to package with {where} into {out}")
    start = time.perf_counter()
    if remote is not None:
        from packager.remote.catalogue_jobs import package_on_sagemaker

        if not package_on_sagemaker(remote, catalogue, requests, results, out, reporter):
            return 0  # a dry run: the plan was printed, nothing written
    else:
        _package_here(args.jobs, requests, results, pending, out, reporter)
    wall = time.perf_counter() - start
    paths = write_summary(out, catalogue, results, args.jobs, wall,
                          where=f"sagemaker:{remote.instance_type}" if remote else "local")
    failed = sum(r.status == "failed" for r in results)
    print(f"catalogue: {sum(r.status == 'packaged' for r in results)} packaged, "
          f"{sum(r.status == 'up to date' for r in results)} up to date, {failed} failed in {wall:.1f} s")
    for path in paths:
        print(f"written {path}")
    return min(failed, MAX_EXIT_CODE)


def _package_here(jobs: int, requests: list, results: list[EntryResult], pending: list[int], out: Path,
                  reporter: Reporter) -> None:
    """Package the ``pending`` entries on this host, ``jobs`` processes at once."""
    import psutil

    total = len(results)
    logs = out / LOGS_DIR
    if pending:
        logs.mkdir(parents=True, exist_ok=True)
    running: list[_Job] = []
    largest_peak = 0
    done = total - len(pending)
    pending = list(pending)
    try:
        while pending or running:
            free = psutil.virtual_memory().available
            need = max(MIN_FREE_BYTES, int(largest_peak * 1.2))
            while pending and len(running) < jobs and (not running or free >= need):
                result = results[pending.pop(0)]
                log_path = logs / f"{result.entry.slug}.log"
                log = open(log_path, "wb")
                command = [sys.executable, "-m", "mme", "package", *result.entry.argv, "--out", str(out)]
                process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env=os.environ | {"PYTHONUNBUFFERED": "1"})
                result.log = str(log_path)
                running.append(_Job(result, process, log, time.perf_counter()))
                reporter.info(f"  -> {result.entry.name} (entry {result.entry.index}): started "
                              f"({' '.join(result.entry.argv[1:]) or 'defaults'})")
                free -= need
            time.sleep(POLL_S)
            for job in list(running):
                rss = _tree_rss(job.process)
                job.result.peak_rss_mib = max(job.result.peak_rss_mib, rss / 2**20)
                largest_peak = max(largest_peak, rss)
                code = job.process.poll()
                if code is None:
                    continue
                running.remove(job)
                job.log.close()
                done += 1
                r = job.result
                r.seconds = time.perf_counter() - job.started
                request = requests[r.entry.index - 1]
                r.formats = format_rows(request, out)
                if code == 0:
                    r.status = "packaged"
                    reporter.info(f"  [{done}/{total}] {r.entry.name}: packaged {', '.join(request.formats)} in "
                                  f"{r.seconds:.1f} s (peak {r.peak_rss_mib:.0f} MiB)")
                else:
                    r.status, r.error = "failed", _last_error(Path(r.log))
                    reporter.warn(f"[{done}/{total}] {r.entry.name}: failed (exit {code}): {r.error}; log {r.log}")
    except KeyboardInterrupt:
        for job in running:
            job.process.terminate()
        for job in running:
            job.process.wait()
            job.log.close()
        raise


def catalogue_artifacts(path: Path, out: Path, fmt: str | None) -> list[Path]:
    """The artifact directory of each entry of a packaged catalogue, checked to exist."""
    from packager.model import triton_model_name

    directories = []
    for entry in load_catalogue(path).entries:
        formats = entry_request(entry, out).formats
        chosen = fmt or formats[0]
        if chosen not in formats:
            raise UsageError(f"[[model]] {entry.index} ({entry.name}) is not packaged as {chosen} "
                             f"(its formats: {', '.join(formats)}); drop --format or package it")
        directory = out / triton_model_name(entry.name) / chosen
        if not (directory / "manifest.json").is_file():
            raise UsageError(f"{directory} is not packaged; run 'mme package --catalogue {path} --out {out}' first")
        directories.append(directory)
    return directories


def fleet_directory(directories: list[Path], into: Path) -> Path:
    """One directory holding every artifact's tarball (hard links where possible), as the S3
    prefix ``mme push --catalogue`` fills: what ``mme serve --catalogue`` serves."""
    from packager.layout import place_file
    from packager.manifest import Manifest

    into.mkdir(parents=True, exist_ok=True)
    for directory in directories:
        name = Manifest.load(directory).tarball
        place_file(directory / name, into / name)
    return into
