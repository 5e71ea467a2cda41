"""``stores/_postgres_sync.py``: the statements and each transaction, on a real PostgreSQL.

Needs ``DSH_TEST_POSTGRES_DSN`` (skipped otherwise, with the reason shown); the pure parts
(failure sorting, statements, rows) run without it. Each test gets tables of its own prefix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import attrs
import psycopg
import pytest

from dsh_agent_loop._errors import (
    SequenceConflictError,
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionNotFoundError,
    SessionOwnershipLostError,
    StoreError,
)
from dsh_agent_loop.events import Event
from dsh_agent_loop.stores import _postgres_sync as pg
from dsh_agent_loop.stores._rows import event_json

from .conftest import drop_pg_tables, ev, header, new_pg_prefix, postgres_dsn

# --- pure parts -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sqlstate", "lost", "retry"),
    [
        (None, True, True),
        ("08001", True, True),  # cannot establish
        ("08P01", True, True),  # protocol violation: class 08 as a whole
        ("57P01", True, True),
        ("57P04", False, False),  # database dropped: not a passing condition
        ("40001", False, True),
        ("40P01", False, True),  # deadlock
        ("55P03", False, True),
        ("55000", False, False),  # same class as 55P03, not transient
        ("23505", False, False),
        ("42P01", False, False),  # undefined table
    ],
)
def test_failures_are_sorted_by_sqlstate(sqlstate: str | None, lost: bool, retry: bool) -> None:
    cls = psycopg.OperationalError if sqlstate is None else psycopg.errors.lookup(sqlstate)
    exc = cls("injected")
    assert pg.connection_lost(exc) is lost
    assert pg.retryable(exc) is retry


def test_the_statements_carry_the_prefix() -> None:
    sql = pg.Sql.build("p_")
    assert [s.split("(")[0] for s in sql.schema] == [
        "CREATE TABLE IF NOT EXISTS p_sessions ",
        "CREATE TABLE IF NOT EXISTS p_events ",
        "CREATE TABLE IF NOT EXISTS p_leases ",
    ]
    names = ("sessions", "events", "leases")
    for field in attrs.fields(pg.Sql):
        if field.name == "schema":
            continue
        statement = getattr(sql, field.name)
        tables = [w for w in statement.replace(",", " ").split() if w.endswith(names)]
        assert tables, field.name
        assert all(t.startswith("p_") for t in tables), statement
    assert "FOR UPDATE" in sql.lease_check  # the flush locks the lease row
    assert "FOR UPDATE" in sql.lease_lock


def test_a_row_is_the_stored_json_and_its_hash() -> None:
    event = ev(3)
    row = pg.Row.of(event)
    assert (row.seq, row.type, row.json) == (3, "user/message", event_json(event))
    assert row.hash == hashlib.sha256(row.json.encode()).digest()
    odd = pg.Row.of(Event("odd/\udc80", 0, 0.0, {}))
    assert odd.type == "odd/\\udc80"  # a lone surrogate cannot be sent: escaped
    assert odd.type.isascii()


def test_lost_names_the_session() -> None:
    error = pg.lost("s1")
    assert isinstance(error, SessionOwnershipLostError)
    assert "'s1'" in str(error)


# --- on a real database -------------------------------------------------------------------------


@pytest.fixture
def db() -> Iterator[tuple[pg.Sql, pg.Conn]]:
    dsn, prefix = postgres_dsn(), new_pg_prefix()
    sql = pg.Sql.build(prefix)
    conn = psycopg.connect(dsn, autocommit=False)
    try:
        for statement in sql.schema:
            conn.execute(statement)
        conn.commit()
        yield sql, conn
    finally:
        conn.close()
        drop_pg_tables(dsn, prefix)


def claim(token: str = "t1", ttl: float = 60.0) -> pg.Claim:
    return pg.Claim(token, "host-a", 4242, ttl)


def rows(*seqs: int, **data: Any) -> list[pg.Row]:
    return [pg.Row.of(ev(seq, **data)) for seq in seqs]


def other() -> pg.Conn:
    """A second connection to the same database (another process's)."""
    return psycopg.connect(postgres_dsn(), autocommit=False)


def stored(sql: pg.Sql, conn: pg.Conn, sid: str) -> list[int]:
    found = [e.seq for e in pg.events(sql, conn, sid, 0, None)]
    conn.rollback()
    return [s for s in found if s is not None]


def test_create_flush_open_and_read(db: tuple[pg.Sql, pg.Conn]) -> None:
    sql, conn = db
    h = header("s1")
    epoch, count, text = pg.acquire(sql, conn, "s1", claim(), h)
    assert (epoch, count) == (1, 0)
    assert pg.infos(sql, conn, None) == []  # a session without events is not listed
    with pytest.raises(SessionNotFoundError):
        pg.header(sql, conn, "s1")
    conn.rollback()
    turn_end = Event("turn/end", 2, 2.0, {"reason": {"kind": "done"}})
    pg.flush(sql, conn, "s1", "t1", 1, [*rows(0, 1), pg.Row.of(turn_end)], '{"kind": "done"}')
    assert stored(sql, conn, "s1") == [0, 1, 2]
    assert pg.events(sql, conn, "s1", 1, 2) == [ev(1)]
    assert pg.header(sql, conn, "s1") == text
    (info,) = pg.infos(sql, conn, "s1")
    assert (info.session_id, info.agent_id, info.event_count) == ("s1", "agent-1", 3)
    assert info.last_turn_end == {"kind": "done"}
    conn.rollback()
    # the same claim opening it again: the next epoch, the stored count
    epoch, count, again = pg.acquire(sql, conn, "s1", claim(), None)
    assert (epoch, count, again) == (2, 3, text)


def test_acquire_refusals(db: tuple[pg.Sql, pg.Conn]) -> None:
    sql, conn = db
    with pytest.raises(SessionNotFoundError):
        pg.acquire(sql, conn, "nope", claim(), None)
    conn.rollback()
    pg.acquire(sql, conn, "s1", claim("t1"), header("s1"))
    with pytest.raises(SessionAlreadyOwnedError, match="pid 4242 on host host-a") as info:
        pg.acquire(sql, conn, "s1", claim("t2"), header("s1"))
    assert info.value.owner == "pid 4242 on host host-a"
    conn.rollback()
    pg.flush(sql, conn, "s1", "t1", 1, rows(0), None)
    with pytest.raises(SessionAlreadyExistsError):
        pg.acquire(sql, conn, "s1", claim("t1"), header("s1"))
    conn.rollback()


def test_an_expired_lease_is_taken_over_and_fences_the_old_owner(
    db: tuple[pg.Sql, pg.Conn],
) -> None:
    sql, conn = db
    pg.acquire(sql, conn, "s1", claim("old", ttl=0.0), header("s1"))  # expires at once
    # a never-flushed create is reclaimed by the next creator
    epoch, count, _ = pg.acquire(sql, conn, "s1", claim("new"), header("s1", note="second"))
    assert (epoch, count) == (2, 0)
    with pytest.raises(SessionOwnershipLostError):
        pg.flush(sql, conn, "s1", "old", 1, rows(0), None)
    conn.rollback()
    with pytest.raises(SessionOwnershipLostError):  # right token, stale epoch
        pg.flush(sql, conn, "s1", "new", 1, rows(0), None)
    conn.rollback()
    pg.flush(sql, conn, "s1", "new", 2, rows(0), None)
    assert stored(sql, conn, "s1") == [0]
    assert "second" in pg.header(sql, conn, "s1")
    conn.rollback()


def test_flush_refuses_after_the_lease_expired(db: tuple[pg.Sql, pg.Conn]) -> None:
    sql, conn = db
    pg.acquire(sql, conn, "s1", claim("t1", ttl=0.0), header("s1"))
    with pytest.raises(SessionOwnershipLostError):
        pg.flush(sql, conn, "s1", "t1", 1, rows(0), None)
    conn.rollback()
    assert not pg.renew(sql, conn, "s1", "t1", 1, 60.0)  # an expired lease is not renewed


def test_stored_seqs_are_a_sequence_conflict(db: tuple[pg.Sql, pg.Conn]) -> None:
    sql, conn = db
    pg.acquire(sql, conn, "s1", claim(), header("s1"))
    pg.flush(sql, conn, "s1", "t1", 1, rows(0, 1), None)
    with pytest.raises(SequenceConflictError, match="seqs already stored"):
        pg.flush(sql, conn, "s1", "t1", 1, rows(1, 2), None)
    conn.rollback()
    assert stored(sql, conn, "s1") == [0, 1]  # nothing of the refused batch


def failing_cursor(error: psycopg.Error) -> type[psycopg.Cursor[Any]]:
    class Fails(psycopg.Cursor[Any]):
        def executemany(self, query: Any, params_seq: Any, **kw: Any) -> None:
            raise error

    return Fails


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        (psycopg.errors.LockNotAvailable("injected"), pg.RetryableError),
        (psycopg.errors.DeadlockDetected("injected"), pg.RetryableError),
        (psycopg.OperationalError("injected: server closed the connection"), pg.RetryableError),
        (psycopg.errors.DiskFull("injected"), psycopg.errors.DiskFull),
    ],
)
def test_flush_sorts_failures_before_commit(
    db: tuple[pg.Sql, pg.Conn], error: psycopg.Error, raised: type[Exception]
) -> None:
    sql, conn = db
    pg.acquire(sql, conn, "s1", claim(), header("s1"))
    conn.cursor_factory = failing_cursor(error)
    with pytest.raises(raised) as info:
        pg.flush(sql, conn, "s1", "t1", 1, rows(0), None)
    if raised is pg.RetryableError:
        assert info.value.__cause__ is error
    conn.rollback()
    conn.cursor_factory = psycopg.Cursor
    assert stored(sql, conn, "s1") == []


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        (psycopg.OperationalError("injected: no reply to COMMIT"), pg.AmbiguousCommitError),
        (psycopg.errors.AdminShutdown("injected"), pg.AmbiguousCommitError),
        (psycopg.errors.SerializationFailure("injected"), pg.RetryableError),
        (psycopg.errors.DiskFull("injected"), psycopg.errors.DiskFull),
    ],
)
def test_flush_sorts_failures_of_commit(
    db: tuple[pg.Sql, pg.Conn],
    monkeypatch: pytest.MonkeyPatch,
    error: psycopg.Error,
    raised: type[Exception],
) -> None:
    sql, conn = db
    pg.acquire(sql, conn, "s1", claim(), header("s1"))

    def commit(conn: pg.Conn) -> None:
        raise error

    monkeypatch.setattr(pg, "commit", commit)
    with pytest.raises(raised):
        pg.flush(sql, conn, "s1", "t1", 1, rows(0), None)
    conn.rollback()


def test_resolve_reads_the_outcome_back(
    db: tuple[pg.Sql, pg.Conn], monkeypatch: pytest.MonkeyPatch
) -> None:
    sql, conn = db
    pg.acquire(sql, conn, "s1", claim(), header("s1"))
    batch = rows(0, 1)
    assert pg.resolve(sql, conn, "s1", batch) is False  # nothing stored
    real = pg.commit

    def acknowledged_lost(conn: pg.Conn) -> None:
        real(conn)  # the server committed; the reply never came
        raise psycopg.OperationalError("injected: connection lost")

    monkeypatch.setattr(pg, "commit", acknowledged_lost)
    with pytest.raises(pg.AmbiguousCommitError):
        pg.flush(sql, conn, "s1", "t1", 1, batch, None)
    with other() as second:
        assert pg.resolve(sql, second, "s1", batch) is True
        different = rows(0, 1, text="not what was sent")
        with pytest.raises(SequenceConflictError, match="stored events differ"):
            pg.resolve(sql, second, "s1", different)
        assert second.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_renew_release_and_delete(db: tuple[pg.Sql, pg.Conn]) -> None:
    sql, conn = db
    pg.acquire(sql, conn, "empty", claim(), header("empty"))
    pg.acquire(sql, conn, "kept", claim(), header("kept"))
    pg.flush(sql, conn, "kept", "t1", 1, rows(0), None)
    assert pg.renew(sql, conn, "kept", "t1", 1, 30.0)
    assert not pg.renew(sql, conn, "kept", "t1", 7, 30.0)  # another epoch
    assert not pg.renew(sql, conn, "kept", "xx", 1, 30.0)
    pg.release(sql, conn, "empty", "xx", 1, True)  # not the owner: nothing happens
    with other() as second, pytest.raises(SessionAlreadyOwnedError):
        pg.acquire(sql, second, "empty", claim("t2"), header("empty"))
    pg.release(sql, conn, "empty", "t1", 1, True)
    pg.release(sql, conn, "kept", "t1", 1, True)  # has events: kept, lease free
    count = conn.execute(f"SELECT count(*) FROM {sql.session_delete.split()[2]}").fetchone()
    assert count == (1,)
    epoch, n, _ = pg.acquire(sql, conn, "kept", claim("t2"), None)  # free for anyone now
    assert (epoch, n) == (2, 1)
    pg.delete(sql, conn, "kept")
    with pytest.raises(SessionNotFoundError):
        pg.header(sql, conn, "kept")
    conn.rollback()
    assert stored(sql, conn, "kept") == []
    for table in ("sessions", "events", "leases"):
        name = sql.schema[0].split()[5].replace("sessions", table)
        assert conn.execute(f"SELECT count(*) FROM {name}").fetchone() == (0,)
    conn.rollback()


def test_undecodable_stored_text_is_store_corrupt(db: tuple[pg.Sql, pg.Conn]) -> None:
    sql, conn = db
    pg.acquire(sql, conn, "s1", claim(), header("s1"))
    pg.flush(sql, conn, "s1", "t1", 1, [pg.Row(0, "x", "{not json", b"h")], None)
    with pytest.raises(StoreError) as info:
        pg.events(sql, conn, "s1", 0, None)
    assert info.value.code == "STORE_CORRUPT"
    conn.rollback()
