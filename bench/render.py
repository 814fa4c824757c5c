"""The bench report as a self-contained HTML page (charts embedded as base64 data URIs)
and as Markdown (charts linked as files next to it)."""

from __future__ import annotations

import base64
import html
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from bench.summary_records import (
    LATENCY_OF,
    NONE,
    PERCENTILE_METHOD,
    RunSummary,
    StageSummary,
    common_users,
    stage_with_users,
    top_errors_text,
)
from bench.charts import distinct_labels
from bench.per_model import ModelRow
from bench.per_model import table as per_model_table
from bench.sizing import Sizing

SATURATED_FLAG = "⚠ generator saturated: unreliable"


@dataclass(frozen=True)
class Chart:
    path: Path
    png: bytes
    caption: str


@dataclass(frozen=True)
class RunReport:
    summary: RunSummary
    charts: tuple[Chart, ...]
    sizing: Sizing | None
    per_model: tuple[ModelRow, ...] = ()  # a run over several models (a fleet mix): one row each


@dataclass(frozen=True)
class Report:
    runs: tuple[RunReport, ...]
    comparison: Chart | None
    generated_at: str
    target_tps: float | None
    p95_slo_ms: float | None


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return NONE
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def max_users_text(summary: RunSummary) -> str:
    o = summary.overall
    value = o.max_users_without_failure
    later_silent = [s.users for s in summary.stages if s.stage in o.unanswered_stages
                    and (value is None or s.users > value)]
    silent = f"; no request finished at {', '.join(map(str, later_silent))} users" if later_silent else ""
    if value is None:
        return ("none (failures from the first stage)" if o.failed else NONE) + silent
    if o.failed:
        return f"{value}{silent}"
    return f"{value}{silent}" if silent else f"{value} (no failure in the run)"


def breaking_point_text(summary: RunSummary) -> str:
    """Where the load broke the endpoint: the last stage before the first failures (users, requests/s)."""
    o = summary.overall
    if o.breaking_stage is None:
        held = [s.users for s in summary.stages if s.requests and not s.partial]
        return f"not reached: no failure up to {max(held)} users" if held else NONE
    broke = f"{o.breaking_users} users ({o.breaking_failures} of {o.breaking_requests} requests failed)"
    if o.before_breaking_stage is None:
        return f"failures from the first stage on: {broke}"
    return f"{o.before_breaking_users} users at {fmt(o.before_breaking_rps, 2)} requests/s; first failures at {broke}"


def _stage_flags(s: StageSummary) -> str:
    flags = []
    if s.saturated:
        flags.append(SATURATED_FLAG)
    if s.partial:
        flags.append("partial")
    if s.derived:
        flags.append("not in stages.csv")
    return "; ".join(flags)


_STAGE_COLUMNS: tuple[tuple[str, Callable[[StageSummary], str]], ...] = (
    ("stage", lambda s: fmt(s.stage)),
    ("users", lambda s: fmt(s.users)),
    ("duration s", lambda s: fmt(s.duration_s)),
    ("requests", lambda s: fmt(s.requests)),
    ("ok", lambda s: fmt(s.successes)),
    ("failed", lambda s: fmt(s.failures)),
    ("cut off", lambda s: fmt(s.cut_off)),
    ("cold", lambda s: fmt(s.cold_requests)),
    ("req/s", lambda s: fmt(s.requests_per_s, 2)),
    ("avg ms", lambda s: fmt(s.latency_avg_ms)),
    ("min ms", lambda s: fmt(s.latency_min_ms)),
    ("p50 ms", lambda s: fmt(s.latency_p50_ms)),
    ("p90 ms", lambda s: fmt(s.latency_p90_ms)),
    ("p95 ms", lambda s: fmt(s.latency_p95_ms)),
    ("p99 ms", lambda s: fmt(s.latency_p99_ms)),
    ("warm p50 ms", lambda s: fmt(s.warm_p50_ms)),
    ("warm p95 ms", lambda s: fmt(s.warm_p95_ms)),
    ("cold p50 ms", lambda s: fmt(s.cold_p50_ms)),
    ("cold max ms", lambda s: fmt(s.cold_max_ms)),
    ("max ms", lambda s: fmt(s.latency_max_ms)),
    ("gen CPU max %", lambda s: fmt(s.generator_cpu_max, 0)),
    ("gen CPU mean %", lambda s: fmt(s.generator_cpu_mean, 0)),
    ("flags", _stage_flags),
    ("errors", lambda s: s.errors),
)

_ENDPOINT_COLUMNS: tuple[tuple[str, Callable[[StageSummary], str]], ...] = (
    ("model loads", lambda s: fmt(s.model_loads)),
    ("evictions", lambda s: fmt(s.model_evictions)),
    ("cache hits", lambda s: fmt(s.cache_hits)),
    ("cache misses", lambda s: fmt(s.cache_misses)),
    ("loaded models", lambda s: fmt(s.loaded_model_count)),
    ("memory % of limit", lambda s: fmt(s.memory_utilization)),
    ("loads above threshold", lambda s: fmt(s.loads_above_threshold)),
    ("endpoint ModelLatency avg ms", lambda s: fmt(s.model_latency_avg_ms)),
)


def stage_columns(summary: RunSummary) -> tuple[tuple[str, Callable[[StageSummary], str]], ...]:
    if not summary.has_endpoint_metrics:
        return _STAGE_COLUMNS
    return _STAGE_COLUMNS[:-2] + _ENDPOINT_COLUMNS + _STAGE_COLUMNS[-2:]


def overall_rows(summary: RunSummary) -> list[tuple[str, str]]:
    o, run = summary.overall, summary.run
    first = NONE if o.first_failure_users is None else (
        f"{o.first_failure_users} users at t={o.first_failure_t:.1f} s ({o.first_failure_error})")
    return [
        ("requests (ok / failed)", f"{o.requests} ({o.successes} / {o.failures})"
         + (f"; {o.cut_off} more cut off by the end of the drain" if o.cut_off else "")),
        ("most common failures", top_errors_text(o.top_errors)),
        ("latency, all successful requests", NONE if o.latency_p50_ms is None else
         f"p50 {o.latency_p50_ms:.1f} ms, p95 {fmt(o.latency_p95_ms)} ms, p99 {fmt(o.latency_p99_ms)} ms"),
        ("cold requests (waited for their model to load)", NONE if o.cold_requests is None else
         f"{o.cold_requests}: p50 {fmt(o.cold_p50_ms)} ms, p95 {fmt(o.cold_p95_ms)} ms, max {fmt(o.cold_max_ms)} ms "
         f"(told apart by {o.cold_method})"),
        ("latency, warm requests", NONE if o.warm_p50_ms is None else
         f"p50 {o.warm_p50_ms:.1f} ms, p95 {fmt(o.warm_p95_ms)} ms, p99 {fmt(o.warm_p99_ms)} ms"),
        ("sustained throughput", NONE if o.sustained_rps is None else
         f"{o.sustained_rps:.2f} requests/s over {o.duration_s:.1f} s"),
        ("max users before the first failure", max_users_text(summary)),
        ("users at the first failed request", first),
        ("breaking point (the last stage before the first failures)", breaking_point_text(summary)),
        ("max error-free throughput (a stage of 10 s or more)", NONE if o.max_error_free_rps is None else
         f"{o.max_error_free_rps:.2f} requests/s at {o.max_error_free_rps_users} users"),
        ("lowest latency (stage p50)", NONE if o.lowest_p50_ms is None else
         f"{o.lowest_p50_ms:.1f} ms at {o.lowest_p50_users} users"),
        ("lowest latency (any request)", NONE if o.min_latency_ms is None else f"{o.min_latency_ms:.1f} ms"),
        ("copies targeted", fmt(o.copies_targeted)),
        ("model loads during the run", fmt(o.model_loads)),
        ("models resident at the end", NONE if o.models_loaded is None else
         f"{o.models_loaded} (from {o.models_loaded_source})"),
        ("stages where no request finished", ", ".join(map(str, o.unanswered_stages)) or "none"),
        ("saturated stages", ", ".join(map(str, o.saturated_stages)) or "none"),
        ("stopped", o.stopped_reason or "unknown (run.json not finalised)"),
        ("duration", f"{o.duration_s:.1f} s"),
        ("endpoint", f"{run.endpoint} ({run.endpoint_url or 'AWS, ' + run.region})"),
        ("instance type", run.instance_type or NONE),
        ("model / format", f"{run.model or NONE} / {run.format or NONE}"),
        ("load", f"{run.shape} shape, {run.copies} copies ({run.target_distribution}), {run.mode}-model, "
                 f"{run.client} client, {run.workers} worker(s), {run.payload_bytes} B {run.content_type}"),
        ("warm-up before the first stage (not in any figure)", _warmup_text(run.extra.get("warmup"))),
        ("in-process baseline on the bench's host (batch 1, one caller)",
         in_process_text(run.extra.get("in_process"), o.max_error_free_rps, o.sustained_rps)),
        ("started / ended", f"{run.started_at} / {run.ended_at or NONE}"),
    ]


def _warmup_text(warmup: object) -> str:
    """run.json's ``extra["warmup"]`` (``mme bench --warmup``) in a few words."""
    if not isinstance(warmup, dict):
        return "none"
    per = [w for w in warmup.get("per_target", ()) if isinstance(w, dict)]
    slowest = max((w.get("seconds", 0.0) for w in per), default=0.0)
    text = (f"{warmup.get('targets', len(per))} target(s) in {warmup.get('seconds', 0.0):.1f} s "
            f"(slowest {slowest:.1f} s)")
    failed = [w.get("target") or "the model" for w in per if not w.get("ok")]
    return text + (f"; failed: {', '.join(failed)}" if failed else "")


def in_process_text(baseline: object, max_error_free_rps: float | None, sustained_rps: float | None) -> str:
    """run.json's ``extra["in_process"]`` (``mme bench --in-process``) next to the endpoint's max
    error-free throughput (its sustained throughput when no stage was long enough)."""
    if not isinstance(baseline, dict) or not baseline.get("requests_per_s"):
        return "not measured (mme bench --in-process SECONDS)"
    rps = float(baseline["requests_per_s"])
    text = (f"{rps:.2f} requests/s, p50 {float(baseline.get('p50_ms', 0.0)):.1f} ms ({baseline.get('pipeline')}, "
            f"{baseline.get('runtime')}, {baseline.get('requests')} calls)")
    if max_error_free_rps is not None:
        text += f"; the endpoint's max error-free throughput is {100.0 * max_error_free_rps / rps:.0f}% of it"
    elif sustained_rps is not None:
        text += f"; the endpoint's sustained throughput is {100.0 * sustained_rps / rps:.0f}% of it"
    return text


def comparison_rows(summaries: Sequence[RunSummary]) -> tuple[list[str], list[list[str]]]:
    users = common_users(list(summaries))  # like for like: the highest user level every run held
    level = "no shared user level" if users is None else f"{users} users"
    header = ["run", "instance", "format", f"p95 ms at {level}", f"req/s at {level}", "models resident at the end",
              "lowest p50 ms", "max error-free req/s", "max users before first failure", "users at first failure",
              "stopped"]
    rows = []
    for label, s in zip(distinct_labels(summaries), summaries):
        stage = stage_with_users(s, users)
        rows.append([label, s.run.instance_type or NONE, s.run.format or NONE,
                     fmt(stage.latency_p95_ms if stage else None), fmt(stage.requests_per_s if stage else None, 2),
                     fmt(s.overall.models_loaded), fmt(s.overall.lowest_p50_ms), fmt(s.overall.max_error_free_rps, 2),
                     max_users_text(s), fmt(s.overall.first_failure_users), s.overall.stopped_reason or NONE])
    return header, rows


def sizing_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    header = ["run", "capacity req/s", "at users", "p95 ms", "instances at 60%", "instances at 70%",
              "at 100% (no headroom)", "verdict"]
    labels = distinct_labels([r.summary for r in report.runs])
    rows = []
    for label, r in zip(labels, report.runs):
        z = r.sizing
        if z is None:
            continue
        verdict = " ".join((z.message, *z.notes))
        rows.append([label, fmt(z.capacity_rps), fmt(z.capacity_users), fmt(z.capacity_p95_ms),
                     fmt(z.instances_at_60), fmt(z.instances_at_70), fmt(z.instances_at_100), verdict])
    return header, rows


# -- HTML ---------------------------------------------------------------------------------

_CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 2em; color: #222; max-width: 1500px; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; } h3 { margin-top: 1.5em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.88em; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; vertical-align: top; }
th { background: #f0f0f0; } td.text, th.text { text-align: left; }
tr.saturated td { background: #fde2e2; } tr.partial td { color: #666; font-style: italic; }
.warning { background: #fff4d6; border-left: 4px solid #e0a800; padding: 0.4em 0.8em; margin: 0.3em 0; }
.note { color: #555; font-size: 0.9em; } img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
"""


def _e(text: Any) -> str:
    return html.escape(str(text))


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]], row_classes: Sequence[str] = (),
                text_columns: Sequence[int] = (0,), table_class: str = "") -> str:
    def cell(tag: str, i: int, value: str) -> str:
        cls = ' class="text"' if i in text_columns else ""
        return f"<{tag}{cls}>{_e(value)}</{tag}>"

    out = [f'<table class="{table_class}">' if table_class else "<table>",
           "<tr>" + "".join(cell("th", i, h) for i, h in enumerate(header)) + "</tr>"]
    for n, row in enumerate(rows):
        cls = row_classes[n] if n < len(row_classes) and row_classes[n] else ""
        out.append((f'<tr class="{cls}">' if cls else "<tr>") + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _img(chart: Chart) -> str:
    data = base64.b64encode(chart.png).decode("ascii")
    caption = _e(chart.caption)
    return (f'<figure><img alt="{caption}" src="data:image/png;base64,{data}">'
            f'<figcaption class="note">{caption}</figcaption></figure>')


def _row_class(s: StageSummary) -> str:
    return " ".join(c for c, on in (("saturated", s.saturated), ("partial", s.partial)) if on)


def _html_run(r: RunReport, label: str) -> str:
    s = r.summary
    columns = stage_columns(s)
    parts = [f"<h2>{_e(label)} <span class='note'>run {_e(s.run.run_id)}</span></h2>",
             f"<p class='note'>{_e(s.run_dir)}</p>"]
    parts += [f"<div class='warning'>{_e(w)}</div>" for w in s.warnings]
    parts.append("<h3>Overall</h3>")
    parts.append(_html_table(["metric", "value"], overall_rows(s), text_columns=(0, 1)))
    parts += [_img(c) for c in r.charts]
    if r.per_model:
        header, rows = per_model_table(list(r.per_model))
        parts.append("<h3>Per model</h3>")
        parts.append("<p class='note'>Hit ratio: successful requests that did not wait for their model to load; "
                     "predicted: the fleet plan's simulation of the endpoint's LRU cache on this mix.</p>")
        parts.append(_html_table(header, rows, text_columns=(0,)))
    parts.append("<h3>Stages (user levels)</h3>")
    if any(st.saturated for st in s.stages):
        parts.append(f"<p class='warning'>Rows marked &ldquo;{_e(SATURATED_FLAG)}&rdquo; had the load generator above "
                     "its CPU threshold: their latency includes the generator's own queueing and their throughput "
                     "is the generator's limit. Do not read endpoint capacity from them.</p>")
    text_cols = (len(columns) - 2, len(columns) - 1)
    parts.append(_html_table([name for name, _ in columns], [[get(st) for _, get in columns] for st in s.stages],
                             [_row_class(st) for st in s.stages], text_columns=text_cols, table_class="stages"))
    return "\n".join(parts)


def to_html(report: Report) -> str:
    summaries = [r.summary for r in report.runs]
    labels = distinct_labels(summaries)
    body = [f"<h1>Bench report: {len(report.runs)} run{'s' if len(report.runs) != 1 else ''}</h1>",
            f"<p class='note'>Generated {_e(report.generated_at)} by <code>mme report</code> from saved results. "
            f"Latency statistics are over {_e(LATENCY_OF)}; percentiles are exact, {_e(PERCENTILE_METHOD)}. "
            "Requests/s counts every request of a stage over the stage's duration.</p>"]
    if len(summaries) > 1:
        header, rows = comparison_rows(summaries)
        body.append("<h2>Comparison</h2>")
        body.append(_html_table(header, rows, text_columns=(0, 1, 2, 7, 9)))
        if report.comparison is not None:
            body.append(_img(report.comparison))
    if report.target_tps is not None:
        header, rows = sizing_rows(report)
        body.append(f"<h2>Sizing: {report.target_tps:g} TPS with p95 &le; {report.p95_slo_ms:g} ms</h2>")
        body.append("<p class='note'>Capacity: the highest requests/s of a stage without failures whose p95 meets "
                    "the SLO, on the one instance measured. Instances = ceil(target / (utilisation &times; capacity)); "
                    "aim for 60&ndash;70% utilisation per instance.</p>")
        body.append(_html_table(header, rows, text_columns=(0, 7)))
    body += [_html_run(r, label) for r, label in zip(report.runs, labels)]
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>mme bench report</title>"
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


# -- Markdown -----------------------------------------------------------------------------


def _md_cell(value: str) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _md_link(chart: Chart, base: Path) -> str:
    rel = Path(os.path.relpath(chart.path, base)).as_posix()
    return f"![{chart.caption}]({rel})"


def to_markdown(report: Report, base: Path) -> str:
    """``base``: the directory report.md is written to (chart links are relative to it)."""
    summaries = [r.summary for r in report.runs]
    labels = distinct_labels(summaries)
    out = [f"# Bench report: {len(report.runs)} run{'s' if len(report.runs) != 1 else ''}", "",
           f"Generated {report.generated_at} by `mme report`. Latency statistics are over {LATENCY_OF}; "
           f"percentiles are exact, {PERCENTILE_METHOD}.", ""]
    if len(summaries) > 1:
        header, rows = comparison_rows(summaries)
        out += ["## Comparison", "", _md_table(header, rows), ""]
        if report.comparison is not None:
            out += [_md_link(report.comparison, base), ""]
    if report.target_tps is not None:
        header, rows = sizing_rows(report)
        out += [f"## Sizing: {report.target_tps:g} TPS with p95 <= {report.p95_slo_ms:g} ms", "",
                _md_table(header, rows), ""]
    for r, label in zip(report.runs, labels):
        s = r.summary
        out += [f"## {label} (run {s.run.run_id})", "", f"`{s.run_dir}`", ""]
        out += [f"> **warning:** {w}" for w in s.warnings]
        if s.warnings:
            out.append("")
        out += [_md_table(["metric", "value"], overall_rows(s)), ""]
        out += [_md_link(c, base) for c in r.charts]
        if r.per_model:
            header, rows = per_model_table(list(r.per_model))
            out += ["", "### Per model", "", _md_table(header, rows)]
        columns = stage_columns(s)
        out += ["", "### Stages", "",
                _md_table([name for name, _ in columns], [[get(st) for _, get in columns] for st in s.stages]), ""]
    return "\n".join(out) + "\n"
