"""Fixtures for the store tests: a factory of store objects per backend, sharing one location."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from dsh_agent_loop._session.store import SessionStore
from dsh_agent_loop.events import Event
from dsh_agent_loop.stores import JsonlStore, MemoryStore, SqliteStore

BACKENDS = ["memory", "sqlite", "jsonl", "postgres"]
PG_ENV = "DSH_TEST_POSTGRES_DSN"


def postgres_dsn() -> str:
    """Return the test DSN, or skip with a visible reason."""
    dsn = os.environ.get(PG_ENV)
    if not dsn:
        pytest.skip(f"PostgreSQL tests need {PG_ENV} (e.g. postgresql://postgres@127.0.0.1/test)")
    try:
        psycopg.connect(dsn, connect_timeout=3).close()
    except psycopg.Error as exc:
        pytest.skip(f"PostgreSQL at {PG_ENV}={dsn!r} is unreachable: {exc}")
    return dsn


def new_pg_prefix() -> str:
    return f"dsh_t{secrets.token_hex(4)}_"


def drop_pg_tables(dsn: str, prefix: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in ("events", "sessions", "leases"):
            conn.execute(f"DROP TABLE IF EXISTS {prefix}{table}")


def header(session_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "agent_id": "agent-1",
        "created_at": "2024-05-01T12:00:00Z",
        "format_version": 1,
        **extra,
    }


def ev(seq: int, type: str = "user/message", **data: Any) -> Event:
    return Event(type=type, seq=seq, time=float(seq), data=data or {"text": f"event {seq}"})


class StoreFactory:
    """Builds store objects of one backend on one shared location (file, directory, tables)."""

    def __init__(self, backend: str, make: Callable[..., SessionStore]) -> None:
        self.backend = backend
        self._make = make
        self.stores: list[SessionStore] = []

    def __call__(self, **options: Any) -> SessionStore:
        store = self._make(**options)
        self.stores.append(store)
        return store

    @property
    def durable(self) -> bool:
        return self.backend != "memory"


@pytest.fixture(params=BACKENDS)
async def store_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[StoreFactory]:
    backend: str = request.param
    cleanup: Callable[[], None] | None = None
    if backend == "memory":
        shared = MemoryStore()
        factory = StoreFactory(backend, lambda: shared)
    elif backend == "sqlite":
        factory = StoreFactory(backend, lambda **kw: SqliteStore(tmp_path / "sessions.db", **kw))
    elif backend == "jsonl":
        factory = StoreFactory(backend, lambda **kw: JsonlStore(tmp_path / "sessions", **kw))
    else:
        from dsh_agent_loop.stores.postgres import PostgresStore

        dsn, prefix = postgres_dsn(), new_pg_prefix()
        factory = StoreFactory(backend, lambda **kw: PostgresStore(dsn, table_prefix=prefix, **kw))

        def cleanup() -> None:
            drop_pg_tables(dsn, prefix)

    try:
        yield factory
    finally:
        for store in factory.stores:
            await store.aclose()
        if cleanup is not None:
            await trio.to_thread.run_sync(cleanup)


@pytest.fixture
async def store(store_factory: StoreFactory) -> SessionStore:
    return store_factory()
