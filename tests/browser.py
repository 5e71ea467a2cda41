"""Debian's Chromium driven by Playwright, for the page and report tests.

Playwright's own browser download is not reachable from CI machines, so the tests drive
``/usr/bin/chromium`` (``.ci/run`` installs it). Where it or the ``playwright`` package is
missing the tests skip with the reason, except under ``DSH_REQUIRE_BROWSER=1`` (set by
``.ci/run``), where they fail: in CI the browser tests always run.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
REQUIRE_ENV = "DSH_REQUIRE_BROWSER"


def require_browser() -> None:
    """Skip (or, under ``DSH_REQUIRE_BROWSER=1``, fail) unless Playwright and Chromium are here."""
    missing = []
    if importlib.util.find_spec("playwright") is None:
        missing.append("the playwright package")
    if not CHROMIUM.exists():
        missing.append(str(CHROMIUM))
    if not missing:
        return
    reason = f"the browser tests need {' and '.join(missing)} (apt-get install -y chromium)"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(reason)
    pytest.skip(reason, allow_module_level=True)


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (a Playwright ``Browser``), closed on exit."""
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox"], headless=True
        )
        try:
            yield browser
        finally:
            browser.close()
