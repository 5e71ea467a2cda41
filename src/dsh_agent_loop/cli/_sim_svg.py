"""Inline SVG charts for the simulate report: line charts over time and histograms.

Pure functions from figures to SVG text. Every chart has a title, both axes with labelled ticks
(1, 2, 2.5 or 5 times a power of ten apart) and axis names; every text is escaped. Nothing is
fetched: no font, no image, no script; colours and sizes come from the page's inline CSS and
attributes, so a chart renders the same offline.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape
from typing import Final, final

import attrs

__all__ = ["Bar", "Line", "Marker", "Span", "bar_chart", "line_chart", "nice_axis"]

#: Chart size in pixels (the page scales it down on narrow screens).
WIDTH: Final = 760
_HEIGHT: Final = 300
_LEFT: Final = 78
_RIGHT: Final = 24
_BOTTOM: Final = 46
#: Height of one row above the plot (the legend, a phase band, a marker's label).
_ROW: Final = 14
#: Line colours, in order (cycled past the last).
PALETTE: Final = (
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
    "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
)  # fmt: skip
#: Legend entries shown before ``+N more``.
_LEGEND_MAX: Final = 8


@final
@attrs.frozen
class Line:
    """One line of a line chart: ``(x, y)`` points in x order."""

    name: str
    points: tuple[tuple[float, float], ...]
    dashed: bool = False


@final
@attrs.frozen
class Span:
    """A named stretch of the x axis (a phase of the run), drawn as a band above the plot."""

    name: str
    begin: float
    end: float


@final
@attrs.frozen
class Bar:
    """One bar of a histogram: ``count`` values in ``[lo, hi)``."""

    lo: float
    hi: float
    count: int


@final
@attrs.frozen
class Marker:
    """A vertical mark at ``at`` with a label above the plot (a percentile)."""

    key: str
    at: float
    label: str


@final
@attrs.frozen
class Axis:
    """An axis from ``lo`` to ``hi`` with ticks ``step`` apart."""

    lo: float
    hi: float
    step: float

    @property
    def ticks(self) -> list[float]:
        """The tick values, ``lo`` to ``hi``."""
        count = round((self.hi - self.lo) / self.step)
        return [self.lo + i * self.step for i in range(count + 1)]

    def label(self, value: float) -> str:
        """``value`` with as many decimals as the step needs."""
        decimals = max(0, -math.floor(math.log10(self.step) + 1e-9))
        if not math.isclose(self.step * 10**decimals, round(self.step * 10**decimals)):
            decimals += 1  # a step of 2.5 × 10^k
        return f"{value:,.{decimals}f}"


def nice_axis(lo: float, hi: float, ticks: int = 5, least_step: float = 0.0) -> Axis:
    """An axis over ``[lo, hi]`` with about ``ticks`` intervals (``least_step`` or more apart)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo, hi = 0.0, 1.0
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = max((hi - lo) / ticks, least_step)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * power >= raw * (1 - 1e-9))
    return Axis(math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step, step)


@final
@attrs.frozen
class _Plot:
    """Where the plot sits in the chart, and its axes."""

    top: float
    height: float
    x: Axis
    y: Axis

    @property
    def bottom(self) -> float:
        return self.height - _BOTTOM

    def px(self, x: float) -> float:
        return _LEFT + (x - self.x.lo) / (self.x.hi - self.x.lo) * (WIDTH - _LEFT - _RIGHT)

    def py(self, y: float) -> float:
        return self.bottom - (y - self.y.lo) / (self.y.hi - self.y.lo) * (self.bottom - self.top)


def _n(value: float) -> str:
    return f"{value:.1f}"


def _open(key: str, title: str, height: float) -> list[str]:
    return [
        f'<svg id="chart-{key}" class="chart" '
        f'viewBox="0 0 {WIDTH} {_n(height)}" width="{WIDTH}" height="{_n(height)}" '
        f'role="img" aria-labelledby="chart-{key}-title">',
        f'<title id="chart-{key}-title">{escape(title)}</title>',
        f'<rect class="bg" x="0" y="0" width="{WIDTH}" height="{_n(height)}"/>',
        f'<text class="title" x="{_LEFT}" y="20">{escape(title)}</text>',
    ]


def _frame(plot: _Plot, x_label: str, y_label: str) -> list[str]:
    """Grid, axes, their ticks with labels, and the axis names."""
    parts: list[str] = []
    left, right = _LEFT, WIDTH - _RIGHT
    for value in plot.y.ticks:
        y = _n(plot.py(value))
        parts.append(f'<line class="grid" x1="{left}" y1="{y}" x2="{right}" y2="{y}"/>')
        parts.append(
            f'<text class="tick y" x="{left - 6}" y="{y}">{escape(plot.y.label(value))}</text>'
        )
    bottom = _n(plot.bottom)
    for value in plot.x.ticks:
        x = _n(plot.px(value))
        parts.append(
            f'<line class="tick" x1="{x}" y1="{bottom}" x2="{x}" y2="{_n(plot.bottom + 5)}"/>'
        )
        parts.append(
            f'<text class="tick x" x="{x}" y="{_n(plot.bottom + 18)}">'
            f"{escape(plot.x.label(value))}</text>"
        )
    parts.append(f'<line class="axis" x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}"/>')
    parts.append(f'<line class="axis" x1="{left}" y1="{_n(plot.top)}" x2="{left}" y2="{bottom}"/>')
    middle = _n((plot.top + plot.bottom) / 2)
    parts.append(
        f'<text class="label x" x="{_n((left + right) / 2)}" y="{_n(plot.height - 6)}">'
        f"{escape(x_label)}</text>"
    )
    parts.append(
        f'<text class="label y" x="16" y="{middle}" transform="rotate(-90 16 {middle})">'
        f"{escape(y_label)}</text>"
    )
    return parts


def _legend(lines: Sequence[Line], y: float) -> list[str]:
    parts: list[str] = []
    x = float(_LEFT)
    for i, line in enumerate(lines[:_LEGEND_MAX]):
        colour = PALETTE[i % len(PALETTE)]
        dash = ' stroke-dasharray="5 3"' if line.dashed else ""
        parts.append(
            f'<line x1="{_n(x)}" y1="{_n(y - 4)}" x2="{_n(x + 18)}" y2="{_n(y - 4)}" '
            f'stroke="{colour}" stroke-width="2"{dash}/>'
        )
        parts.append(
            f'<text class="legend" x="{_n(x + 22)}" y="{_n(y)}">{escape(line.name)}</text>'
        )
        x += 30 + 7 * len(line.name[:40])
    if len(lines) > _LEGEND_MAX:
        more = len(lines) - _LEGEND_MAX
        parts.append(f'<text class="legend" x="{_n(x)}" y="{_n(y)}">+{more} more</text>')
    return parts


def _bands(spans: Sequence[Span], plot: _Plot, top: float) -> list[str]:
    parts: list[str] = []
    for i, span in enumerate(spans):
        x0, x1 = plot.px(span.begin), plot.px(max(span.end, span.begin))
        y = top + i * _ROW
        colour = PALETTE[(i + 4) % len(PALETTE)]
        parts.append(
            f'<rect class="phase" x="{_n(x0)}" y="{_n(y)}" width="{_n(max(x1 - x0, 1.0))}" '
            f'height="{_ROW - 3}" fill="{colour}"/>'
        )
        parts.append(
            f'<text class="phase" x="{_n(x0 + 3)}" y="{_n(y + _ROW - 5)}">'
            f"{escape(span.name)} {span.end - span.begin:.2f} s</text>"
        )
    return parts


def line_chart(
    key: str,
    title: str,
    labels: tuple[str, str],
    lines: Sequence[Line],
    spans: Sequence[Span] = (),
    y_floor: float = 1.0,
) -> str:
    """A line chart of ``lines`` (x labelled ``labels[0]``, y ``labels[1]``) from y = 0.

    ``spans`` are drawn as bands over the x axis; ``y_floor`` is the least top of the y axis.
    """
    xs = [x for line in lines for x, _ in line.points] + [s.end for s in spans] + [0.0]
    ys = [y for line in lines for _, y in line.points] + [y_floor]
    legend = len(lines) > 1
    top = 34 + (_ROW + 4 if legend else 0) + len(spans) * _ROW
    height = _HEIGHT + top - 34
    plot = _Plot(top + 8, height, nice_axis(min(xs), max(xs), 8), nice_axis(0.0, max(ys)))
    parts = _open(key, title, height)
    if legend:
        parts += _legend(lines, 34 + _ROW)
    parts += _bands(spans, plot, 34 + (_ROW + 4 if legend else 0))
    parts += _frame(plot, *labels)
    for i, line in enumerate(lines):
        colour = PALETTE[i % len(PALETTE)]
        points = " ".join(f"{_n(plot.px(x))},{_n(plot.py(y))}" for x, y in line.points)
        dash = ' stroke-dasharray="5 3"' if line.dashed else ""
        parts.append(
            f'<polyline class="series" data-series="{escape(line.name)}" fill="none" '
            f'stroke="{colour}" stroke-width="1.6"{dash} points="{points}"/>'
        )
    if not any(len(line.points) > 1 for line in lines):
        parts.append(_empty(plot, "too short a run for a rate: fewer than two samples"))
    parts.append("</svg>")
    return "\n".join(parts)


def _empty(plot: _Plot, why: str) -> str:
    x, y = _n((_LEFT + WIDTH - _RIGHT) / 2), _n((plot.top + plot.bottom) / 2)
    return f'<text class="empty" x="{x}" y="{y}">{escape(why)}</text>'


def bar_chart(
    key: str,
    title: str,
    labels: tuple[str, str],
    bars: Sequence[Bar],
    markers: Sequence[Marker] = (),
    *,
    whole: bool = False,
    tip: Callable[[Bar], str] | None = None,
) -> str:
    """A histogram of ``bars`` with ``markers`` (x labelled ``labels[0]``, y ``labels[1]``).

    ``whole``: the x values are whole numbers (ticks 1 or more apart, the axis one wider on each
    side). ``tip`` writes a bar's tooltip (default: its range and count).
    """
    edges = [b.lo for b in bars] + [b.hi for b in bars] + [m.at for m in markers]
    top = 34 + len(markers) * _ROW
    height = _HEIGHT + top - 34
    pad = 1.0 if whole else 0.0
    lo, hi = min(edges, default=0.0) - pad, max(edges, default=1.0) + pad
    x_axis = nice_axis(lo, hi, 8, 1.0 if whole else 0.0)
    plot = _Plot(top + 8, height, x_axis, nice_axis(0.0, max((b.count for b in bars), default=1)))
    parts = _open(key, title, height)
    parts += _frame(plot, *labels)
    base = plot.py(0.0)
    for bar in bars:
        x0, x1, y = plot.px(bar.lo), plot.px(bar.hi), plot.py(bar.count)
        said = (
            tip(bar) if tip else f"{plot.x.label(bar.lo)} to {plot.x.label(bar.hi)}: {bar.count:,}"
        )
        parts.append(
            f'<rect class="bar" x="{_n(x0)}" y="{_n(y)}" width="{_n(max(x1 - x0 - 1, 1.0))}" '
            f'height="{_n(base - y)}"><title>{escape(said)}</title></rect>'
        )
    for i, marker in enumerate(markers):
        at = plot.px(marker.at)
        x, y = _n(at), 34 + (i + 1) * _ROW - 3
        colour = PALETTE[(i + 1) % len(PALETTE)]
        anchor = "end" if at > WIDTH * 0.7 else "start"  # the label stays inside the chart
        parts.append(
            f'<line class="marker" x1="{x}" y1="{_n(y + 2)}" x2="{x}" y2="{_n(plot.bottom)}" '
            f'stroke="{colour}"/>'
        )
        parts.append(
            f'<text class="marker" data-marker="{escape(marker.key)}" x="{x}" y="{_n(y)}" '
            f'text-anchor="{anchor}" fill="{colour}">{escape(marker.label)}</text>'
        )
    if not bars:
        parts.append(_empty(plot, "nothing to count"))
    parts.append("</svg>")
    return "\n".join(parts)
