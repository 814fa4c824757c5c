"""Charts of bench runs, as PNG bytes, drawn as every chart of the toolkit is (:mod:`mme.charts`:
matplotlib's Agg canvas, never pyplot, so this is safe in any process and needs no display).

* :func:`run_chart` — the first article's per-run figure: top, p50/p95 latency and
  throughput against concurrent users; bottom, successful and failed requests per user
  level. Stages where the load generator was saturated are shaded and flagged.
* :func:`comparison_chart` — two or more runs side by side, like for like: p95 latency and
  throughput at the highest user level every run held, models resident at the end, max users
  before the first failure; each normalised to the best run = 1.0, higher is better, raw
  values written on the bars.
* :func:`endpoint_chart` — model loads and evictions per stage, with LoadedModelCount.
* :func:`cloudwatch_chart` — the endpoint's CloudWatch metrics (``mme metrics``) over time.
"""

from __future__ import annotations

import math
from collections import Counter
from datetime import timedelta
from typing import TYPE_CHECKING, Callable, Sequence

from bench.cloudwatch_data import utc_time
from bench.summary_records import common_users, stage_with_users
from mme.charts import GRID_ALPHA, LEGEND_FONT_SIZE, figure, message_png, png

if TYPE_CHECKING:  # matplotlib is imported when a chart is drawn, not when this module is
    from matplotlib.axes import Axes

    from bench.cloudwatch_data import CloudWatchMetrics
    from bench.summary_records import RunSummary, StageSummary

SATURATED_COLOUR = "#d62728"
PARTIAL_COLOUR = "#7f7f7f"
OK_COLOUR = "#2ca02c"
FAIL_COLOUR = "#d62728"


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def _top(values: Sequence[float | None]) -> float:
    """Upper axis limit with headroom above the largest value (1 when there is none)."""
    largest = max((v for v in values if v is not None and math.isfinite(v)), default=0.0)
    return largest * 1.1 if largest > 0 else 1.0


def distinct_labels(summaries: Sequence["RunSummary"]) -> list[str]:
    """Run labels for legends; runs that would share a label get their run id added."""
    labels = [s.label for s in summaries]
    seen = Counter(labels)
    return [f"{label} [{s.run.run_id}]" if seen[label] > 1 else label for label, s in zip(labels, summaries)]


def _user_ticks(ax: "Axes", stages: Sequence["StageSummary"]) -> None:
    step = max(1, math.ceil(len(stages) / 25))
    ticks = list(range(0, len(stages), step))
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(stages[i].users) + ("*" if stages[i].partial else "") for i in ticks])
    ax.set_xlim(-0.6, len(stages) - 0.4)


def _shade(ax: "Axes", stages: Sequence["StageSummary"]) -> None:
    for i, s in enumerate(stages):
        if s.saturated:
            ax.axvspan(i - 0.5, i + 0.5, facecolor=SATURATED_COLOUR, alpha=0.12, hatch="//",
                       edgecolor=SATURATED_COLOUR, linewidth=0)
        elif s.partial:
            ax.axvspan(i - 0.5, i + 0.5, facecolor=PARTIAL_COLOUR, alpha=0.10, linewidth=0)


def _marker_handles(stages: Sequence["StageSummary"]) -> list:
    from matplotlib.patches import Patch

    handles = []
    if any(s.saturated for s in stages):
        handles.append(Patch(facecolor=SATURATED_COLOUR, alpha=0.25, hatch="//", edgecolor=SATURATED_COLOUR,
                             label="generator saturated: unreliable"))
    if any(s.partial and not s.saturated for s in stages):
        handles.append(Patch(facecolor=PARTIAL_COLOUR, alpha=0.25, label="partial stage (*)"))
    return handles


def _title(summary: "RunSummary") -> str:
    run = summary.run
    what = " ".join(p for p in (run.model, run.format) if p) or "model unknown"
    where = run.instance_type or "instance type unknown"
    return f"{what} — endpoint {run.endpoint} on {where} — run {run.run_id}"


def run_chart(summary: "RunSummary") -> bytes:
    stages = [s for s in summary.stages if s.requests]
    fig = figure(11, 7.5)
    fig.suptitle(_title(summary), fontsize=11)
    if not stages:
        return message_png(fig, "no requests recorded")
    x = list(range(len(stages)))
    grid = fig.add_gridspec(2, 1, height_ratios=(2, 1))
    top = fig.add_subplot(grid[0])
    bottom = fig.add_subplot(grid[1], sharex=top)

    _shade(top, stages)
    lines = top.plot(x, [_nan(s.latency_p50_ms) for s in stages], marker="o", color="tab:blue", label="p50 latency (ms)")
    lines += top.plot(x, [_nan(s.latency_p95_ms) for s in stages], marker="s", linestyle="--", color="tab:purple",
                      label="p95 latency (ms)")
    top.set_ylabel("latency (ms)")
    top.set_ylim(0, _top([s.latency_p95_ms for s in stages] + [s.latency_p50_ms for s in stages]))
    top.grid(True, alpha=GRID_ALPHA)
    right = top.twinx()
    lines += right.plot(x, [_nan(s.requests_per_s) for s in stages], marker="^", color="tab:orange",
                        label="throughput (requests/s)")
    if any(s.failures for s in stages):  # failed requests count in requests/s: show what succeeded too
        lines += right.plot(x, [_nan(s.successes_per_s) for s in stages], marker="v", linestyle=":",
                            color="tab:green", label="successful requests/s")
    right.set_ylabel("throughput (requests/s)")
    right.set_ylim(0, _top([s.requests_per_s for s in stages]))
    handles = lines + _marker_handles(stages)
    top.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.01), ncol=len(handles),
               fontsize=LEGEND_FONT_SIZE, frameon=False)
    top.tick_params(labelbottom=False)

    _shade(bottom, stages)
    ok = [s.successes for s in stages]
    failed = [s.failures for s in stages]
    bottom.bar(x, ok, color=OK_COLOUR, label="successful", width=0.7)
    bottom.bar(x, failed, bottom=ok, color=FAIL_COLOUR, label="failed", width=0.7)
    for i, s in enumerate(stages):
        if s.failures:
            bottom.annotate(f"{s.failures} failed", (i, s.requests), textcoords="offset points", xytext=(0, 2),
                            ha="center", fontsize=7, color=FAIL_COLOUR, fontweight="bold")
    bottom.set_ylim(0, max(s.requests for s in stages) * 1.15)
    bottom.set_ylabel("requests")
    bottom.set_xlabel("concurrent users (one point per stage; * = partial stage)")
    bottom.legend(loc="upper left", fontsize=LEGEND_FONT_SIZE)
    bottom.grid(True, axis="y", alpha=GRID_ALPHA)
    bottom.set_title("successful and failed requests per user level", fontsize=10)
    _user_ticks(bottom, stages)
    return png(fig)


def endpoint_chart(summary: "RunSummary") -> bytes:
    stages = [s for s in summary.stages if s.model_loads is not None]
    fig = figure(11, 3.8)
    fig.suptitle(f"endpoint model activity — {summary.label} — run {summary.run.run_id}", fontsize=10)
    if not stages:
        return message_png(fig, "no endpoint metrics recorded")
    from matplotlib.ticker import MaxNLocator

    x = list(range(len(stages)))
    ax = fig.add_subplot()
    _shade(ax, stages)
    width = 0.27
    handles: list = [
        ax.bar([i - width for i in x], [s.model_loads or 0 for s in stages], width, color="tab:blue", label="model loads"),
        ax.bar(x, [s.model_evictions or 0 for s in stages], width, color="tab:red", label="evictions"),
        ax.bar([i + width for i in x], [s.cache_misses or 0 for s in stages], width, color="tab:gray",
               label="cache misses"),
    ]
    ax.set_ylabel("per stage")
    ax.set_ylim(bottom=0)
    ax.grid(True, axis="y", alpha=GRID_ALPHA)
    right = ax.twinx()
    handles += right.plot(x, [_nan(s.loaded_model_count) for s in stages], marker="o", color="black",
                          label="LoadedModelCount (stage end)")
    right.set_ylabel("models loaded")
    handles += _marker_handles(stages)
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.01), ncol=len(handles),
              fontsize=LEGEND_FONT_SIZE, frameon=False)
    for axis in (ax, right):
        axis.yaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_ylim(0, max([s.loaded_model_count or 0 for s in stages] + [1]) * 1.1)
    ax.set_xlabel("concurrent users")
    _user_ticks(ax, stages)
    return png(fig)


# -- comparison ---------------------------------------------------------------------------



def _max_users_text(summary: "RunSummary") -> str:
    value = summary.overall.max_users_without_failure
    if value is None:
        return "none"
    return f"≥{value}" if not summary.overall.failed else str(value)


def _at_level(summary: "RunSummary", users: int | None, field: str) -> float | None:
    stage = stage_with_users(summary, users)
    return None if stage is None else getattr(stage, field)


def _text(value: float | None, pattern: str) -> str:
    return "n/a" if value is None else pattern.format(value)


# Like for like: latency and throughput at the highest user level every run held (common_users);
# then the models resident at the end and the users reached before the first failure.
# (label, value of a run at the common level, higher is better, text on the bar)
COMPARISON_METRICS: tuple[tuple[str, Callable[["RunSummary", int | None], "float | None"], bool,
                                Callable[["RunSummary", int | None], str]], ...] = (
    ("p95 at {users} users\n(ms; lower is better)", lambda s, u: _at_level(s, u, "latency_p95_ms"), False,
     lambda s, u: _text(_at_level(s, u, "latency_p95_ms"), "{:.1f} ms")),
    ("throughput at {users} users\n(requests/s)", lambda s, u: _at_level(s, u, "requests_per_s"), True,
     lambda s, u: _text(_at_level(s, u, "requests_per_s"), "{:.1f}/s")),
    ("models resident\nat the end", lambda s, u: s.overall.models_loaded, True,
     lambda s, u: "n/a" if s.overall.models_loaded is None else str(s.overall.models_loaded)),
    ("max users before\nfirst failure", lambda s, u: s.overall.max_users_without_failure, True,
     lambda s, u: _max_users_text(s)),
)


def normalised(values: Sequence[float | None], higher_is_better: bool) -> list[float | None]:
    """Each value relative to the best one (best = 1.0; lower-is-better metrics inverted,
    best / value, so a taller bar is always better). None and non-positive values give None
    (nothing to compare), except 0 for a higher-is-better metric, which is 0."""
    if higher_is_better:
        best = max((v for v in values if v is not None), default=None)
        if not best or best <= 0:
            return [0.0 if v == 0 else None for v in values]
        return [None if v is None else v / best for v in values]
    positive = [v for v in values if v is not None and v > 0]
    if not positive:
        return [None] * len(values)
    best = min(positive)
    return [best / v if v is not None and v > 0 else None for v in values]


def comparison_chart(summaries: Sequence["RunSummary"]) -> bytes:
    labels = distinct_labels(summaries)
    fig = figure(max(10, 2.6 * len(COMPARISON_METRICS) + 0.4 * len(summaries)), 5.8)
    fig.suptitle("run comparison — each metric relative to the best run (1.0 = best, higher is better)", fontsize=11)
    ax = fig.add_subplot()
    colours = [f"C{i % 10}" for i in range(len(summaries))]
    width = 0.8 / len(summaries)
    users = common_users(list(summaries))
    for j, (_, getter, higher, text) in enumerate(COMPARISON_METRICS):
        scores = normalised([getter(s, users) for s in summaries], higher)
        for i, (summary, score) in enumerate(zip(summaries, scores)):
            xpos = j - 0.4 + width * (i + 0.5)
            ax.bar(xpos, score or 0.0, width * 0.92, color=colours[i], label=labels[i] if j == 0 else None)
            ax.annotate(text(summary, users), (xpos, score or 0.0), textcoords="offset points", xytext=(0, 3),
                        ha="center", va="bottom", fontsize=8, rotation=90 if len(summaries) > 4 else 0)
    ax.set_xticks(range(len(COMPARISON_METRICS)))
    shared = "no shared" if users is None else str(users)
    ax.set_xticklabels([name.format(users=shared) for name, *_ in COMPARISON_METRICS], fontsize=9)
    ax.set_ylim(0, 1.3)
    ax.set_ylabel("relative to best run")
    ax.axhline(1.0, color="black", linewidth=0.6, alpha=0.5)
    ax.grid(True, axis="y", alpha=GRID_ALPHA)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=min(3, len(summaries)),
              fontsize=LEGEND_FONT_SIZE)
    return png(fig)


# -- CloudWatch ---------------------------------------------------------------------------

# (title, y label, [(metric, stat, legend, line style)]); values are converted by their unit
# (microseconds -> ms), counts are per period (60 s: per minute).
CLOUDWATCH_PANELS: tuple[tuple[str, str, tuple[tuple[str, str, str, str], ...]], ...] = (
    ("ModelLatency", "ms", (
        ("ModelLatency", "Average", "average", "-"), ("ModelLatency", "p50", "p50", "-"),
        ("ModelLatency", "p90", "p90", "--"), ("ModelLatency", "p99", "p99", "--"),
        ("ModelLatency", "Maximum", "max", ":"))),
    ("OverheadLatency and ModelLoadingWaitTime", "ms", (
        ("OverheadLatency", "Average", "overhead avg", "-"), ("OverheadLatency", "p99", "overhead p99", "--"),
        ("ModelLoadingWaitTime", "Average", "load wait avg", "-"),
        ("ModelLoadingWaitTime", "Maximum", "load wait max", ":"))),
    ("invocations", "per minute", (
        ("Invocations", "Sum", "Invocations", "-"),
        ("InvocationsPerInstance", "Sum", "InvocationsPerInstance", "--"))),
    ("errors", "per minute", (
        ("Invocation4XXErrors", "Sum", "4XX errors", "-"), ("Invocation5XXErrors", "Sum", "5XX errors", "-"),
        ("ModelLoadingWaitTime", "SampleCount", "invocations that waited for a load", "--"))),
    ("utilisation (average per period)", "percent", (
        ("CPUUtilization", "Average", "CPU", "-"), ("MemoryUtilization", "Average", "memory", "-"),
        ("GPUUtilization", "Average", "GPU", "-"), ("GPUMemoryUtilization", "Average", "GPU memory", "-"))),
    ("models", "count", (
        ("LoadedModelCount", "Maximum", "LoadedModelCount max", "-"),
        ("LoadedModelCount", "Average", "LoadedModelCount avg", "--"))),
)
# drawn on the right axis of the "models" panel: ModelCacheHit's Average is the hit ratio (0..1)
CLOUDWATCH_HIT_RATIO = ("ModelCacheHit", "Average")


def cloudwatch_chart(summary: "RunSummary", saved: "CloudWatchMetrics") -> bytes:
    """A grid of the endpoint's CloudWatch time series over the run, minutes since the run
    started on x, stage starts as vertical lines. Raises ValueError when there is no datapoint."""
    period, series = saved.period_s, saved.series
    moments = [t for points in series.values() for t, _ in points]
    if not moments:
        raise ValueError("no datapoints")
    try:
        origin = utc_time(summary.run.started_at)
        stage_starts = [(s.start_t / 60.0, s.users) for s in summary.stages]
        x_label = "minutes since the run started (vertical lines: stage starts; top: users per stage)"
    except (TypeError, ValueError):
        origin, stage_starts = min(moments), []
        x_label = "minutes since the first datapoint"
    middle = timedelta(seconds=period / 2)  # a datapoint covers [t, t + period): drawn at its middle

    fig = figure(12, 9.5)
    fig.suptitle(f"CloudWatch metrics ({period} s periods) — endpoint {summary.run.endpoint} — "
                 f"{summary.label} — run {summary.run.run_id}", fontsize=10)
    axes = fig.subplots(3, 2, sharex=True).ravel()

    def minutes(points):
        return [((t + middle) - origin).total_seconds() / 60.0 for t, _ in points]

    for i, (ax, (title, unit, lines)) in enumerate(zip(axes, CLOUDWATCH_PANELS)):
        handles, values = [], []
        for metric, stat, legend, style in lines:
            points = series.get((metric, stat))
            if points:
                handles += ax.plot(minutes(points), [v for _, v in points], linestyle=style, marker=".",
                                   markersize=4, label=legend)
                values += [v for _, v in points]
        ratio = series.get(CLOUDWATCH_HIT_RATIO) if title == "models" else None
        if ratio:
            right = ax.twinx()
            handles += right.plot(minutes(ratio), [100 * v for _, v in ratio], color="black", linestyle=":",
                                  marker=".", markersize=4, label="cache hit ratio (right, %)")
            right.set_ylim(0, max([105.0] + [100 * v * 1.05 for _, v in ratio]))
            right.set_ylabel("cache hit ratio (%)")
        for start, _ in stage_starts:
            ax.axvline(start, color="black", alpha=0.25, linewidth=0.8)
        if i < 2 and stage_starts and len(stage_starts) <= 20:
            top = ax.secondary_xaxis("top")
            top.set_xticks([start for start, _ in stage_starts], [f"{users}u" for _, users in stage_starts])
            top.tick_params(labelsize=7, colors="#555")
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(unit)
        ax.grid(True, alpha=GRID_ALPHA)
        positive = [v for v in values if v > 0]
        if unit == "ms" and positive and max(positive) > 50 * min(positive):  # e.g. load waits of seconds next to ms overheads
            ax.set_yscale("log")
            unit += " (log scale)"
            ax.set_ylabel(unit)
        elif handles:
            ax.set_ylim(bottom=0)
        if handles:
            ax.legend(handles=handles, fontsize=7, loc="upper left")
        else:
            ax.text(0.5, 0.5, "no datapoints", transform=ax.transAxes, ha="center", va="center", color="#777")
    for ax in axes[-2:]:
        ax.set_xlabel(x_label, fontsize=8)
    return png(fig)
