"""``stores/_postgres_pool.py``: the lazy pool, its limit, failure wrapping and repeats.

Needs ``DSH_TEST_POSTGRES_DSN`` (skipped otherwise, with the reason shown), except the pure
``worth_retrying``. Each test gets tables of its own prefix; a connection class counts the
connections the pool opens.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from typing import Any

import attrs
import psycopg
import pytest
import trio

from dsh_agent_loop._errors import SessionNotFoundError, StoreError
from dsh_agent_loop.stores import _postgres_sync as pg
from dsh_agent_loop.stores._postgres_pool import POOL_SIZE, Pool, worth_retrying

from .conftest import drop_pg_tables, new_pg_prefix, postgres_dsn

DELAYS = (0.5, 1.0, 2.0)


def wrapped(cause: BaseException, cls: type[StoreError] = StoreError) -> StoreError:
    error = cls("wrapped")
    error.__cause__ = cause
    return error


def test_worth_retrying() -> None:
    assert worth_retrying(wrapped(psycopg.OperationalError("lost")))
    assert worth_retrying(wrapped(psycopg.errors.SerializationFailure("x")))
    unique = wrapped(psycopg.errors.UniqueViolation("x"))
    assert not worth_retrying(unique)
    assert worth_retrying(unique, any_error=True)
    # only the pool's own wrapping of a psycopg error is worth it
    assert not worth_retrying(wrapped(ValueError("bug")), any_error=True)
    assert not worth_retrying(StoreError("no cause"), any_error=True)
    lost = wrapped(psycopg.OperationalError("lost"), SessionNotFoundError)
    assert not worth_retrying(lost, any_error=True)


@attrs.define
class Db:
    dsn: str
    prefix: str
    opened: list[psycopg.Connection[Any]]
    pools: list[Pool] = attrs.Factory(list)

    def pool(self, delays: tuple[float, ...] = DELAYS) -> Pool:
        opened = self.opened

        class Counted(psycopg.Connection[Any]):
            @classmethod
            def connect(cls, *args: Any, **kwargs: Any) -> Any:
                conn = super().connect(*args, **kwargs)
                opened.append(conn)
                return conn

        pool = Pool(self.dsn, prefix=self.prefix, connection_class=Counted, retry_delays=delays)
        self.pools.append(pool)
        return pool


@pytest.fixture
async def db() -> AsyncIterator[Db]:
    db = Db(postgres_dsn(), new_pg_prefix(), [])
    try:
        yield db
    finally:
        for pool in db.pools:
            await pool.aclose()
        for conn in db.opened:
            conn.close()
        await trio.to_thread.run_sync(drop_pg_tables, db.dsn, db.prefix)


def backend_pid(sql: pg.Sql, conn: pg.Conn) -> int:
    return conn.info.backend_pid


async def test_connections_are_opened_lazily_and_reused(db: Db) -> None:
    pool = db.pool()
    assert db.opened == []
    first = await pool.run(backend_pid)
    assert await pool.run(backend_pid) == first
    assert len(db.opened) == 1
    assert not db.opened[0].autocommit  # each call is one transaction
    fresh = await pool.run(backend_pid, fresh=True)
    assert fresh != first
    assert len(db.opened) == 2


async def test_the_schema_is_created_once(db: Db) -> None:
    pool = db.pool()

    def tables(sql: pg.Sql, conn: pg.Conn) -> list[str]:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE %s ORDER BY 1",
            (db.prefix.replace("_", r"\_") + "%",),
        ).fetchall()
        return [r[0] for r in rows]

    names = [f"{db.prefix}{t}" for t in ("events", "leases", "sessions")]
    assert await pool.run(tables) == names
    await trio.to_thread.run_sync(drop_pg_tables, db.dsn, db.prefix)
    # a new connection of the same pool does not create them again ...
    with pytest.raises(StoreError, match="does not exist"):
        await pool.run(lambda sql, conn: conn.execute(sql.session_infos, (None, None)), fresh=True)
    # ... a new pool does, once
    again = db.pool()
    assert await again.run(tables) == names
    assert await again.run(tables, fresh=True) == names


async def test_a_transaction_left_open_is_rolled_back_at_checkin(db: Db) -> None:
    pool = db.pool()

    def leaves_open(sql: pg.Sql, conn: pg.Conn) -> None:
        conn.execute(sql.lease_seed, ("s1",))  # no commit

    def look(sql: pg.Sql, conn: pg.Conn) -> tuple[str, int]:
        row = conn.execute(f"SELECT count(*) FROM {db.prefix}leases").fetchone()
        assert row is not None
        return conn.info.transaction_status.name, int(row[0])

    await pool.run(leaves_open)
    assert len(db.opened) == 1
    conn = db.opened[0]
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert await pool.run(look) == ("INTRANS", 0)  # the same connection, nothing left over
    assert len(db.opened) == 1


async def test_a_closed_connection_is_not_returned_to_the_pool(db: Db) -> None:
    pool = db.pool()

    def closes(sql: pg.Sql, conn: pg.Conn) -> int:
        conn.close()
        return 1

    await pool.run(closes)
    await pool.run(backend_pid)
    assert len(db.opened) == 2
    assert db.opened[0].closed


async def test_at_most_pool_size_transactions_run_at_once(db: Db) -> None:
    pool = db.pool()
    calls = POOL_SIZE + 3
    lock = threading.Lock()
    running = peak = done = 0
    full = threading.Event()
    go = threading.Event()

    def hold(sql: pg.Sql, conn: pg.Conn) -> int:
        nonlocal running, peak, done
        with lock:
            running += 1
            peak = max(peak, running)
            if running == POOL_SIZE:
                full.set()
        go.wait(10)
        with lock:
            running -= 1
            done += 1
        return conn.info.backend_pid

    pids: list[int] = []

    async def one() -> None:
        pids.append(await pool.run(hold))

    async with trio.open_nursery() as nursery:
        for _ in range(calls):
            nursery.start_soon(one)
        assert await trio.to_thread.run_sync(full.wait, 10)
        await trio.testing.wait_all_tasks_blocked()
        assert (running, done) == (POOL_SIZE, 0)  # the others wait for a token
        go.set()
    assert peak == POOL_SIZE
    assert len(pids) == calls
    assert len(db.opened) == POOL_SIZE  # the late calls reused pooled connections
    assert len(set(pids)) == POOL_SIZE


async def test_failures_leave_as_store_errors(db: Db) -> None:
    pool = db.pool()

    def bad_sql(sql: pg.Sql, conn: pg.Conn) -> None:
        conn.execute("SELECT * FROM no_such_table_here")

    with pytest.raises(StoreError) as info:
        await pool.run(bad_sql, sid="s1")
    assert type(info.value) is StoreError
    assert isinstance(info.value.__cause__, psycopg.errors.UndefinedTable)
    assert str(info.value).startswith("postgres store, session 's1': ")
    assert "no_such_table_here" in str(info.value)

    def bug(sql: pg.Sql, conn: pg.Conn) -> None:
        raise KeyError("k")

    with pytest.raises(StoreError, match=r"^postgres store: KeyError: 'k'$"):
        await pool.run(bug)

    passed = [
        SessionNotFoundError("gone"),
        pg.RetryableError("again"),
        pg.AmbiguousCommitError("?"),
    ]
    for error in passed:

        def raises(sql: pg.Sql, conn: pg.Conn, error: Exception = error) -> None:
            raise error

        with pytest.raises(type(error)) as raised:
            await pool.run(raises)
        assert raised.value is error  # for the caller to sort, unwrapped


async def warm(pool: Pool, count: int) -> set[int]:
    """Leave ``count`` idle connections in ``pool``; return their backend pids."""
    arrived = threading.Barrier(count, timeout=10)

    def hold(sql: pg.Sql, conn: pg.Conn) -> int:
        arrived.wait()  # all open at once: ``count`` distinct connections
        return conn.info.backend_pid

    pids: set[int] = set()

    async def one() -> None:
        pids.add(await pool.run(hold))

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
    assert len(pids) == count
    return pids


async def test_run_again_repeats_a_lost_connection_on_a_new_one(
    db: Db, autojump_clock: trio.testing.MockClock
) -> None:
    pool = db.pool()
    pooled = await warm(pool, 3)  # idle connections that may be as dead as the lost one
    pids: list[int] = []

    def killed_twice(sql: pg.Sql, conn: pg.Conn) -> str:
        pids.append(conn.info.backend_pid)
        if len(pids) <= 2:  # the server ends this very backend, as a failover would
            conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        return "done"

    start = trio.current_time()
    assert await pool.run_again(killed_twice) == "done"
    assert trio.current_time() - start == pytest.approx(DELAYS[0] + DELAYS[1])
    assert pool.retries == 2
    assert pids[0] in pooled  # the first try takes a pooled connection
    assert len(set(pids)) == 3
    assert not set(pids[1:]) & pooled  # every repeat on a new connection
    assert len(db.opened) == 3 + 2
    killed = [c for c in db.opened if c.info.backend_pid in pids[:2]]
    assert all(c.closed for c in killed)  # the broken ones were not pooled


async def test_run_again_gives_up_after_the_last_delay(
    db: Db, autojump_clock: trio.testing.MockClock
) -> None:
    pool = db.pool()
    calls = 0

    def always_lost(sql: pg.Sql, conn: pg.Conn) -> None:
        nonlocal calls
        calls += 1
        raise psycopg.OperationalError("injected: server closed the connection")

    with pytest.raises(StoreError, match="server closed the connection"):
        await pool.run_again(always_lost)
    assert calls == len(DELAYS) + 1
    assert pool.retries == len(DELAYS)


async def test_run_again_does_not_repeat_what_will_not_pass(
    db: Db, autojump_clock: trio.testing.MockClock
) -> None:
    pool = db.pool()
    calls = 0

    def disk_full(sql: pg.Sql, conn: pg.Conn) -> None:
        nonlocal calls
        calls += 1
        raise psycopg.errors.DiskFull("injected")

    with pytest.raises(StoreError):
        await pool.run_again(disk_full)
    assert (calls, pool.retries) == (1, 0)
    with pytest.raises(StoreError):
        await pool.run_again(disk_full, any_error=True)  # releasing: any error is worth it
    assert (calls, pool.retries) == (1 + len(DELAYS) + 1, len(DELAYS))

    def not_found(sql: pg.Sql, conn: pg.Conn) -> None:
        nonlocal calls
        calls += 1
        raise SessionNotFoundError("s")

    calls = 0
    with pytest.raises(SessionNotFoundError):
        await pool.run_again(not_found, any_error=True)
    assert calls == 1


async def test_aclose_waits_for_running_calls_then_closes_idle_connections(db: Db) -> None:
    pool = db.pool()
    started, go = threading.Event(), threading.Event()

    def slow(sql: pg.Sql, conn: pg.Conn) -> int:
        started.set()
        go.wait(10)
        return 1

    closed = False

    async def close() -> None:
        nonlocal closed
        await pool.aclose()
        closed = True

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pool.run, slow)
        assert await trio.to_thread.run_sync(started.wait, 10)
        nursery.start_soon(close)
        await trio.testing.wait_all_tasks_blocked()
        assert not closed  # a thread still uses a connection
        go.set()
    assert closed
    (conn,) = db.opened
    assert conn.closed
    await pool.run(backend_pid)  # the pool reopens lazily
    assert len(db.opened) == 2
