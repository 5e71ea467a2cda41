"""``dsh-agent simulate --report PATH.html``: one self-contained HTML page of a finished run.

``render_report`` is a pure function of a ``SimResult`` (the summary and the sampled figures,
``_sim_series.py``) to the page's text. The page carries its CSS and its SVG charts
(``_sim_svg.py``) inline and refers to nothing outside itself: no script, no font, no image, no
link; its content-security policy forbids fetching anything anyway, so it opens offline and is
safe to serve as is. Every text that comes from the run (the store URL, turn-end kinds,
violation samples, process labels) is HTML-escaped, and every number on it is the run's:

- the summary table and line ``print_summary`` shows (``summary_rows``, ``summary_line``) and
  every ``--json`` field with its JSON value;
- steps and turns per second over time, summed over the processes that run agents;
- the turn-duration histogram with the summary's p50, p90 and p99 marked;
- agents by the steps their session holds;
- resident memory of each process over time (per process: a sum would count shared pages twice);
- the collector's share of each sampling interval, and a table of each process's collections
  and seconds in the collector. ``simulate`` pauses the collector in the processes that hold a
  run's agents (``docs/scale.md``): there the figures are 0, as measured, and the page says so.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Final

from ._setup import CliError
from ._sim_series import Point, ProcessSeries, RunFigures, SimResult, throughput
from ._sim_summary import LatencyHistogram, SimSummary, summary_line, summary_rows
from ._sim_svg import Bar, Line, Marker, Span, bar_chart, line_chart

__all__ = ["check_report_path", "render_report", "write_report"]

#: Bars of a histogram whose values are not few whole numbers.
_BINS: Final = 60
#: Whole-number values spread over at most this many get a bar each.
_WHOLE_SPREAD: Final = 60
#: What the time charts' x axis counts.
_SECONDS: Final = "seconds since the run began"

_CSS: Final = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
  background: #f5f6f8; color: #1d2330; }
main { max-width: 800px; margin: 0 auto; padding: 24px 16px 48px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 8px; }
p { margin: 6px 0; }
.lede, figcaption, .note { color: #4a5263; }
table { border-collapse: collapse; background: #fff; border: 1px solid #e1e4e8; margin: 8px 0; }
th, td { padding: 4px 12px; border-bottom: 1px solid #eceef1; text-align: left;
  vertical-align: top; }
th { font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font: 12px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  overflow-wrap: anywhere; }
figure { margin: 16px 0; background: #fff; border: 1px solid #e1e4e8; border-radius: 6px;
  padding: 8px; }
figcaption { font-size: 13px; padding: 4px 6px 0; }
svg.chart { display: block; width: 100%; height: auto; }
svg .bg { fill: #fff; }
svg text { font: 11px system-ui, sans-serif; }
svg text.title { font-size: 14px; font-weight: 600; }
svg text.tick.y { text-anchor: end; dominant-baseline: middle; }
svg text.tick.x, svg text.label, svg text.empty { text-anchor: middle; }
svg text.label, svg text.empty { fill: #4a5263; }
svg .grid { stroke: #eceef1; }
svg .axis, svg line.tick { stroke: #4a5263; }
svg rect.bar { fill: #1f77b4; }
svg rect.phase { opacity: 0.22; }
svg text.phase { font-size: 10px; }
svg line.marker { stroke-dasharray: 4 3; stroke-width: 1.5; }
svg text.marker { font-weight: 600; }
ul.violations { color: #b42318; }
"""


def check_report_path(path: str) -> None:
    """Refuse, before the run, a ``--report`` path that cannot be written.

    Raises:
        CliError: its directory is missing or not writable, or it is a directory (exit 2).
    """
    target = Path(path)
    folder = target.parent
    if not folder.is_dir():
        raise CliError(f"simulate: --report {path}: no such directory {folder}")
    if target.is_dir():
        raise CliError(f"simulate: --report {path} is a directory, not a file")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CliError(f"simulate: --report {path}: the directory {folder} is not writable")


def write_report(result: SimResult, path: str) -> None:
    """Write the report of ``result`` to ``path``.

    Raises:
        CliError: the file could not be written (exit 2).
    """
    page = render_report(result)
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(page)
    except OSError as error:
        raise CliError(f"simulate: cannot write the report {path}: {error.strerror}") from None


def render_report(result: SimResult) -> str:
    """The report page of ``result``: one HTML document, CSS and charts inline."""
    summary, figures = result.summary, result.figures
    title = f"dsh-agent simulate: {summary.agents:,} agents on {summary.store}"
    began = datetime.fromtimestamp(figures.start, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    processes = len(figures.processes)
    body = [
        "<h1>dsh-agent simulate</h1>",
        f'<p class="lede">{summary.agents:,} agents, {summary.turns_total:,} turns, on '
        f"<code>{escape(summary.store)}</code>: {escape(figures.mode)}, {processes} "
        f"{'process' if processes == 1 else 'processes'} sampled; run began {began}.</p>",
        *_summary_section(summary),
        "<h2>Over time</h2>",
        _throughput_figure(figures),
        _memory_figure(figures),
        "<h2>Distributions</h2>",
        _turn_figure(summary, figures),
        _steps_figure(figures),
        *_collector_section(figures),
        *_processes_section(figures),
        *_json_section(summary),
    ]
    return "\n".join(
        [
            "<!doctype html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            '<meta http-equiv="Content-Security-Policy" '
            "content=\"default-src 'none'; style-src 'unsafe-inline'\">",
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{escape(title)}</title>",
            f"<style>{_CSS}</style>",
            "</head>",
            "<body>",
            "<main>",
            *body,
            "</main>",
            "</body>",
            "</html>",
            "",
        ]
    )


def _row(cells: Iterable[str], *, head: str = "td", attrs: str = "") -> str:
    return f"<tr{attrs}>" + "".join(f"<{head}>{cell}</{head}>" for cell in cells) + "</tr>"


def _num(cell: str) -> str:
    return f'<td class="num">{cell}</td>'


def _summary_section(summary: SimSummary) -> list[str]:
    rows = [
        f'<tr data-row="{escape(name)}"><th scope="row">{escape(name)}</th>'
        f'<td class="num">{escape(value)}</td></tr>'
        for name, value in summary_rows(summary)
    ]
    parts = ["<h2>Summary</h2>", '<table id="summary">', *rows, "</table>"]
    parts.append(f'<p id="summary-line">{escape(summary_line(summary))}</p>')
    if summary.activations:
        each = ", ".join(
            f"{n:,} ({mb:,.0f} MB peak)"
            for n, mb in zip(summary.activations, summary.worker_peak_mb, strict=False)
        )
        parts.append(f"<p>fleet workers activated sessions: {escape(each)}</p>")
    ends = "".join(
        f'<tr data-turn-end="{escape(kind)}"><td>{escape(kind)}</td>{_num(f"{count:,}")}</tr>'
        for kind, count in summary.turn_ends.items()
    )
    head = '<tr><th>turns ended</th><th class="num">turns</th></tr>'
    parts.append(f'<table id="turn-ends">{head}{ends}</table>')
    if summary.violation_samples:
        items = "".join(f"<li><code>{escape(s)}</code></li>" for s in summary.violation_samples)
        said = f"{summary.violations:,} invariant violations; the first ones:"
        parts.append(f'<p>{said}</p><ul class="violations">{items}</ul>')
    return parts


def _spans(figures: RunFigures) -> list[Span]:
    return [Span(phase.name, phase.begin_s, phase.end_s) for phase in figures.phases]


def _figure(chart: str, caption: str) -> str:
    return f"<figure>\n{chart}\n<figcaption>{escape(caption)}</figcaption>\n</figure>"


def _throughput_figure(figures: RunFigures) -> str:
    rates = throughput(figures.processes, figures.start)
    lines = [Line("steps/s", rates.steps), Line("turns/s", rates.turns, dashed=True)]
    chart = line_chart(
        "throughput", "Steps and turns per second", (_SECONDS, "per second"), lines, _spans(figures)
    )
    runners = [p.label for p in figures.processes if p.runs_agents]
    caption = (
        f"Steps begun (model calls answered) and turns ended per {rates.bucket_s:.2g} s, summed "
        f"over {', '.join(runners) or 'no process'}; the bands are the run's phases."
    )
    return _figure(chart, caption)


def _offset_points(
    process: ProcessSeries, origin: float, value: Callable[[Point], float]
) -> tuple[tuple[float, float], ...]:
    offset = process.start - origin
    return tuple((point.t + offset, value(point)) for point in process.points)


def _memory_figure(figures: RunFigures) -> str:
    lines = [
        Line(p.label, _offset_points(p, figures.start, lambda point: point.rss / 1e6))
        for p in figures.processes
    ]
    chart = line_chart(
        "memory", "Resident memory (RSS) of each process", (_SECONDS, "MB"), lines, _spans(figures)
    )
    caption = (
        "Each process's resident set, sampled with the rates; per process, not summed "
        "(pages the processes share would count twice)."
    )
    return _figure(chart, caption)


def _bins(values: Sequence[tuple[float, int]]) -> list[Bar]:
    """``values`` (``(value, count)``, sorted) in ``_BINS`` bars of equal width."""
    if not values:
        return []
    lo, hi = values[0][0], values[-1][0]
    if hi - lo <= 1e-9 * max(abs(hi), 1.0):
        half = max(abs(lo) * 0.01, 1e-6)
        return [Bar(lo - half, lo + half, sum(count for _, count in values))]
    width = (hi - lo) / _BINS
    counts = [0] * _BINS
    for value, count in values:
        counts[min(int((value - lo) / width), _BINS - 1)] += count
    return [Bar(lo + i * width, lo + (i + 1) * width, count) for i, count in enumerate(counts)]


def _turn_figure(summary: SimSummary, figures: RunFigures) -> str:
    values = sorted(
        (LatencyHistogram.value(bucket) * 1000, count)
        for bucket, count in figures.turn_histogram.items()
    )
    marks = (
        ("p50", summary.turn_p50_ms),
        ("p90", summary.turn_p90_ms),
        ("p99", summary.turn_p99_ms),
    )
    markers = [Marker(key, ms, f"{key} {ms:.1f} ms") for key, ms in marks] if values else []
    chart = bar_chart(
        "turns", "Turn durations", ("turn/start to turn/end (ms)", "turns"), _bins(values), markers
    )
    turns = sum(count for _, count in values)
    caption = (
        f"{turns:,} turns read back from the store, in {_BINS} bars of equal width (each value "
        "within 1% of the stored one); the marks are the summary's percentiles."
    )
    return _figure(chart, caption)


def _steps_figure(figures: RunFigures) -> str:
    held = sorted(figures.agent_steps.items())
    whole = bool(held) and held[-1][0] - held[0][0] <= _WHOLE_SPREAD
    if whole:
        bars = [Bar(steps - 0.4, steps + 0.4, count) for steps, count in held]
    else:
        bars = _bins([(float(steps), count) for steps, count in held])
    chart = bar_chart(
        "agent-steps",
        "Steps per agent",
        ("steps in the agent's session", "agents"),
        bars,
        whole=whole,
        tip=lambda bar: (
            f"{round((bar.lo + bar.hi) / 2)} steps: {bar.count:,} agents"
            if whole
            else f"{bar.lo:.1f} to {bar.hi:.1f} steps: {bar.count:,} agents"
        ),
    )
    agents = sum(count for _, count in held)
    return _figure(chart, f"{agents:,} agents by the steps their stored session holds.")


def _collector_state(points: Sequence[Point]) -> str:
    enabled = sum(point.gc_on for point in points)
    if not enabled:
        return "paused"
    return "enabled" if enabled == len(points) else "paused part of the time"


def _gc_shares(process: ProcessSeries, origin: float) -> tuple[tuple[float, float], ...]:
    """The collector's share (%) of each sampling interval of ``process``."""
    offset = process.start - origin
    return tuple(
        ((a.t + b.t) / 2 + offset, (b.gc_s - a.gc_s) / (b.t - a.t) * 100)
        for a, b in itertools.pairwise(process.points)
        if b.t > a.t
    )


def _collector_section(figures: RunFigures) -> list[str]:
    lines = [Line(p.label, _gc_shares(p, figures.start)) for p in figures.processes]
    chart = line_chart(
        "gc",
        "Share of time in the garbage collector",
        (_SECONDS, "% of the interval"),
        lines,
        _spans(figures),
    )
    caption = (
        "Seconds the cyclic collector ran (timed by a gc.callbacks hook) per sampling interval."
    )
    head = ("process", "collector", "collections", "seconds in it", "seconds sampled", "share")
    rows = [_row(head, head="th")]
    totals = [0, 0.0, 0.0]
    for process in figures.processes:
        first, last = process.points[0], process.points[-1]
        collections, seconds, wall = (
            last.gc_n - first.gc_n,
            last.gc_s - first.gc_s,
            last.t - first.t,
        )
        totals = [totals[0] + collections, totals[1] + seconds, totals[2] + wall]
        share = seconds / wall * 100 if wall > 0 else 0.0
        rows.append(
            f'<tr data-process="{escape(process.label)}"><td>{escape(process.label)}</td>'
            f"<td>{_collector_state(process.points)}</td>{_num(f'{collections:,}')}"
            f"{_num(f'{seconds:.3f}')}{_num(f'{wall:.2f}')}{_num(f'{share:.2f} %')}</tr>"
        )
    share = totals[1] / totals[2] * 100 if totals[2] > 0 else 0.0
    rows.append(
        f'<tr data-process="all"><th>all processes</th><td></td>{_num(f"{totals[0]:,}")}'
        f"{_num(f'{totals[1]:.3f}')}{_num(f'{totals[2]:.2f}')}{_num(f'{share:.2f} %')}</tr>"
    )
    note = (
        "simulate pauses the collector in a process that holds a run's agents, from the first "
        "agent's creation until every log is checked (docs/scale.md): a paused process shows "
        "the collections and seconds measured there, 0 unless something collected explicitly. "
        "Fleet workers unload agents as they go and run the collector."
    )
    return [
        "<h2>Garbage collector</h2>",
        _figure(chart, caption),
        '<table id="collector">',
        *rows,
        "</table>",
        f'<p class="note">{escape(note)}</p>',
    ]


def _processes_section(figures: RunFigures) -> list[str]:
    head = ("process", "samples", "every", "from s", "to s", "peak RSS", "steps", "turns")
    rows = [_row(head, head="th")]
    for process in figures.processes:
        points, offset = process.points, process.start - figures.start
        peak = max(point.rss for point in points) / 1e6
        counted = process.runs_agents
        rows.append(
            f"<tr><td>{escape(process.label)}</td>{_num(f'{len(points):,}')}"
            f"{_num(f'{process.interval_s:g} s')}{_num(f'{points[0].t + offset:.2f}')}"
            f"{_num(f'{points[-1].t + offset:.2f}')}{_num(f'{peak:,.1f} MB')}"
            f"{_num(f'{points[-1].steps:,}' if counted else 'none run')}"
            f"{_num(f'{points[-1].turns:,}' if counted else 'none run')}</tr>"
        )
    note = (
        "Each process samples itself; a worker's series is placed on this time line by the "
        "wall-clock time its sampler started. Steps and turns are summed over the processes "
        "that run agents; memory and the collector are shown per process."
    )
    return [
        "<h2>Processes sampled</h2>",
        '<table id="processes">',
        *rows,
        "</table>",
        f'<p class="note">{escape(note)}</p>',
    ]


def _json_section(summary: SimSummary) -> list[str]:
    rows = [
        f'<tr data-field="{escape(name)}"><th scope="row">{escape(name)}</th>'
        f"<td><code>{escape(json.dumps(value))}</code></td></tr>"
        for name, value in summary.to_json().items()
    ]
    return [
        "<h2>Every figure of <code>--json</code></h2>",
        '<table id="figures">',
        *rows,
        "</table>",
    ]
