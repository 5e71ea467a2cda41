"""``stores/sqlite/_store.py``: ``SqliteStore`` beyond the shared contract (busy retries, seams)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from dsh_agent_loop._errors import SequenceConflictError, StoreError
from dsh_agent_loop.events import Event, event_to_json
from dsh_agent_loop.stores import SqliteStore
from dsh_agent_loop.stores.sqlite import _sync as _sqlite_sync

from ..conftest import ev, header


async def stored(store: SqliteStore, sid: str) -> list[Any]:
    handle = await store.open(sid, "read")
    return list(await handle.read())


async def test_a_busy_database_is_waited_for_and_retried(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path, busy_timeout=0.02) as store:
        handle = await store.create(header("s1"))
        await handle.append([ev(0)])
        await handle.flush()
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        await handle.append([ev(1)])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(handle.flush)
            await trio.sleep(0.1)  # past the busy timeout: SQLITE_BUSY, retried
            blocker.execute("ROLLBACK")
            blocker.close()
        assert store.statistics().retries >= 1
        await handle.close()
        assert await stored(store, "s1") == [ev(0), ev(1)]


async def test_busy_for_too_long_fails_the_flush_and_keeps_the_events(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path, busy_timeout=0.01) as store:
        handle = await store.create(header("s1"))
        await handle.append([ev(0)])
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreError, match="locked"):
            await handle.flush()  # every retry found the lock taken
        blocker.execute("ROLLBACK")
        blocker.close()
        await handle.flush()  # nothing was stored, nothing was lost: the retry goes through
        await handle.close()
        assert await stored(store, "s1") == [ev(0)]


async def test_connection_factory_is_used_for_every_connection(tmp_path: Path) -> None:
    opened: list[str] = []

    class Counting(sqlite3.Connection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            opened.append("conn")

    async with SqliteStore(tmp_path / "s.db", connection_factory=Counting) as store:
        handle = await store.create(header("s1"))
        await handle.append([ev(0)])
        await handle.close()
        assert await stored(store, "s1") == [ev(0)]
        assert isinstance(store._connections.writer, Counting)
    assert len(opened) == 2  # the writer and the reader


async def test_rows_are_encoded_on_the_trio_thread_and_appends_during_a_commit_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded_on: set[int] = set()
    real_row, real_commit = _sqlite_sync.event_row, _sqlite_sync.commit
    in_commit, release = threading.Event(), threading.Event()
    committed: list[list[int]] = []

    def row(sid: str, event: Event) -> _sqlite_sync.Row:
        encoded_on.add(threading.get_ident())
        return real_row(sid, event)

    def gated_commit(conn: sqlite3.Connection, work: Any) -> list[Exception | None]:
        in_commit.set()
        release.wait(5)
        committed.append([row[1] for w in work for row in w.rows])
        return real_commit(conn, work)

    monkeypatch.setattr(_sqlite_sync, "event_row", row)
    monkeypatch.setattr(_sqlite_sync, "commit", gated_commit)
    async with SqliteStore(tmp_path / "s.db") as store:
        handle = await store.create(header("s1"))
        await handle.append([ev(0), ev(1), ev(2, "turn/end", reason={"kind": "completed"})])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(handle.flush)
            while not in_commit.is_set():
                await trio.sleep(0.001)
            await handle.append([ev(3), ev(4)])  # staged while the first three are committing
            release.set()  # the flush goes on with a second round for the two appended
        assert committed == [[0, 1, 2], [3, 4]]
        assert store.statistics().events_committed == 5
        await handle.close()
        assert await stored(store, "s1") == [ev(i) for i in range(2)] + [
            ev(2, "turn/end", reason={"kind": "completed"}),
            ev(3),
            ev(4),
        ]
        info = await store.stat("s1")
        assert info is not None
        assert info.last_turn_end == {"kind": "completed"}
    assert encoded_on == {threading.get_ident()}
    conn = sqlite3.connect(tmp_path / "s.db")
    texts = [row[0] for row in conn.execute("SELECT json FROM events ORDER BY seq")]
    conn.close()
    expected = [ev(0), ev(1), ev(2, "turn/end", reason={"kind": "completed"}), ev(3), ev(4)]
    assert texts == [event_to_json(e) for e in expected]


# --- the commit's checks: ownership and position, read from the owner row and the events ---


async def test_a_commit_that_would_leave_a_seq_gap_is_refused_and_stores_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        handle = await store.create(header("s1"))
        await handle.append([ev(0), ev(1)])
        await handle.flush()
        with sqlite3.connect(path, isolation_level=None) as raw:  # the last event disappears
            raw.execute("DELETE FROM events WHERE session_id='s1' AND seq=1")
        raw.close()
        await handle.append([ev(2), ev(3)])
        with pytest.raises(
            SequenceConflictError, match="1 events are stored, the handle expected 2"
        ):
            await handle.flush()
        assert await stored(store, "s1") == [ev(0)]  # no event 2 after the gap
        await handle.abort()


async def test_a_commit_onto_events_another_writer_stored_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        handle = await store.create(header("s1"))
        await handle.append([ev(0)])
        await handle.flush()
        with sqlite3.connect(path, isolation_level=None) as raw:  # seq 1 taken behind our back
            raw.execute(
                "INSERT INTO events VALUES ('s1', 1, 'user/message', ?)",
                (event_to_json(ev(1, text="theirs")),),
            )
        raw.close()
        await handle.append([ev(1), ev(2)])
        with pytest.raises(
            SequenceConflictError, match="2 events are stored, the handle expected 1"
        ):
            await handle.flush()
        assert await stored(store, "s1") == [ev(0), ev(1, text="theirs")]
        await handle.abort()


class _CountingConnection(sqlite3.Connection):
    """Counts the write transactions begun on it (each ``BEGIN IMMEDIATE``)."""

    begun = 0

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql == "BEGIN IMMEDIATE":
            type(self).begun += 1
        return super().execute(sql, *args)


async def test_a_runtime_exit_closes_2000_idle_sessions_in_few_transactions(
    tmp_path: Path,
) -> None:
    from dsh_agent_loop import AgentOptions, ScriptedModel, open_runtime

    path, n = tmp_path / "s.db", 2000
    async with SqliteStore(path, connection_factory=_CountingConnection) as store:
        async with open_runtime(store=store, providers={"scripted": ScriptedModel([])}) as rt:
            for i in range(n):
                await rt.agents.create(options=AgentOptions(id=f"a{i}", provider="scripted"))
            begun = _CountingConnection.begun
        closing = _CountingConnection.begun - begun  # the runtime's exit closed every handle
    assert closing <= n // 10  # releases share transactions (1,000 each at most)
    owners = sqlite3.connect(path).execute("SELECT count(*) FROM owners").fetchone()[0]
    assert owners == 0
    async with SqliteStore(path) as second:  # another store object takes every session over
        infos = await second.list()
        assert len(infos) == n
        for info in infos:
            handle = await second.open(info.session_id, "write")
            await handle.abort()
