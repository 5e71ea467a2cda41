"""``dsh-agent simulate --report PATH.html``: one self-contained page of the run's figures.

The verb runs as a user runs it (a subprocess, real worker processes, a real SQLite file); the
page is read back with ``html.parser`` and opened in Debian's Chromium with Playwright (sync
API: plain ``def`` tests, Playwright runs its own loop in the test thread).
"""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import attrs
import pytest

from dsh_agent_loop.cli._sim_report import render_report
from dsh_agent_loop.cli._sim_series import (
    MAX_POINTS,
    Point,
    ProcessSeries,
    RunFigures,
    Sampler,
    SimResult,
    throughput,
)
from dsh_agent_loop.cli._sim_summary import SimSummary
from dsh_agent_loop.cli._sim_svg import nice_axis

from ..browser import chromium
from .helpers import cli

CHARTS = ("throughput", "memory", "turns", "agent-steps", "gc")
#: The run of the single-process tests: 50 agents, 3 turns of a tool step and a text step.
RUN = ("--agents", "50", "--turns", "3", "--tools", "1", "--seed", "7")


class Page(HTMLParser):
    """What a test reads of a report: its tags, table rows, chart texts and bar tooltips."""

    ROW_KEYS = ("data-field", "data-row", "data-process", "data-turn-end")

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.rows: dict[tuple[str, str], list[str]] = {}
        self.charts: dict[str, list[tuple[str, str]]] = {}
        self._row: tuple[str, str] | None = None
        self._cell: list[str] | None = None
        self._chart: str | None = None
        self._text: tuple[str, list[str]] | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {name: value or "" for name, value in attrs}
        self.tags.append((tag, found))
        if tag == "tr":
            key = next(((k, found[k]) for k in self.ROW_KEYS if k in found), None)
            if key is not None:
                self._row = key
                self.rows[key] = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
        elif tag == "svg":
            self._chart = found["id"].removeprefix("chart-")
            self.charts[self._chart] = []
        elif tag in ("text", "title") and self._chart is not None:
            kind = found.get("class", "") if tag == "text" else "tip"  # a <title>: a tooltip
            self._text = (f"{kind} {found.get('data-marker', '')}".strip(), [])

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self.rows[self._row].append("".join(self._cell))
            self._cell = None
        elif tag == "tr":
            self._row = None
        elif tag in ("text", "title") and self._text is not None and self._chart is not None:
            self.charts[self._chart].append((self._text[0], "".join(self._text[1])))
            self._text = None
        elif tag == "svg":
            self._chart = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self._text is not None:
            self._text[1].append(data)

    def cells(self, kind: str, key: str) -> list[str]:
        return self.rows[(f"data-{kind}", key)]

    def texts(self, chart: str, kind: str) -> list[str]:
        return [text for k, text in self.charts[chart] if k == kind]

    def bar_counts(self, chart: str) -> list[int]:
        tips = [text for k, text in self.charts[chart] if k == "tip" and ":" in text]
        return [int(re.sub(r"\D", "", tip.rsplit(":", 1)[1])) for tip in tips]


def _simulate(tmp_path: Path, store: str, *args: str) -> tuple[dict[str, Any], str]:
    done = cli(
        "simulate", "--store", store, "--json", "sim.json", "--report", "sim.html", *args,
        cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary: dict[str, Any] = json.loads((tmp_path / "sim.json").read_text(encoding="utf-8"))
    return summary, (tmp_path / "sim.html").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """The single-process run, on a SQLite file whose name needs escaping."""
    tmp_path = tmp_path_factory.mktemp("report")
    summary, _ = _simulate(tmp_path, 'sqlite:///x<i>&y".db', *RUN)
    return summary, tmp_path / "sim.html"


def _check_self_contained(page: Page, text: str) -> None:
    names = [tag for tag, _ in page.tags]
    assert "script" not in names
    assert "link" not in names
    assert "img" not in names
    for tag, found in page.tags:
        for name in ("src", "href", "xlink:href", "srcset", "action"):
            assert name not in found, (tag, found)
    assert not re.search(r"https?://", text)
    assert "url(" not in text
    assert "@import" not in text


def _check_summary(page: Page, summary: dict[str, Any]) -> None:
    # every --json field, with its JSON value
    fields = {key for kind, key in page.rows if kind == "data-field"}
    assert fields == set(summary)
    for key, value in summary.items():
        name, cell = page.cells("field", key)
        assert name == key
        assert json.loads(cell) == value, key
    # the terminal's table, as it prints it
    assert page.cells("row", "steps/s")[1] == f"{summary['steps_per_s']:,.0f}"
    assert page.cells("row", "turns completed")[1] == (
        f"{summary['turns_completed']:,} / {summary['turns_total']:,}"
    )
    assert page.cells("row", "step latency p99")[1] == f"{summary['step_p99_ms']:.1f} ms"
    turns = f"{summary['turn_p50_ms']:.1f} / {summary['turn_p90_ms']:.1f} / "
    assert page.cells("row", "turn p50 / p90 / p99")[1] == f"{turns}{summary['turn_p99_ms']:.1f} ms"
    for kind, count in summary["turn_ends"].items():
        assert page.cells("turn-end", kind)[1] == f"{count:,}"


def _check_charts(page: Page, summary: dict[str, Any]) -> None:
    assert set(page.charts) == set(CHARTS)
    for chart in CHARTS:
        assert len(page.texts(chart, "title")) == 1, chart
        assert len(page.texts(chart, "tick x")) >= 2, chart
        assert len(page.texts(chart, "tick y")) >= 2, chart
        assert len(page.texts(chart, "label x")) == len(page.texts(chart, "label y")) == 1
    for key in ("p50", "p90", "p99"):
        assert page.texts("turns", f"marker {key}") == [f"{key} {summary[f'turn_{key}_ms']:.1f} ms"]
    assert sum(page.bar_counts("turns")) == summary["turns_total"]
    per_agent = summary["steps"] // summary["agents"]
    assert page.texts("agent-steps", "tip")[-1] == f"{per_agent} steps: {summary['agents']} agents"


def test_a_report_holds_the_runs_figures_and_nothing_from_outside(
    one_process: tuple[dict[str, Any], Path],
) -> None:
    summary, path = one_process
    text = path.read_text(encoding="utf-8")
    page = Page(text)
    assert summary["steps"] == 300
    assert summary["turns_completed"] == 150
    _check_self_contained(page, text)
    _check_summary(page, summary)
    _check_charts(page, summary)
    # the store's name is text, not markup
    assert "<i>" not in text
    assert page.cells("field", "store")[1] == json.dumps('sqlite:///x<i>&y".db')
    # the sampler saw every step begin and every turn end, and the paused collector's zeroes
    assert page.cells("process", "this process")[1:3] == ["paused", "0"]
    assert _sampled(text) == {"this process": (300, 150)}


def test_the_report_renders_in_chromium(
    one_process: tuple[dict[str, Any], Path], tmp_path: Path
) -> None:
    summary, path = one_process
    requests: list[str] = []
    with chromium() as browser:
        if True:  # the browser is closed by chromium()
            page = browser.new_page(viewport={"width": 900, "height": 1000})
            page.on("request", lambda request: requests.append(request.url))
            page.goto(path.as_uri())
            for chart in CHARTS:
                box = page.locator(f"#chart-{chart}").bounding_box()
                assert box is not None, chart
                assert box["width"] > 300, chart
                assert box["height"] > 150, chart
            xs = []
            for key in ("p50", "p90", "p99"):
                label = page.locator(f'#chart-turns text[data-marker="{key}"]')
                assert label.is_visible()
                assert label.text_content() == f"{key} {summary[f'turn_{key}_ms']:.1f} ms"
                box = page.locator(f"#chart-turns text[data-marker='{key}']").bounding_box()
                assert box is not None
                assert box["width"] > 0
                xs.append(float(label.get_attribute("x") or "nan"))
            assert xs == sorted(xs)  # the marks stand in the percentiles' order
            bars = page.locator("#chart-turns rect.bar")
            assert bars.count() > 0
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert requests == [path.as_uri()]  # the page itself, nothing else


def _process_rows(page: Page) -> dict[str, list[str]]:
    return {key: cells for (kind, key), cells in page.rows.items() if kind == "data-process"}


def _sampled(text: str) -> dict[str, tuple[int, int]]:
    """Steps and turns each process counted, from the processes table."""
    rows = re.findall(r"<tr><td>([^<]+)</td>(.*?)</tr>", text.split('id="processes"')[1])
    found = {}
    for label, cells in rows:
        values = re.findall(r'<td class="num">([^<]*)</td>', cells)
        if values[-1] != "none run":
            found[label] = (int(values[-2].replace(",", "")), int(values[-1].replace(",", "")))
    return found


def test_two_memory_shards_report_each_process(tmp_path: Path) -> None:
    summary, text = _simulate(tmp_path, "memory:", *RUN, "--workers", "2")
    page = Page(text)
    _check_self_contained(page, text)
    _check_summary(page, summary)
    _check_charts(page, summary)
    assert set(_process_rows(page)) == {"parent", "shard 0", "shard 1", "all"}
    assert _process_rows(page)["shard 1"][1] == "paused"  # a shard holds its agents: paused
    sampled = _sampled(text)
    assert set(sampled) == {"shard 0", "shard 1"}
    assert sum(steps for steps, _ in sampled.values()) == summary["steps"] == 300
    assert sum(turns for _, turns in sampled.values()) == summary["turns_completed"]
    memory = [text for kind, text in page.charts["memory"] if kind == "legend"]
    assert memory == ["parent", "shard 0", "shard 1"]


def test_a_fleet_on_sqlite_reports_its_workers(tmp_path: Path) -> None:
    summary, text = _simulate(
        tmp_path, "sqlite:///sim.db", *RUN, "--workers", "2", "--concurrency", "10"
    )
    page = Page(text)
    _check_self_contained(page, text)
    _check_summary(page, summary)
    _check_charts(page, summary)
    rows = _process_rows(page)
    assert set(rows) == {"parent", "worker 0", "worker 1", "all"}
    assert rows["worker 0"][1] == rows["worker 1"][1] == "enabled"  # fleet workers collect
    sampled = _sampled(text)
    assert sum(steps for steps, _ in sampled.values()) == summary["steps"] == 300
    assert sum(turns for _, turns in sampled.values()) == summary["turns_completed"]


def test_a_report_path_in_a_missing_directory_is_bad_usage_before_the_run(
    tmp_path: Path,
) -> None:
    done = cli(
        "simulate", "--agents", "5", "--store", "sqlite:///sim.db", "--report", "no/such/r.html",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "simulate: --report no/such/r.html: no such directory no/such"
    ]
    assert done.stdout == ""
    assert not (tmp_path / "sim.db").exists()  # the run never started
    (tmp_path / "taken").mkdir()
    done = cli("simulate", "--agents", "5", "--store", "memory:", "--report", "taken", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == "simulate: --report taken is a directory, not a file"


# -- the pure parts ---------------------------------------------------------------------------


def _series(label: str, start: float, steps: list[int], every: float = 1.0) -> ProcessSeries:
    points = tuple(
        Point(i * every, n, n // 2, 1_000_000 * (i + 1), 0.0, 0, False) for i, n in enumerate(steps)
    )
    return ProcessSeries(label, start, every, points)


def test_throughput_sums_the_processes_on_the_parents_time_line() -> None:
    early = _series("shard 0", 100.0, [0, 10, 20, 30])  # 10 steps a second from t = 0
    late = _series("shard 1", 101.0, [0, 30, 60])  # 30 a second from t = 1 (its own t = 0)
    parent = attrs.evolve(_series("parent", 100.0, [5, 5, 5, 5, 5]), runs_agents=False)
    rates = throughput([parent, early, late], origin=100.0)
    assert rates.bucket_s == 1.0
    assert [t for t, _ in rates.steps] == [0.5, 1.5, 2.5]
    assert [rate for _, rate in rates.steps] == [10.0, 40.0, 40.0]
    assert [rate for _, rate in rates.turns] == [5.0, 20.0, 20.0]


def test_a_series_is_thinned_past_max_points_and_keeps_its_totals() -> None:
    sampler = Sampler()
    for _ in range(MAX_POINTS + 1):
        sampler.steps += 3
        sampler.sample()
    assert len(sampler.points) == MAX_POINTS // 2 + 1
    assert sampler.interval_s == pytest.approx(0.2)
    assert sampler.points[-1].steps == 3 * (MAX_POINTS + 1)
    assert sampler.points[0].steps == 3
    record = sampler.series("shard 0").to_record()
    again = ProcessSeries.of_record(json.loads(json.dumps(record)), "shard 0")
    assert [p.steps for p in again.points] == [p.steps for p in sampler.points]


@pytest.mark.parametrize(
    "record",
    [
        None,
        {"start": 1.0, "interval_s": 0.1},
        {"start": 1.0, "interval_s": 0.1, "points": [[0, 1, 2]]},
        {"start": "1", "interval_s": 0.1, "points": []},
        {"start": 1.0, "interval_s": 0.1, "points": [[0, 1, 2, 3, "4", 5, 0]]},
        {"start": 1.0, "interval_s": 0.0, "points": []},
        {"start": 1.0, "interval_s": 0.1, "points": [[0, 0, 0, 0, 0, 0, 0]] * (MAX_POINTS + 3)},
    ],
)
def test_a_malformed_reported_series_is_refused(record: Any) -> None:
    with pytest.raises(ValueError):
        ProcessSeries.of_record(record, "shard 0")


@pytest.mark.parametrize(
    ("lo", "hi", "ticks"),
    [
        (0.0, 7.3, [0, 2, 4, 6, 8]),
        (0.0, 1.0, [0, 0.2, 0.4, 0.6, 0.8, 1.0]),
        (0.0, 10_300.0, [0, 2500, 5000, 7500, 10000, 12500]),
        (3.0, 3.0, [3, 4, 5, 6]),
    ],
)
def test_axes_end_on_round_ticks(lo: float, hi: float, ticks: list[float]) -> None:
    axis = nice_axis(lo, hi)
    assert axis.ticks == pytest.approx(ticks)
    assert axis.lo <= lo
    assert axis.hi >= hi


def test_everything_the_run_names_is_escaped() -> None:
    hostile = "<script>alert(1)</script>&\"'"
    summary = SimSummary(
        store=f"sqlite:///{hostile}", agents=1, turns_total=1, turns_completed=0,
        turn_ends={hostile: 1}, events=3, steps=0, wall_s=0.5, create_s=0.1, close_s=0.1,
        check_s=0.1, steps_per_s=0.0, step_p50_ms=0.0, step_p99_ms=0.0, mb_per_agent=0.1,
        violations=1, violation_samples=(hostile,), seed=0, tools=0, latency_ms=0.0,
    )  # fmt: skip
    figures = RunFigures(
        mode=hostile,
        start=0.0,
        processes=(_series(hostile, 0.0, [0, 1]),),
        phases=(),
        turn_histogram={},
        agent_steps={0: 1},
    )
    text = render_report(SimResult(summary, figures))
    assert "<script" not in text
    page = Page(text)
    assert page.cells("turn-end", hostile) == [hostile, "1"]
    assert page.cells("process", hostile)[0] == hostile
    assert f"<code>{html.escape(f'sqlite:///{hostile}')}</code>" in text
    assert f": {html.escape(hostile)}, 1 process sampled" in text
