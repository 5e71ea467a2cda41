"""Every store failure is a ``StoreError``, and it stays with the session it concerns.

- A SQLite transaction is rolled back on any exception (not only a database error), so the
  file's write lock is released: the other sessions of the file, in this store or another
  process's, commit at once.
- An event a store cannot encode fails only its own session; lone surrogates are not such an
  event: every store escapes them in its stored text and reads them back unchanged.
- A broken location (a path under a regular file, a directory where a file belongs, a corrupt
  database or row, an unreachable server) surfaces from every store method as a ``StoreError``
  naming the place, its cause chained, never a bare ``OSError``, ``ValueError`` or driver error.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
import trio.testing

from dsh_agent_loop._errors import SessionNotFoundError, StoreError
from dsh_agent_loop._frozen import FrozenDict
from dsh_agent_loop._session.store import SessionStore
from dsh_agent_loop.events import Event, make_event
from dsh_agent_loop.stores import JsonlStore, SqliteStore

from .conftest import StoreFactory, drop_pg_tables, ev, header, new_pg_prefix, postgres_dsn


async def stored(store: SessionStore, sid: str) -> list[Event]:
    handle = await store.open(sid, "read")
    try:
        return list(await handle.read())
    finally:
        await handle.close()


# --- SQLite: a failed transaction releases the file's lock ------------------------------------


class InjectedBug(Exception):
    """Stands for anything that is not a database error (a bug, a value the driver refuses)."""


def failing_inserts(poisoned: set[str]) -> type[sqlite3.Connection]:
    """A connection whose event inserts fail (not with a database error) for ``poisoned`` ids."""

    class Failing(sqlite3.Connection):
        def executemany(self, sql: str, rows: Any, /) -> sqlite3.Cursor:
            rows = list(rows)
            if sql.startswith("INSERT INTO events") and any(r[0] in poisoned for r in rows):
                raise InjectedBug("injected: failed in the middle of the transaction")
            return super().executemany(sql, rows)

    return Failing


async def test_sqlite_failed_commit_rolls_back_and_other_sessions_commit_at_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    poisoned: set[str] = set()
    async with (
        SqliteStore(path, connection_factory=failing_inserts(poisoned)) as store,
        SqliteStore(path, busy_timeout=0.05) as other,  # another process's view of the file
    ):
        bad = await store.create(header("bad"))
        await bad.append([ev(0)])
        poisoned.add("bad")
        with pytest.raises(Exception) as info:  # (its type is checked below)
            await bad.flush()

        # the lock is free: a second connection commits without waiting out its busy timeout
        good = await other.create(header("good"))
        await good.append([ev(0), ev(1)])
        with trio.fail_after(2):
            await good.flush()
        assert isinstance(info.value, StoreError)
        assert isinstance(info.value.__cause__, InjectedBug)
        assert info.value.code == "STORE_FAILED"
        assert "'bad'" in str(info.value)
        # and the failing store's own connection is usable for its other sessions
        mine = await store.create(header("mine"))
        await mine.append([ev(0)])
        await mine.flush()

        # nothing of the failed commit was stored; its events stay staged and commit later
        assert await other.stat("bad") is None
        poisoned.clear()
        await bad.flush()
        for handle in (bad, good, mine):
            await handle.close()
        assert await stored(other, "bad") == [ev(0)]
        assert await stored(other, "good") == [ev(0), ev(1)]
        assert await stored(other, "mine") == [ev(0)]


async def test_sqlite_a_failure_in_a_group_commit_fails_only_the_session_that_causes_it(
    tmp_path: Path,
) -> None:
    poisoned = {"bad"}
    async with SqliteStore(tmp_path / "s.db", connection_factory=failing_inserts(poisoned)) as s:
        handles = {sid: await s.create(header(sid)) for sid in ("a", "bad", "c")}
        for handle in handles.values():
            await handle.append([ev(0)])
        results: dict[str, BaseException | None] = {}

        async def flush(sid: str) -> None:
            try:
                await handles[sid].flush()
            except StoreError as exc:
                results[sid] = exc
            else:
                results[sid] = None

        before = s.statistics().commits
        await s._connections.writer_lock.acquire()  # held: the three flushes queue up for one round
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                for sid in handles:
                    nursery.start_soon(flush, sid)
                await trio.testing.wait_all_tasks_blocked()
                s._connections.writer_lock.release()
        assert results["a"] is None
        assert results["c"] is None
        assert isinstance(results["bad"], StoreError)
        assert s.statistics().commits - before == 2  # a and c, alone after the failed round
        assert [i.session_id for i in await s.list()] == ["a", "c"]
        for handle in handles.values():
            await handle.abort()


# --- events a store cannot encode -----------------------------------------------------------------


SURROGATES = "lone \ud800 and \udfff, a backslash \\\ud83d, and ok é"


async def test_lone_surrogates_round_trip_on_every_store(store_factory: StoreFactory) -> None:
    store = store_factory()
    head = header("s1", cwd="/home/\udcff\udcfe")  # as os.fsdecode makes of bad bytes
    handle = await store.create(head)
    events = [
        ev(0, text=SURROGATES),
        Event(type="x/\udc80", seq=1, time=1.0, data={"k\ud800": [SURROGATES]}),
    ]
    await handle.append(events)
    await handle.flush()
    await handle.close()

    fresh = store_factory()  # what is stored, not a cache
    assert await stored(fresh, "s1") == events
    reader = await fresh.open("s1", "read")
    assert reader.header["cwd"] == "/home/\udcff\udcfe"
    await reader.close()
    info = await fresh.stat("s1")
    assert info is not None
    assert info.event_count == 2
    writer = await fresh.open("s1", "write")
    await writer.append([*events, ev(2)])  # the stored ones compare equal: skipped
    await writer.close()
    assert await stored(fresh, "s1") == [*events, ev(2)]


def unencodable(seq: int) -> Event:
    """An event whose data JSON cannot encode (built past ``Event``'s own validation)."""
    return make_event("user/message", seq, 0.0, FrozenDict({"x": object()}))


async def test_an_event_that_cannot_be_encoded_fails_only_its_own_session(
    store_factory: StoreFactory,
) -> None:
    if store_factory.backend == "memory":
        pytest.skip("MemoryStore keeps the objects themselves: it encodes nothing")
    store = store_factory()
    bad = await store.create(header("bad"))
    good = await store.create(header("good"))
    await bad.append([ev(0), unencodable(1)])
    await good.append([ev(0)])
    with pytest.raises(StoreError, match="cannot be stored") as info:
        await bad.flush()
    assert isinstance(info.value.__cause__, TypeError)
    with pytest.raises(StoreError, match="cannot be stored"):
        await bad.flush()  # for good: the event can never be stored, nor any after it
    await good.flush()
    await good.append([ev(1)])
    await good.close()
    with pytest.raises(StoreError):
        await bad.close()
    assert await stored(store, "good") == [ev(0), ev(1)]
    assert await store.stat("bad") is None  # nothing of it was stored


# --- broken locations: every method raises a StoreError ------------------------------------------

Op = Callable[[SessionStore], Awaitable[object]]


async def _open_read(store: SessionStore) -> object:
    return await store.open("s1", "read")


async def _open_write(store: SessionStore) -> object:
    return await store.open("s1", "write")


async def _read(store: SessionStore) -> object:
    handle = await store.open("s1", "read")
    return await handle.read()


OPS: dict[str, Op] = {
    "create": lambda store: store.create(header("s2")),
    "open-read": _open_read,
    "open-write": _open_write,
    "read": _read,
    "list": lambda store: store.list(),
    "stat": lambda store: store.stat("s1"),
    "delete": lambda store: store.delete("s1"),
}


def under_a_file(tmp_path: Path) -> Path:
    (tmp_path / "file").write_text("a regular file")
    return tmp_path / "file" / "x"


def a_directory(tmp_path: Path) -> Path:
    (tmp_path / "dir").mkdir()
    return tmp_path / "dir"


def corrupt_sqlite(tmp_path: Path) -> Path:
    path = tmp_path / "corrupt.db"
    path.write_bytes(b"this is not a database, " * 400)
    return path


SQLITE_FAULTS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "path-under-a-file": (under_a_file, "STORE_FAILED"),
    "path-is-a-directory": (a_directory, "STORE_FAILED"),
    "corrupt-file": (corrupt_sqlite, "STORE_CORRUPT"),
}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("fault", SQLITE_FAULTS)
async def test_sqlite_broken_location_raises_store_error(
    tmp_path: Path, fault: str, op: str
) -> None:
    make, code = SQLITE_FAULTS[fault]
    path = make(tmp_path)
    async with SqliteStore(path) as store:
        with pytest.raises(StoreError) as info:
            await OPS[op](store)
    assert type(info.value) is StoreError
    assert info.value.code == code
    assert str(path) in str(info.value)
    assert info.value.__cause__ is not None


def jsonl_session_is_a_directory(tmp_path: Path) -> Path:
    (tmp_path / "d" / "s1.jsonl").mkdir(parents=True)
    (tmp_path / "d" / "s2.jsonl").mkdir(parents=True)
    return tmp_path / "d"


JSONL_FAULTS: dict[str, Callable[[Path], Path]] = {
    "dir-under-a-file": under_a_file,
    "session-file-is-a-directory": jsonl_session_is_a_directory,
}
JSONL_OPS = ["create", "open-read", "open-write", "read", "stat", "delete"]


@pytest.mark.parametrize("op", JSONL_OPS)
@pytest.mark.parametrize("fault", JSONL_FAULTS)
async def test_jsonl_broken_location_raises_store_error(
    tmp_path: Path, fault: str, op: str
) -> None:
    directory = JSONL_FAULTS[fault](tmp_path)
    store = JsonlStore(directory)
    with pytest.raises(StoreError) as info:
        await OPS[op](store)
    assert type(info.value) is StoreError
    assert str(directory) in str(info.value)
    assert isinstance(info.value.__cause__, OSError)


async def test_jsonl_list_of_a_path_under_a_file_raises_store_error(tmp_path: Path) -> None:
    store = JsonlStore(under_a_file(tmp_path))
    with pytest.raises(StoreError) as info:
        await store.list()
    assert isinstance(info.value.__cause__, NotADirectoryError)


@pytest.mark.parametrize("sid", ["", "lone-\ud800"], ids=["empty", "lone-surrogate"])
@pytest.mark.parametrize("op", ["create", "open-read", "open-write", "stat", "delete"])
async def test_jsonl_session_id_that_cannot_name_a_file_raises_store_error(
    tmp_path: Path, sid: str, op: str
) -> None:
    store = JsonlStore(tmp_path / "d")
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "create": lambda: store.create(header(sid)),
        "open-read": lambda: store.open(sid, "read"),
        "open-write": lambda: store.open(sid, "write"),
        "stat": lambda: store.stat(sid),
        "delete": lambda: store.delete(sid),
    }
    with pytest.raises(StoreError, match="cannot name a file"):
        await calls[op]()


async def test_sqlite_session_id_that_sqlite_cannot_bind_raises_store_error(
    tmp_path: Path,
) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        with pytest.raises(StoreError, match="UnicodeEncodeError"):
            await store.create(header("lone-\ud800"))
        with pytest.raises(StoreError, match="UnicodeEncodeError"):
            await store.stat("lone-\ud800")
        handle = await store.create(header("fine"))  # the writer is not stuck in a transaction
        await handle.append([ev(0)])
        await handle.close()
        assert await stored(store, "fine") == [ev(0)]


# --- a corrupt stored row ---------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
async def corrupt_row_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[SessionStore, Callable[[str], None]]]:
    """A store holding session s1 (2 events), and a function that runs SQL on its tables."""
    if request.param == "sqlite":
        path = tmp_path / "s.db"
        store: SessionStore = SqliteStore(path)

        def run_sql(statement: str) -> None:
            with sqlite3.connect(path) as conn:
                conn.execute(statement.format(p=""))
            conn.close()

        cleanup: Callable[[], None] = lambda: None  # noqa: E731
    else:
        from dsh_agent_loop.stores.postgres import PostgresStore

        dsn, prefix = postgres_dsn(), new_pg_prefix()
        store = PostgresStore(dsn, table_prefix=prefix)

        def run_sql(statement: str) -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(statement.format(p=prefix).encode())

        def cleanup() -> None:
            drop_pg_tables(dsn, prefix)

    try:
        handle = await store.create(header("s1"))
        await handle.append([ev(0), ev(1)])
        await handle.close()
        yield store, run_sql
    finally:
        await store.aclose()
        cleanup()


async def test_a_corrupt_stored_event_is_store_corrupt(
    corrupt_row_store: tuple[SessionStore, Callable[[str], None]],
) -> None:
    store, run_sql = corrupt_row_store
    run_sql("UPDATE {p}events SET json = 'not json' WHERE seq = 1")
    handle = await store.open("s1", "read")
    with pytest.raises(StoreError, match="s1") as info:
        await handle.read()
    assert info.value.code == "STORE_CORRUPT"
    assert isinstance(info.value.__cause__, ValueError)
    assert await handle.read(0, 1) == [ev(0)]  # the rest is still readable
    writer = await store.open("s1", "write")
    with pytest.raises(StoreError, match="does not decode"):
        await writer.append([ev(1)])  # comparing with the stored event reads it
    await writer.abort()


async def test_a_corrupt_stored_header_is_store_corrupt(
    corrupt_row_store: tuple[SessionStore, Callable[[str], None]],
) -> None:
    store, run_sql = corrupt_row_store
    run_sql("UPDATE {p}sessions SET header = '[1, 2' WHERE session_id = 's1'")
    for call in (lambda: store.open("s1", "read"), lambda: store.stat("s1"), store.list):
        with pytest.raises(StoreError, match="s1") as info:
            await call()
        assert info.value.code == "STORE_CORRUPT"
    with pytest.raises(StoreError, match="does not decode"):
        await store.open("s1", "write")
    # the failed open gave its ownership back: once repaired, the session opens for write
    run_sql("""UPDATE {p}sessions SET header = '{{"session_id": "s1"}}' WHERE session_id = 's1'""")
    writer = await store.open("s1", "write")
    await writer.close()


# --- PostgreSQL: an unreachable server --------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
async def test_postgres_unreachable_server_raises_store_error_after_its_retries(op: str) -> None:
    from dsh_agent_loop.stores.postgres import PostgresStore

    # a closed port: every connect is refused at once, retried after each delay, then given up
    store = PostgresStore("postgresql://postgres@127.0.0.1:1/test", retry_delays=(0.0, 0.0))
    with pytest.raises(StoreError) as info:
        await OPS[op](store)
    assert type(info.value) is StoreError
    assert isinstance(info.value.__cause__, psycopg.OperationalError)
    assert store.statistics().retries == 2
    await store.aclose()


async def test_specific_store_errors_keep_their_classes(store_factory: StoreFactory) -> None:
    store = store_factory()
    with pytest.raises(SessionNotFoundError):
        await store.open("absent", "read")
    with pytest.raises(SessionNotFoundError):
        await store.open("absent", "write")
