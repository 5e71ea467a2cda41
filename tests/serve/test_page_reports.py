"""The page's Reports view in a real browser, on a real ``dsh-agent serve --reports DIR``.

A real ``dsh-agent simulate --report`` writes the report the view lists; the test clicks its link
and checks the page that opens in the new tab (the report's heading and SVG charts, no handle on
the opener). A server without ``--reports`` shows how to get reports, and one with a token asks
for it first and then serves the report to the new tab with its cookie. Waits are Playwright's
bounded polls. ``DSH_UI_SCREENSHOTS=1`` writes ``docs/img/ui-reports.png`` (for docs/ui.md);
otherwise the screenshot goes to the test's temporary folder.
"""

from __future__ import annotations

import importlib
import os
import re
import secrets
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ..browser import chromium, require_browser
from .conftest import COMMAND, StartServed, environment

require_browser()  # skip the module, or fail it in CI, without Playwright and Chromium
expect = importlib.import_module("playwright.sync_api").expect

ROOT = Path(__file__).resolve().parents[2]
#: Milliseconds any one expectation may wait.
WAIT = 30_000
EMPTY_HINTS = ("dsh-agent serve --reports DIR", "dsh-agent simulate --report DIR/run.html")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    """A fresh browser context; the test fails if a script of any of its pages threw."""
    opened = browser.new_context(viewport={"width": 1200, "height": 480})
    opened.set_default_timeout(WAIT)
    thrown: list[str] = []
    opened.on("page", lambda page: page.on("pageerror", lambda error: thrown.append(str(error))))
    yield opened
    opened.close()
    assert thrown == [], thrown


@pytest.fixture(scope="module")
def reports_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding ``run.html``, written by a real ``dsh-agent simulate --report``."""
    cwd = tmp_path_factory.mktemp("simulate")
    folder = cwd / "reports"
    folder.mkdir()
    args = ["simulate", "--agents", "20", "--turns", "1", "--store", "memory:"]
    done = subprocess.run(
        [*COMMAND, *args, "--report", "reports/run.html"],
        cwd=cwd, env=environment(cwd), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (folder / "run.html").read_text().startswith("<!doctype html>")
    return folder


def shot(page: Any, name: str, tmp_path: Path) -> None:
    """Save a screenshot ``ui-<name>.png`` (into docs/img when DSH_UI_SCREENSHOTS=1)."""
    folder = ROOT / "docs" / "img" if os.environ.get("DSH_UI_SCREENSHOTS") == "1" else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"ui-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.read_bytes().startswith(b"\x89PNG")


def iso_millis(epoch: float) -> str:
    """``epoch`` as JavaScript's ``new Date(epoch * 1000).toISOString()`` writes it."""
    millis = int(epoch * 1000)
    when = datetime.fromtimestamp(millis // 1000, UTC)
    return f"{when:%Y-%m-%dT%H:%M:%S}.{millis % 1000:03d}Z"


def open_report(context: Any, page: Any, name: str) -> Any:
    """Click the report's link; the page it opened in a new tab, loaded."""
    link = page.locator(f'tr[data-name="{name}"]').get_by_test_id("report-link")
    with context.expect_page() as opened:
        link.click()
    report = opened.value
    report.wait_for_load_state()
    return report


def assert_is_the_report(report: Any, url: str) -> None:
    assert report.url == f"{url}/reports/run.html"
    expect(report).to_have_title(re.compile(r"^dsh-agent simulate: 20 agents on memory:"))
    expect(report.locator("h1")).to_have_text("dsh-agent simulate")
    charts = report.locator("svg.chart")
    expect(charts.first).to_be_visible()
    assert charts.count() >= 4  # throughput, memory, turn durations, steps per agent
    assert report.evaluate("window.opener") is None  # rel="noopener"


def test_reports_view_lists_a_simulate_report_and_opens_it(
    serve_factory: StartServed, context: Any, reports_dir: Path, tmp_path: Path
) -> None:
    older = reports_dir / "baseline.html"
    older.write_text((reports_dir / "run.html").read_text())
    three_days_ago = time.time() - 3 * 86_400
    os.utime(older, (three_days_ago, three_days_ago))
    (reports_dir / "notes.txt").write_text("not a report")
    served = serve_factory(worker=False, extra=("--reports", str(reports_dir)))
    with served.client() as http:
        listed = http.get("/api/reports").json()["reports"]
    assert [row["name"] for row in listed] == ["run.html", "baseline.html"]

    page = context.new_page()
    page.goto(f"{served.url}/")
    expect(page.get_by_test_id("list-view")).to_be_visible()
    page.get_by_test_id("nav-reports").click()

    expect(page).to_have_url(f"{served.url}/#/reports")
    expect(page.get_by_test_id("list-view")).to_be_hidden()
    expect(page.get_by_test_id("nav-reports")).to_have_attribute("aria-current", "page")
    expect(page.get_by_test_id("reports-empty")).to_be_hidden()
    rows = page.get_by_test_id("report-row")
    expect(rows).to_have_count(2)
    assert rows.evaluate_all("rows => rows.map((row) => row.dataset.name)") == [
        row["name"] for row in listed
    ]
    for row in listed:
        shown = page.locator(f'tr[data-name="{row["name"]}"]')
        link = shown.get_by_test_id("report-link")
        expect(link).to_have_text(row["name"])
        expect(link).to_have_attribute("href", f"/reports/{row['name']}")
        expect(link).to_have_attribute("target", "_blank")
        expect(link).to_have_attribute("rel", "noopener")
        size = shown.get_by_test_id("report-size")
        expect(size).to_have_attribute("data-bytes", str(row["size"]))
        expect(size).to_have_text(f"{row['size'] / 1024:.1f} KiB")
        expect(size).to_have_attribute("title", f"{row['size']:,} bytes")
        modified = shown.get_by_test_id("report-modified").locator("time")
        expect(modified).to_have_attribute("datetime", iso_millis(row["modified"]))
    shot(page, "reports", tmp_path)

    report = open_report(context, page, "run.html")
    assert_is_the_report(report, served.url)
    expect(page).to_have_url(f"{served.url}/#/reports")  # the list stays where it was

    page.get_by_test_id("nav-sessions").click()
    expect(page.get_by_test_id("list-view")).to_be_visible()
    expect(page.get_by_test_id("reports-view")).to_be_hidden()
    expect(page.get_by_test_id("nav-sessions")).to_have_attribute("aria-current", "page")
    expect(page.get_by_test_id("nav-reports")).not_to_have_attribute("aria-current", "page")


def test_without_reports_the_view_says_how_to_get_them(
    serve_factory: StartServed, context: Any
) -> None:
    served = serve_factory(worker=False)
    page = context.new_page()
    page.goto(f"{served.url}/#/reports")  # a link straight to the view

    empty = page.get_by_test_id("reports-empty")
    expect(empty).to_be_visible()
    for hint in EMPTY_HINTS:
        expect(empty).to_contain_text(hint)
    expect(page.get_by_test_id("reports-table")).to_be_hidden()
    expect(page.get_by_test_id("report-row")).to_have_count(0)
    expect(page.get_by_test_id("reports-error")).to_be_hidden()
    expect(page.get_by_test_id("nav-reports")).to_be_visible()

    page.get_by_test_id("home-link").click()
    expect(page.get_by_test_id("list-view")).to_be_visible()
    expect(page.get_by_test_id("reports-view")).to_be_hidden()


def test_with_a_token_the_report_opens_after_the_prompt(
    serve_factory: StartServed, context: Any, reports_dir: Path
) -> None:
    token = secrets.token_urlsafe(24)
    served = serve_factory(worker=False, token=token, extra=("--reports", str(reports_dir)))
    page = context.new_page()
    page.goto(f"{served.url}/#/reports")
    expect(page.get_by_test_id("token-view")).to_be_visible()
    expect(page.get_by_test_id("reports-view")).to_be_hidden()

    page.get_by_test_id("token-input").fill(token)
    page.get_by_test_id("token-submit").click()

    expect(page).to_have_url(f"{served.url}/#/reports")
    expect(page.get_by_test_id("reports-view")).to_be_visible()
    expect(page.locator('tr[data-name="run.html"]')).to_have_count(1)
    report = open_report(context, page, "run.html")
    assert_is_the_report(report, served.url)  # the new tab carried the cookie
    assert token not in report.url
