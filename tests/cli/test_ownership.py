"""A ``run`` or ``chat`` whose agent loses its session (or its store) exits 1 with one line.

Real processes on a real PostgreSQL store (``DSH_TEST_POSTGRES_DSN``): the CLI streams a slow
scripted reply while the test, from outside, takes the session over (a new owner token and epoch
in the lease row, as another process's takeover writes) or drops the events table, so the CLI's
next append is fenced or fails.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from .helpers import COMMAND, environment, pg_tables, postgres_dsn

WORDS = " ".join(f"word{n}" for n in range(120))
SLOW = f"""\
plugins:
  - name: '@deepseek-ai/dsh-agent-loop'
    config:
      agents:
        - {{id: main, provider: slow, model: m}}
providers:
  slow:
    kind: scripted
    latency_ms: 40
    loop: true
    replies:
      - text: "{WORDS}"
"""
LOST = (
    "main: stopped, another process took its session over; its events not yet stored are lost"
    " (OWNERSHIP_LOST: "
)
FAILED = (
    "main: stopped, its session store failed; its events not yet stored are lost (STORE_FAILED:"
)


@pytest.fixture
def store() -> Iterator[tuple[str, str]]:
    """The test server's DSN and a store URL on fresh tables."""
    dsn = postgres_dsn()
    with pg_tables(dsn) as prefix:
        yield dsn, f"{dsn}?table_prefix={prefix}"


def _prefix(url: str) -> str:
    return url.rpartition("table_prefix=")[2].partition("&")[0]


def _wait_for(dsn: str, query: str, process: subprocess.Popen[str]) -> str:
    """Poll ``query`` until it returns a row (its first column); the CLI must still run."""
    deadline = time.monotonic() + 60
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()
            try:
                row = conn.execute(query).fetchone()
            except psycopg.errors.UndefinedTable:
                row = None
            if row is not None:
                return str(row[0])
            time.sleep(0.02)
    raise AssertionError(f"not seen: {query}")


def _take_over(dsn: str, prefix: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"UPDATE {prefix}leases SET owner_token = 'another-process', epoch = epoch + 1,"
            " expires_at = clock_timestamp() + interval '1 hour'"
        )


def _drop_events(dsn: str, prefix: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {prefix}events")


def _start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*COMMAND, *args],
        cwd=cwd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(cwd),
    )


def _mid_turn(dsn: str, prefix: str, process: subprocess.Popen[str]) -> str:
    """Wait until the turn has started and is stored; the session id."""
    return _wait_for(
        dsn, f"SELECT session_id FROM {prefix}events WHERE type = 'turn/start'", process
    )


@pytest.mark.parametrize(
    ("fault", "expected"),
    [(_take_over, LOST), (_drop_events, FAILED)],
    ids=["taken-over", "store-failed"],
)
def test_run_exits_1_when_its_agent_loses_the_session_mid_turn(
    tmp_path: Path, store: tuple[str, str], fault: Callable[[str, str], None], expected: str
) -> None:
    dsn, url = store
    (tmp_path / "slow.yaml").write_text(SLOW, encoding="utf-8")
    process = _start(["run", "slow.yaml", "-q", "--store", url, "--prompt", "go"], tmp_path)
    try:
        session_id = _mid_turn(dsn, _prefix(url), process)
        fault(dsn, _prefix(url))
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 1, (out, err)
    assert len(err.splitlines()) == 1, err
    (line,) = err.splitlines()
    assert line.startswith(expected), line
    assert session_id in line or expected is FAILED, line
    assert "word0" in out  # what was shown before stays shown


def test_chat_leaves_with_1_when_its_session_is_taken_over_mid_turn(
    tmp_path: Path, store: tuple[str, str]
) -> None:
    dsn, url = store
    (tmp_path / "slow.yaml").write_text(SLOW, encoding="utf-8")
    process = _start(["chat", "slow.yaml", "--store", url], tmp_path)
    try:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
        session_id = _mid_turn(dsn, _prefix(url), process)
        _take_over(dsn, _prefix(url))
        process.wait(timeout=60)  # standard input stays open: the chat leaves by itself
        out, err = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 1, (out, err)
    (line,) = err.splitlines()
    assert line.startswith(LOST), line
    assert session_id in line


def test_chat_leaves_with_1_when_its_session_is_taken_over_while_idle(
    tmp_path: Path, store: tuple[str, str]
) -> None:
    dsn, url = store
    (tmp_path / "slow.yaml").write_text(SLOW, encoding="utf-8")
    # A short lease: the writer renews it every third of a second, and finds it gone.
    process = _start(["chat", "slow.yaml", "--store", f"{url}&lease_ttl=1"], tmp_path)
    try:
        prefix = _prefix(url)
        session_id = _wait_for(
            dsn, f"SELECT session_id FROM {prefix}leases WHERE epoch > 0", process
        )
        _take_over(dsn, prefix)
        process.wait(timeout=60)  # waiting for input, it leaves all the same
        out, err = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 1, (out, err)
    (line,) = err.splitlines()
    assert line.startswith(LOST), line
    assert session_id in line
