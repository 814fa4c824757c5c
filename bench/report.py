"""``mme report``: rebuild summaries, charts and an HTML/Markdown report from saved bench
runs, without re-running anything."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from bench import analysis, charts, render, sizing, summary_io
from bench.cloudwatch_data import CLOUDWATCH_FILE, read_cloudwatch
from bench.per_model import per_model, write_per_model
from bench.render import max_users_text
from bench.results import RUN_FILE
from mme.charts import write_png
from mme.errors import OutputDirError, UsageError
from mme.fsutil import ensure_writable_dir, write_bytes_atomic
from mme.progress import Reporter

if TYPE_CHECKING:
    from bench import analysis, render

RUN_CHART = "latency_throughput.png"
ENDPOINT_CHART = "endpoint_models.png"
COMPARISON_CHART = "comparison.png"
CLOUDWATCH_CHART = "cloudwatch.png"
REPORT_HTML = "report.html"
REPORT_MD = "report.md"


@dataclass(frozen=True)
class ReportPaths:
    html: Path
    markdown: Path
    comparison: Path | None
    run_charts: tuple[Path, ...]
    summaries: tuple[Path, ...]
    report: "render.Report"


def run_dirs(paths: Sequence[str | Path]) -> list[Path]:
    """The run directories named, in order, without duplicates; a directory that is not a
    run itself but holds runs stands for those runs (sorted by name)."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir() and not (path / RUN_FILE).exists():
            children = sorted(c for c in path.iterdir() if c.is_dir() and (c / RUN_FILE).is_file())
            found.extend(children or [path])  # no runs inside: analyse() says what is wrong with it
        else:
            found.append(path)
    unique: list[Path] = []
    seen: set[Path] = set()
    for path in found:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(path)
    return unique


def default_out(runs: Sequence[Path]) -> Path:
    if len(runs) == 1:
        return runs[0]
    return Path("results") / f"report-{time.strftime('%Y%m%d-%H%M%S')}"


def build_report(results: Sequence[str | Path], out: Path | None = None, target_tps: float | None = None,
                 p95_slo_ms: float | None = None, reporter: Reporter | None = None) -> ReportPaths:
    reporter = reporter or Reporter(quiet=True)
    if (target_tps is None) != (p95_slo_ms is None):
        raise UsageError("--target-tps and --p95-slo-ms go together: give both to size the fleet, or neither")
    dirs = run_dirs(results)
    summaries = [analysis.analyse(d) for d in dirs]  # all input checked before anything is written
    for d in dirs:
        try:
            ensure_writable_dir(d)
        except OutputDirError:
            raise OutputDirError(f"cannot write summary.csv/summary.json and charts into run directory {d}; "
                                 "copy the run somewhere writable and report from there") from None
    out_dir = ensure_writable_dir(out if out is not None else default_out(dirs))
    reporter.info(f"==> report of {len(dirs)} run(s) into {out_dir}")

    runs: list[render.RunReport] = []
    run_charts: list[Path] = []
    summary_files: list[Path] = []
    for s in summaries:
        reporter.info(f"  {s.run_dir}: {len(s.stages)} stage(s), {s.overall.requests} request(s)")
        summary_files.extend(summary_io.write_summary(s))
        run_charts_of = [render.Chart(s.run_dir / RUN_CHART, charts.run_chart(s),
                                      f"{s.label}: latency and throughput (top), successful and failed requests "
                                      "(bottom) per concurrent-user level")]
        if s.has_endpoint_metrics:
            run_charts_of.append(render.Chart(s.run_dir / ENDPOINT_CHART, charts.endpoint_chart(s),
                                              f"{s.label}: model loads, evictions and cache misses per stage"))
        cloudwatch = _cloudwatch_chart(s, reporter)
        if cloudwatch is not None:
            run_charts_of.append(cloudwatch)
        for chart in run_charts_of:
            write_png(chart.path, chart.png)
            run_charts.append(chart.path)
        sized = sizing.size(s, target_tps, p95_slo_ms) if target_tps is not None and p95_slo_ms is not None else None
        models = per_model(s.run_dir)
        if len(models) > 1:
            summary_files.append(write_per_model(s.run_dir, models))
        runs.append(render.RunReport(s, tuple(run_charts_of), sized, tuple(models) if len(models) > 1 else ()))

    comparison = None
    if len(summaries) > 1:
        comparison = render.Chart(out_dir / COMPARISON_CHART, charts.comparison_chart(summaries),
                                  "copies loaded, lowest latency, max error-free throughput and max users before "
                                  "the first failure, each relative to the best run")
        write_png(comparison.path, comparison.png)

    report = render.Report(tuple(runs), comparison, time.strftime("%Y-%m-%d %H:%M:%S %Z"), target_tps, p95_slo_ms)
    html_path, md_path = out_dir / REPORT_HTML, out_dir / REPORT_MD
    write_bytes_atomic(html_path, render.to_html(report).encode())
    write_bytes_atomic(md_path, render.to_markdown(report, out_dir).encode())
    return ReportPaths(html_path, md_path, comparison.path if comparison else None, tuple(run_charts),
                       tuple(summary_files), report)


def _cloudwatch_chart(summary: "analysis.RunSummary", reporter: Reporter) -> "render.Chart | None":
    """The chart of the run's saved CloudWatch metrics; None (with a warning when the file is
    there but unusable) when there is nothing to draw."""
    path = summary.run_dir / CLOUDWATCH_FILE
    try:
        saved = read_cloudwatch(summary.run_dir)
        if saved is None:
            return None
        png = charts.cloudwatch_chart(summary, saved)
    except (OSError, ValueError) as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0]
        reporter.warn(f"{path}: unusable ({reason}); CloudWatch chart left out")
        return None
    return render.Chart(summary.run_dir / CLOUDWATCH_CHART, png,
                        f"{summary.label}: endpoint CloudWatch metrics over the run (latencies in ms, counts per "
                        "minute, utilisation in percent; vertical lines: stage starts)")


def _num(value: float | int | None, digits: int = 1) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def print_results(paths: ReportPaths) -> None:
    """The results on stdout: one line per run, the sizing verdicts, then where the files are."""
    for r in paths.report.runs:
        o = r.summary.overall
        name = r.summary.run.run_id
        if name not in r.summary.label:
            name = f"{name} ({r.summary.label})"
        print(f"{name}: max error-free {_num(o.max_error_free_rps)} req/s, "
              f"lowest p50 {_num(o.lowest_p50_ms)} ms, max users before first failure "
              f"{max_users_text(r.summary)}, "
              f"models resident at the end {_num(o.models_loaded)}")
        if r.sizing is not None:
            print(f"  sizing: {r.sizing.message}")
            for note in r.sizing.notes:
                print(f"  note: {note}")
    if paths.comparison:
        print(f"comparison chart: {paths.comparison}")
    print(f"markdown: {paths.markdown}")
    print(f"HTML report: {paths.html}")
