"""Fixtures of the in-process fleet tests: a fleet-capable store per backend (SQLite, PostgreSQL).

``fleet_store()`` builds a new store object on one shared location each call (a worker and a
client each get their own, as two processes would); PostgreSQL uses fresh tables per test.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dsh_agent_loop.stores import SessionStore, SqliteStore
from tests.stores.conftest import postgres_dsn

TABLES = ("events", "sessions", "leases", "fleet_workers", "fleet_sessions", "fleet_messages",
          "fleet_commands")  # fmt: skip


@pytest.fixture(params=["sqlite", "postgres"])
def fleet_store(request: Any, tmp_path: Path) -> Iterator[Callable[[], SessionStore]]:
    """A factory of store objects on one location, for each backend that can carry a fleet."""
    if request.param == "sqlite":
        path = tmp_path / "fleet.db"
        yield lambda: SqliteStore(path)
        return
    from dsh_agent_loop.stores.postgres import PostgresStore

    dsn = postgres_dsn()
    prefix = f"dsh_f{secrets.token_hex(4)}_"
    yield lambda: PostgresStore(dsn, table_prefix=prefix, lease_ttl=3.0)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {prefix}{table}")
