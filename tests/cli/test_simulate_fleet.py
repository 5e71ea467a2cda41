"""``dsh-agent simulate --workers N`` on a shared store: fleet workers, one merged summary.

Each test runs the verb in a subprocess, as a user would; its workers are real processes that
share a real SQLite file or a real PostgreSQL database (a fresh table prefix, dropped after).
"""

from __future__ import annotations

import json
import os
import secrets
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .helpers import PG_ENV, cli

#: The run every test makes: small, with two tool steps and two turns per agent.
ARGS = ("--agents", "200", "--turns", "2", "--tools", "1", "--seed", "7")
#: Two workers, each holding at most 20 live agents: neither can take every session at once.
FLEET = ("--workers", "2", "--concurrency", "20")


def _simulate(tmp_path: Path, store: str, *args: str, name: str = "sim.json") -> dict[str, Any]:
    done = cli(
        "simulate", "--store", store, "--json", name, *args, cwd=tmp_path, timeout=120
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary: dict[str, Any] = json.loads((tmp_path / name).read_text(encoding="utf-8"))
    summary["stdout"] = done.stdout
    return summary


def _check_merged(summary: dict[str, Any]) -> None:
    assert summary["workers"] == 2
    assert summary["agents"] == 200
    assert summary["turns_total"] == summary["turns_completed"] == 400
    assert summary["turn_ends"] == {"completed": 400}
    assert summary["steps"] == 400 * 2  # a tool step and a text step per turn
    assert summary["violations"] == 0
    activations = summary["activations"]
    assert len(activations) == 2
    assert all(n > 0 for n in activations), activations  # both workers took sessions
    assert sum(activations) >= 200  # every session activated at least once
    assert len(summary["worker_peak_mb"]) == 2
    out = summary["stdout"]
    assert "400 / 400" in out
    assert "2 workers" in out
    assert "fleet workers activated sessions" in out


def test_two_fleet_workers_on_sqlite_run_every_agent_once(tmp_path: Path) -> None:
    merged = _simulate(tmp_path, "sqlite:///sim.db", *ARGS, *FLEET)
    _check_merged(merged)
    # the same conversations as one process on its own memory store: replies are seeded
    alone = _simulate(tmp_path, "memory:", *ARGS, name="alone.json")
    assert alone["workers"] == 1
    assert merged["replies_digest"] == alone["replies_digest"]
    assert merged["events"] == alone["events"]


@pytest.fixture
def postgres_url() -> Iterator[str]:
    psycopg = pytest.importorskip("psycopg")
    dsn = os.environ.get(PG_ENV)
    if not dsn:
        pytest.skip(f"PostgreSQL tests need {PG_ENV}")
    prefix = f"dsh_t{secrets.token_hex(4)}_"
    yield f"{dsn}{'&' if '?' in dsn else '?'}table_prefix={prefix}"
    tables = ("events", "sessions", "leases", "fleet_workers", "fleet_sessions")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in (*tables, "fleet_messages", "fleet_commands"):
            conn.execute(f"DROP TABLE IF EXISTS {prefix}{table}")


def test_two_fleet_workers_on_postgres_run_every_agent_once(
    tmp_path: Path, postgres_url: str
) -> None:
    merged = _simulate(tmp_path, postgres_url, *ARGS, *FLEET)
    _check_merged(merged)


def test_a_store_no_fleet_can_share_is_still_bad_usage(tmp_path: Path) -> None:
    done = cli(
        "simulate", "--agents", "4", "--workers", "2", "--store", "jsonl:///sim", cwd=tmp_path
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "SQLite" in lines[0]
    assert "PostgreSQL" in lines[0]
    assert "--workers 1" in lines[0]
    assert not (tmp_path / "sim").exists()


def test_a_fleet_worker_that_fails_fails_the_run(tmp_path: Path) -> None:
    source = """
        import os

        from dsh_agent_loop import tool

        SHARD = os.environ.get("DSH_AGENT_SIM_SHARD")
        if SHARD is not None:
            with open(f"pid-{SHARD}", "w") as f:
                f.write(str(os.getpid()))
        if SHARD == "1":
            raise RuntimeError("worker one refuses to start")


        @tool
        async def noop() -> str:
            \"\"\"Do nothing.\"\"\"
            return "ok"
    """
    (tmp_path / "flaky.py").write_text(textwrap.dedent(source), encoding="utf-8")
    done = cli(
        "simulate", "--agents", "10", "--workers", "2", "--store", "sqlite:///sim.db",
        "--tool", "flaky:noop", "--json", "sim.json", cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "shard 1 of 2" in done.stderr
    assert "worker one refuses to start" in done.stderr
    assert "simulate on" not in done.stdout
    assert not (tmp_path / "sim.json").exists()
    started = tmp_path / "pid-0"  # the healthy worker, if it got as far as loading its tools
    if started.exists():
        with pytest.raises(ProcessLookupError):  # it was stopped, not left behind
            os.kill(int(started.read_text()), 0)
