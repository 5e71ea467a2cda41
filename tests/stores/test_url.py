"""``store_from_url`` (``stores/url.py``): each URL form, and a clear error for a bad one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dsh_agent_loop.stores import JsonlStore, MemoryStore, SqliteStore, store_from_url

from .conftest import ev, header


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
