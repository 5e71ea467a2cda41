"""Every skipped test says why: ``pytest -rs`` without ``DSH_TEST_POSTGRES_DSN`` names the reason.

The PostgreSQL tests skip when the variable is unset, many of them from async fixtures run by
pytest-trio (``tests/conftest.py`` keeps those reasons). The suite's PostgreSQL selection is run in
a subprocess with the variable removed, and each ``SKIPPED`` line of its summary must carry a
reason, never pytest's bare ``Skipped``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: ``SKIPPED [COUNT] LOCATION: REASON`` in ``pytest -rs``'s short summary.
SKIP_LINE = re.compile(r"SKIPPED \[(\d+)\] (\S+?):(?: (.*))?$")


def _run_without_postgres(*selection: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DSH_TEST_POSTGRES_DSN"}
    env["COLUMNS"] = "400"  # summary lines are cut at the terminal width
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-rs", "-q", "-p", "no:cacheprovider", *selection],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_every_postgres_skip_names_its_reason() -> None:
    selection = ("tests/stores", "tests/faults", "tests/cli")
    done = _run_without_postgres("-k", "postgres or pg", *selection)
    # 0, or 1 when a test failed: that is another test's news; here only the skips count.
    assert done.returncode in (0, 1), done.stdout[-4000:] + done.stderr[-4000:]
    skips = [m for m in map(SKIP_LINE.match, done.stdout.splitlines()) if m is not None]
    skipped = sum(int(m.group(1)) for m in skips)
    assert skipped >= 50, done.stdout[-4000:]  # the async-fixture skips are among them
    bare = [m.group(0) for m in skips if m.group(3) in (None, "", "Skipped")]
    assert bare == []
    inside_pytest = [m.group(0) for m in skips if "_pytest" in m.group(2)]
    assert inside_pytest == []
    reasons = {m.group(3) for m in skips}
    assert any("DSH_TEST_POSTGRES_DSN" in reason for reason in reasons), reasons
