"""``mme package --catalogue FILE``: package every entry of a catalogue, in parallel, resumably.

An entry whose artifacts are already there for the same options (the manifest's
``request_sha256``, every listed file present at its recorded size, validation passed) is
skipped; one ``mme package`` would refuse before loading its model (an unknown name, a GPU
format without a GPU) fails alone. Each other entry is packaged in its own process,
:mod:`packager.child`, which reads the entry's request file and writes its result file (``--jobs
N`` at once; a process starts only while the memory the largest one so far needed is free), so
one failing entry does not stop the others; its log stays in ``<out>/catalogue-logs/`` for people.
``--on sagemaker`` hands the entries to SageMaker training jobs instead
(:mod:`packager.remote.catalogue_jobs`). The summary is written as
``catalogue-summary.{json,csv,md}`` under ``--out``; the result is the number of entries that
failed (0: all packaged or up to date), the exit code of ``mme package --catalogue``.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import psutil

from mme.errors import MmeError
from mme.fsutil import ensure_writable_dir, write_json_atomic
from mme.process import child_env
from mme.progress import Reporter
from packager.catalogue import LOGS_DIR, Catalogue, load_catalogue, up_to_date
from packager.catalogue_summary import EntryResult, format_rows, write_catalogue_summary
from packager.child import ChildResult
from packager.pipeline import check_package_request
from packager.registry import resolve
from packager.remote.catalogue_jobs import package_on_sagemaker
from packager.request import PackageRequest

if TYPE_CHECKING:
    from packager.remote.catalogue_plan import JobsRequest

CHILD_MODULE = "packager.child"
MIN_FREE_BYTES = 1 << 30  # a process never starts with less than this available
POLL_S = 0.5
MAX_EXIT_CODE = 100


@dataclass(frozen=True)
class _ChildFiles:
    """An entry's files in ``<out>/catalogue-logs/``: its request, its result and its log."""

    logs: Path
    slug: str

    @property
    def request(self) -> Path:
        return self.logs / f"{self.slug}.request.json"

    @property
    def result(self) -> Path:
        return self.logs / f"{self.slug}.result.json"

    @property
    def log(self) -> Path:
        return self.logs / f"{self.slug}.log"


@dataclass
class _Job:
    result: EntryResult
    process: subprocess.Popen
    log: Any
    started: float
    files: _ChildFiles


def _no_result(code: int) -> str:
    """Why an entry failed when its child wrote no result: it was killed, or died before it could."""
    how = f"was killed by signal {-code}" if code < 0 else f"exited {code}"
    return f"the packaging process {how} without writing its result (out of memory?); see the entry's log"


def _tree_rss(process: subprocess.Popen) -> int:
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


def _refusal(request: PackageRequest, build_here: bool = True) -> str:
    """Why ``mme package`` would refuse the entry before loading its model ('' when it would not);
    ``build_here=False``: on another host (a SageMaker job), whatever this one has."""
    try:
        check_package_request(request, build_here=build_here)
        resolve(request.model.name, request.family, request.model.weights_path)
    except MmeError as exc:
        return str(exc)
    return ""


def triage(catalogue: Catalogue, requests: Sequence[PackageRequest], out: Path, reporter: Reporter,
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


def package_catalogue(path: Path, out: Path, reporter: Reporter, jobs: int = 1,
                      remote: "JobsRequest | None" = None) -> int:
    """Package the catalogue at ``path`` into ``out`` (``jobs`` entries at once here, or in
    SageMaker training jobs: ``remote``), write the summary; the number of entries that failed
    (at most 100). MmeError before anything runs when the file, ``out`` or ``remote`` is wrong."""
    catalogue = load_catalogue(path, out, reporter)  # the file is wrong: nothing runs
    requests = [e.request for e in catalogue.entries]
    out = out if remote is not None and remote.dry_run else ensure_writable_dir(out)
    results, pending = triage(catalogue, requests, out, reporter, build_here=remote is None)
    total = len(results)
    where = f"SageMaker training jobs on {remote.instance_type}" if remote else f"--jobs {jobs}"
    reporter.info(f"==> catalogue {catalogue.path}: {total} entries, {sum(r.status == 'up to date' for r in results)} "
                  f"up to date, {len(pending)} to package with {where} into {out}")
    start = time.perf_counter()
    if remote is not None:

        if not package_on_sagemaker(remote, catalogue, requests, results, out, reporter):
            return 0  # a dry run: the plan was printed, nothing written
    else:
        _package_here(jobs, results, pending, out, reporter)
    wall = time.perf_counter() - start
    paths = write_catalogue_summary(out, catalogue, results, jobs, wall,
                          where=f"sagemaker:{remote.instance_type}" if remote else "local")
    failed = sum(r.status == "failed" for r in results)
    print(f"catalogue: {sum(r.status == 'packaged' for r in results)} packaged, "
          f"{sum(r.status == 'up to date' for r in results)} up to date, {failed} failed in {wall:.1f} s")
    for written in paths:
        print(f"written {written}")
    return min(failed, MAX_EXIT_CODE)


def _package_here(jobs: int, results: list[EntryResult], pending: list[int], out: Path, reporter: Reporter) -> None:
    """Package the ``pending`` entries on this host, ``jobs`` processes at once, each in a
    :mod:`packager.child` that reads its request file and writes its result file."""
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
                files = _ChildFiles(logs, result.entry.slug)
                write_json_atomic(files.request, result.entry.request.to_dict())
                files.result.unlink(missing_ok=True)  # a result left by an earlier run says nothing of this one
                log = open(files.log, "wb")
                log.write(f"# mme package {shlex.join(result.entry.command_line)} --out {shlex.quote(str(out))}\n".encode())
                log.flush()  # for people: the entry by hand (the child itself reads the request file)
                command = [sys.executable, "-m", CHILD_MODULE, str(files.request), str(files.result)]
                process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env=child_env({"PYTHONUNBUFFERED": "1"}, lifeline=True))
                result.log = str(files.log)
                running.append(_Job(result, process, log, time.perf_counter(), files))
                reporter.info(f"  -> {result.entry.name} (entry {result.entry.index}): started "
                              f"({' '.join(result.entry.command_line[1:]) or 'defaults'})")
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
                request = r.entry.request
                r.formats = format_rows(request, out)
                child = ChildResult.read(job.files.result) or ChildResult(error=_no_result(code), exit_code=code or 1)
                if child.ok:
                    r.status = "packaged"
                    reporter.info(f"  [{done}/{total}] {r.entry.name}: packaged {', '.join(child.packaged)} in "
                                  f"{r.seconds:.1f} s (peak {r.peak_rss_mib:.0f} MiB)")
                else:
                    r.status, r.error = "failed", child.error
                    reporter.warn(f"[{done}/{total}] {r.entry.name}: failed ({child.error_type or f'exit {code}'}): "
                                  f"{r.error}; log {r.log}")
    except KeyboardInterrupt:
        for job in running:
            job.process.terminate()
        for job in running:
            job.process.wait()
            job.log.close()
        raise
