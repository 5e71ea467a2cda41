"""``stores/sqlite/_owner_lock.py``: each owning store's slot in ``<db>-owners``, and liveness.

Real files and real open-file-description locks. Two ``OwnerLock`` objects on one database
stand for two processes (OFD locks of two open files conflict even within one process); the
real multi-process and multi-namespace cases are in ``tests/stores/test_pid_namespaces.py``
and ``tests/stores/test_ownership.py``.
"""

from __future__ import annotations

import gc
import os
import socket
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from dsh_agent_loop._errors import SessionAlreadyOwnedError
from dsh_agent_loop.events import event_to_json
from dsh_agent_loop.stores import SqliteStore
from dsh_agent_loop.stores.sqlite import _sync as sql
from dsh_agent_loop.stores.sqlite._owner_lock import OwnerLock

from ..conftest import ev, header


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


HOST = socket.gethostname()


def mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_two_lockers_hold_different_slots_and_see_each_other(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    a, b = OwnerLock(db), OwnerLock(db)
    try:
        slot_a, slot_b = a.slot(), b.slot()
        assert slot_a is not None
        assert slot_b is not None
        assert slot_a != slot_b
        assert a.slot() == slot_a  # held: the same slot, no new lock
        assert a.held(slot_b)
        assert b.held(slot_a)
        assert a.held(slot_a)  # its own
        assert not a.held(slot_a + 1)  # nobody's
        assert os.path.getsize(db + "-owners") == 0  # locks only: nothing is written

        a.close()  # as the kernel does when the process dies
        assert a.held_slot is None
        assert not b.held(slot_a)
        assert a.slot() == slot_a  # locking again prefers the old slot
        assert b.held(slot_a)
    finally:
        a.close()
        b.close()


def test_a_lock_dropped_unclosed_closes_its_descriptor(tmp_path: Path) -> None:
    """A store never closed does not keep its lock (nor a descriptor) once it is gone."""
    db = str(tmp_path / "s.db")
    dropped, other = OwnerLock(db), OwnerLock(db)
    try:
        slot = dropped.slot()
        assert slot is not None
        assert other.held(slot)
        del dropped
        gc.collect()
        assert not other.held(slot)
    finally:
        other.close()


def test_a_preferred_slot_held_by_another_is_not_taken(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    a, b = OwnerLock(db), OwnerLock(db)
    try:
        slot_a = a.slot()
        assert slot_a is not None
        b._slot = slot_a  # (as if b had held it before a took it)
        slot_b = b.slot()
        assert slot_b is not None
        assert slot_b != slot_a
        assert a.held(slot_b)
    finally:
        a.close()
        b.close()


def test_the_lock_file_takes_the_database_files_mode(
    tmp_path: Path, permissive_umask: None
) -> None:
    fresh = OwnerLock(str(tmp_path / "none-yet.db"))  # no database file yet: private
    shared_db = tmp_path / "shared.db"
    shared_db.touch()
    os.chmod(shared_db, 0o660)  # a group-shared volume: the user's choice
    shared = OwnerLock(str(shared_db))
    try:
        fresh.slot()
        shared.slot()
        assert mode(fresh.path) == 0o600
        assert mode(shared.path) == 0o660
    finally:
        fresh.close()
        shared.close()


def test_an_existing_lock_file_keeps_its_mode(tmp_path: Path, permissive_umask: None) -> None:
    db = tmp_path / "s.db"
    db.touch()
    os.chmod(db, 0o600)
    (tmp_path / "s.db-owners").touch()
    os.chmod(tmp_path / "s.db-owners", 0o640)
    lock = OwnerLock(str(db))
    try:
        assert lock.slot() is not None
        assert mode(lock.path) == 0o640
    finally:
        lock.close()


async def test_owner_rows_carry_the_slot_and_a_dropped_lock_is_a_dead_owner(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as first, SqliteStore(path) as second:
        handle = await first.create(header("s1"))
        await handle.append([ev(0)])
        await handle.flush()
        row = sqlite3.connect(path).execute("SELECT pid, lock_slot, pid_ns FROM owners").fetchone()
        assert row == (
            os.getpid(),
            first._connections.owner_lock.held_slot,
            os.readlink("/proc/self/ns/pid"),
        )
        with pytest.raises(SessionAlreadyOwnedError, match=f"pid {os.getpid()} on host"):
            await second.open("s1", "write")  # same pid, another store: its lock is held
        first._connections.owner_lock.close()  # as the kernel does at the owner's death
        taken = await second.open("s1", "write")  # same host, same pid: dead all the same
        assert await taken.read() == [ev(0)]
        await taken.close()


async def test_aclose_keeps_the_lock_while_a_handle_still_owns_a_session(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SqliteStore(path)
    lock = store._connections.owner_lock
    handle = await store.create(header("s1"))
    await handle.append([ev(0)])
    await handle.flush()
    slot = lock.held_slot
    await store.aclose()  # a handle is still open: its session must stay owned
    assert lock.held_slot == slot
    async with SqliteStore(path) as other:
        with pytest.raises(SessionAlreadyOwnedError):
            await other.open("s1", "write")
    await handle.close()
    await store.aclose()  # nothing owned any more: the lock goes
    assert lock.held_slot is None
    async with SqliteStore(path) as other:
        reopened = await other.open("s1", "write")
        await reopened.abort()


async def test_a_file_of_the_first_schema_gains_the_columns_and_judges_old_rows_by_pid(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(OLD_SCHEMA)
    for sid in ("dead", "live"):
        conn.execute(
            "INSERT INTO sessions (session_id, agent_id, created_at, header) VALUES (?,?,?,?)",
            (sid, "a", "t", f'{{"session_id": "{sid}"}}'),
        )
        conn.execute(
            "INSERT INTO events VALUES (?, 0, 'user/message', ?)", (sid, event_to_json(ev(0)))
        )
    proc = await trio.lowlevel.open_process(["true"])
    await proc.wait()  # reaped: its pid names no process
    _, start_1 = sql.process_start_time(1)  # pid 1 lives (in this namespace)
    conn.execute("INSERT INTO owners VALUES ('dead', 't1', ?, ?, NULL, 0)", (HOST, proc.pid))
    conn.execute("INSERT INTO owners VALUES ('live', 't2', ?, 1, ?, 0)", (HOST, start_1))
    conn.close()

    async with SqliteStore(path) as store:
        taken = await store.open("dead", "write")  # an old row of a gone pid: dead
        assert await taken.read() == [ev(0)]
        await taken.close()
        with pytest.raises(SessionAlreadyOwnedError, match="pid 1 on host"):
            await store.open("live", "write")  # an old row of a live pid: live
    columns = [r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(owners)")]
    assert columns[-2:] == ["lock_slot", "pid_ns"]


OLD_SCHEMA = """
CREATE TABLE sessions (session_id TEXT PRIMARY KEY, agent_id TEXT NOT NULL,
    created_at TEXT NOT NULL, header TEXT NOT NULL, event_count INTEGER NOT NULL DEFAULT 0,
    last_turn_end TEXT);
CREATE TABLE events (session_id TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL,
    json TEXT NOT NULL, PRIMARY KEY (session_id, seq)) WITHOUT ROWID;
CREATE TABLE owners (session_id TEXT PRIMARY KEY, token TEXT NOT NULL, host TEXT NOT NULL,
    pid INTEGER NOT NULL, start_time TEXT, acquired_at REAL NOT NULL);
"""
