"""``store_from_url`` (``stores/_url.py``): each URL form, and a clear error for a bad one."""

from __future__ import annotations

import sys
from pathlib import Path

import psycopg
import pytest
import trio

from dsh_agent_loop import open_runtime
from dsh_agent_loop._errors import ConfigError
from dsh_agent_loop.config import load_config
from dsh_agent_loop.stores import JsonlStore, MemoryStore, SqliteStore, store_from_url
from dsh_agent_loop.stores._url import StoreUrlError, parse_store_url

from .conftest import drop_pg_tables, ev, header, new_pg_prefix, postgres_dsn


async def make_session(store, sid: str, n: int) -> None:
    handle = await store.create(header(sid))
    await handle.append([ev(i) for i in range(n)])
    await handle.close()


def test_store_from_url_builds_each_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dsh_agent_loop.stores.postgres import PostgresStore

    monkeypatch.chdir(tmp_path)
    for url in ("memory", "memory:", "memory://"):
        assert isinstance(store_from_url(url), MemoryStore)
    relative = store_from_url("sqlite:///data/s.db")
    assert isinstance(relative, SqliteStore)
    assert relative._path == "data/s.db"
    absolute = store_from_url("sqlite:////var/lib/s.db")
    assert isinstance(absolute, SqliteStore)
    assert absolute._path == "/var/lib/s.db"
    jsonl = store_from_url("jsonl:///logs")
    assert isinstance(jsonl, JsonlStore)
    assert jsonl._directory == "logs"
    for url in ("postgresql://u@h:5432/db", "postgres://u@h/db?sslmode=disable"):
        pg = store_from_url(url)
        assert isinstance(pg, PostgresStore)
        assert pg._dsn == url


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite://relative.db", "sqlite:///"),
        ("sqlite:///", "empty"),
        ("jsonl:/x", "jsonl:///"),
        ("memory:/tmp/x", "no path"),
        ("redis://localhost", "unsupported"),
        ("postgresql:db", "postgresql://"),
        ("", "unsupported"),
    ],
)
def test_store_from_url_rejects_bad_urls(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        store_from_url(url)


async def test_store_from_url_relative_sqlite_path_is_used_from_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = store_from_url("sqlite:///nested/dir/s.db")
    try:
        await make_session(store, "s1", 1)
    finally:
        await store.aclose()
    assert (tmp_path / "nested" / "dir" / "s.db").is_file()


def test_the_scheme_and_a_memory_url_are_case_insensitive() -> None:
    assert isinstance(store_from_url("MEMORY"), MemoryStore)
    assert isinstance(store_from_url("Memory:"), MemoryStore)


def test_each_call_builds_a_new_store() -> None:
    assert store_from_url("memory:") is not store_from_url("memory:")


def test_a_postgres_url_without_psycopg_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "dsh_agent_loop.stores.postgres", None)
    with pytest.raises(ImportError, match=r"install dsh-agent-loop\[postgres\]"):
        store_from_url("postgresql://u@h/db")


async def test_a_jsonl_url_writes_under_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = store_from_url("jsonl:///logs")
    try:
        await make_session(store, "s1", 2)
    finally:
        await store.aclose()
    assert any("s1" in p.name for p in (tmp_path / "logs").iterdir())


# --- options in the query string ------------------------------------------------------------------


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _synchronous(store: SqliteStore) -> int:
    """``PRAGMA synchronous`` of a connection as the store opens them: 1 NORMAL, 2 FULL."""
    conn = store._connections.connect()
    try:
        return int(conn.execute("PRAGMA synchronous").fetchone()[0])
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("query", "level"), [("", 1), ("?durability=normal", 1), ("?durability=full", 2)]
)
async def test_sqlite_durability_from_the_url_reaches_the_connection(
    tmp_path: Path, query: str, level: int
) -> None:
    path = tmp_path / "s.db"
    store = store_from_url(f"sqlite:///{path}{query}")
    assert isinstance(store, SqliteStore)
    async with store:
        await make_session(store, "s1", 2)
        assert _synchronous(store) == level  # PRAGMA synchronous: 1 NORMAL, 2 FULL
        assert [s.session_id for s in await store.list()] == ["s1"]
    # The path stops at the "?": there is no file named "s.db?durability=full".
    names = _names(tmp_path)
    assert "s.db" in names
    assert [n for n in names if "?" in n] == []


def test_sqlite_busy_timeout_from_the_url_reaches_the_connection(tmp_path: Path) -> None:
    store = store_from_url(f"sqlite:///{tmp_path / 's.db'}?busy_timeout=2.5")
    assert isinstance(store, SqliteStore)
    conn = store._connections.connect()
    try:
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 2500
    finally:
        conn.close()


async def test_a_jsonl_url_takes_close_timeout(tmp_path: Path) -> None:
    store = store_from_url(f"jsonl:///{tmp_path / 'logs'}?close_timeout=2")
    assert isinstance(store, JsonlStore)
    assert store._files.close_timeout == 2.0
    await make_session(store, "s1", 1)
    assert (tmp_path / "logs" / "s1.jsonl").is_file()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "sqlite:///s.db?durabilty=full",
            "unknown option 'durabilty' (did you mean 'durability'? "
            "known: durability, busy_timeout, close_timeout)",
        ),
        ("sqlite:///s.db?durability=fast", "durability must be 'normal' or 'full', got 'fast'"),
        ("sqlite:///s.db?busy_timeout=soon", "busy_timeout must be a positive number of seconds"),
        ("sqlite:///s.db?close_timeout=0", "close_timeout must be a positive number of seconds"),
        ("sqlite:///s.db?durability=full&durability=normal", "'durability' is given twice"),
        ("sqlite:///s.db?full", "expected key=value, got 'full'"),
        ("jsonl:///logs?lease_ttl=3", "unknown option 'lease_ttl' (known: close_timeout)"),
        ("memory:?x=1", "a memory store takes no path or options"),
        ("postgresql://u@h/db?lease_ttl=nan", "lease_ttl must be a positive number of seconds"),
        ("postgresql://u@h/db?lease_ttl=-5", "lease_ttl must be a positive number of seconds"),
        ("postgresql://u@h/db?table_prefix=App", "table_prefix must match [a-z_][a-z0-9_]*"),
        (
            "postgresql://u@h/db?table_prefx=app_",
            "unknown option 'table_prefx' (did you mean 'table_prefix'? known: table_prefix, "
            "lease_ttl, close_timeout, or a libpq connection parameter)",
        ),
    ],
)
def test_a_bad_option_is_a_store_url_error_naming_the_key(url: str, message: str) -> None:
    with pytest.raises(StoreUrlError) as info:
        store_from_url(url)
    assert str(info.value).startswith(f"bad store URL {url!r}: ")
    assert message in str(info.value)


def test_store_url_error_is_a_value_error() -> None:
    assert issubclass(StoreUrlError, ValueError)


def test_postgres_options_leave_the_url_and_libpq_parameters_stay() -> None:
    url = "postgresql://u@h/db?sslmode=disable&table_prefix=app_&lease_ttl=15&connect_timeout=3"
    parsed = parse_store_url(url)
    assert parsed.target == "postgresql://u@h/db?sslmode=disable&connect_timeout=3"
    assert dict(parsed.options) == {"table_prefix": "app_", "lease_ttl": 15.0}
    assert parse_store_url("postgres://u@h/db?table_prefix=a_").target == "postgres://u@h/db"


def test_a_config_store_url_with_a_bad_option_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"store": "sqlite:///s.db?durability=fast"})
    assert str(info.value) == (
        "<config>: store: bad store URL 'sqlite:///s.db?durability=fast': "
        "durability must be 'normal' or 'full', got 'fast'"
    )
    assert load_config({"store": "sqlite:///s.db?durability=full"}).store == (
        "sqlite:///s.db?durability=full"
    )


async def test_open_runtime_builds_the_config_store_with_its_options(tmp_path: Path) -> None:
    path = tmp_path / "rt.db"
    async with open_runtime({"store": f"sqlite:///{path}?durability=full"}) as rt:
        assert isinstance(rt.store, SqliteStore)
        assert _synchronous(rt.store) == 2


async def test_postgres_table_prefix_and_lease_ttl_from_the_url() -> None:
    dsn = postgres_dsn()
    prefix = new_pg_prefix()
    sep = "&" if "?" in dsn else "?"
    store = store_from_url(f"{dsn}{sep}table_prefix={prefix}&lease_ttl=15")
    from dsh_agent_loop.stores.postgres import PostgresStore

    assert isinstance(store, PostgresStore)
    assert store.lease_ttl == 15.0
    try:
        async with store:
            handle = await store.create(header("s1"))
            await handle.append([ev(0)])
            await handle.flush()

            def lease_and_tables() -> tuple[float, list[str]]:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    row = conn.execute(
                        f"SELECT extract(epoch FROM expires_at - now()) FROM {prefix}leases"
                        " WHERE session_id = 's1'"
                    ).fetchone()
                    tables = conn.execute(
                        "SELECT table_name FROM information_schema.tables"
                        " WHERE table_name LIKE %s ORDER BY table_name",
                        (prefix.replace("_", r"\_") + "%",),
                    ).fetchall()
                assert row is not None
                return float(row[0]), [t for (t,) in tables]

            left, tables = await trio.to_thread.run_sync(lease_and_tables)
            await handle.close()
        assert 10.0 < left <= 15.5  # the default would be 30 s
        assert tables == [f"{prefix}events", f"{prefix}leases", f"{prefix}sessions"]
    finally:
        await trio.to_thread.run_sync(drop_pg_tables, dsn, prefix)
