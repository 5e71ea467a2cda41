"""``stores/sqlite/_commit.py``: ``SqliteBackend``, the commit rounds and how a failure is settled.

Real SQLite files in ``tmp_path``. Each session is created with ``_sync.acquire`` (the owner
row a commit checks) and driven through a ``SqliteStaging`` as a write handle would.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from dsh_agent_loop._errors import SequenceConflictError, SessionOwnershipLostError, StoreError
from dsh_agent_loop.events import Event
from dsh_agent_loop.stores.sqlite import _checkpoint
from dsh_agent_loop.stores.sqlite import _sync as sql
from dsh_agent_loop.stores.sqlite._checkpoint import WalCheckpointer
from dsh_agent_loop.stores.sqlite._commit import SqliteBackend, SqliteStaging
from dsh_agent_loop.stores.sqlite._connections import RETRY_DELAYS, Connections

from ..conftest import ev
from .test_connections import BUSY, IOERR, ME, Plan, faulty


@attrs.define
class Setup:
    path: Path
    plan: Plan
    conns: Connections
    checkpointer: WalCheckpointer
    backend: SqliteBackend

    async def session(self, sid: str, *events: Event, token: str | None = None) -> SqliteStaging:
        token = token or f"tok-{sid}"

        def acquire(conn: sqlite3.Connection) -> Any:
            return sql.acquire(conn, sid, ME, token, {"session_id": sid})

        await self.conns.on_writer(acquire)
        staging = SqliteStaging(sid, token, 0)
        staging.staged.extend(events)
        return staging

    def stored(self, sid: str) -> list[int]:
        with sqlite3.connect(self.path) as conn:
            rows = conn.execute("SELECT seq FROM events WHERE session_id=? ORDER BY seq", (sid,))
            return [int(seq) for (seq,) in rows]

    def counters(self) -> tuple[int, int, int, int]:
        b = self.backend
        return (b.commits, b.handles_committed, b.events_committed, b.retries)


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    plan = Plan()
    conns = Connections(
        str(tmp_path / "s.db"), synchronous="NORMAL", busy_timeout=0.0, factory=faulty(plan)
    )
    checkpointer = WalCheckpointer(conns)
    backend = SqliteBackend(conns, checkpointer)
    try:
        yield Setup(tmp_path / "s.db", plan, conns, checkpointer, backend)
    finally:
        async with conns.writer_lock, conns.reader_lock:
            await checkpointer.aclose()
            await conns.close()


async def flush_together(setup: Setup, *stagings: SqliteStaging) -> list[Exception | None]:
    """Flush every staging from its own task, all queued before the first round starts."""
    results: dict[int, Exception | None] = {}

    async def flush(i: int, staging: SqliteStaging) -> None:
        try:
            await setup.backend.flush(staging)
        except StoreError as exc:
            results[i] = exc
        else:
            results[i] = None

    # the writer lock holds the round back until all are queued
    async with trio.open_nursery() as nursery, setup.conns.writer_lock:
        for i, staging in enumerate(stagings):
            nursery.start_soon(flush, i, staging)
        await trio.testing.wait_all_tasks_blocked()
    return [results[i] for i in range(len(stagings))]


# --- commit rounds -------------------------------------------------------------------------------


async def test_one_flush_commits_its_staged_events(setup: Setup) -> None:
    s1 = await setup.session("s1", ev(0), ev(1))
    await setup.backend.flush(s1)
    assert (s1.stored_count, s1.staged, s1.rows) == (2, [], [])
    assert setup.stored("s1") == [0, 1]
    assert setup.counters() == (1, 1, 2, 0)
    s1.staged.append(ev(2))
    await setup.backend.flush(s1)
    assert setup.stored("s1") == [0, 1, 2]
    assert setup.counters() == (2, 2, 3, 0)
    assert await setup.backend.fetch(s1, 1, 3) == [ev(1), ev(2)]


async def test_queued_flushes_share_one_transaction(setup: Setup) -> None:
    stagings = [await setup.session(f"s{i}", ev(0), ev(1), ev(2)) for i in range(4)]
    assert await flush_together(setup, *stagings) == [None] * 4
    assert setup.counters() == (1, 4, 12, 0)  # one commit for four sessions
    for staging in stagings:
        assert staging.stored_count == 3
        assert setup.stored(staging.session_id) == [0, 1, 2]


async def test_a_refused_session_does_not_stop_the_others(setup: Setup) -> None:
    good = await setup.session("good", ev(0))
    lost = await setup.session("lost", ev(0))
    ahead = await setup.session("ahead", ev(0))
    await setup.conns.on_writer(
        lambda conn: conn.execute("DELETE FROM owners WHERE session_id='lost'")
    )
    other = SqliteStaging("ahead", ahead.token, 0, staged=[ev(0)])
    await setup.backend.flush(other)  # another writer with the same claim stored seq 0 already
    results = await flush_together(setup, good, lost, ahead)
    assert results[0] is None
    assert isinstance(results[1], SessionOwnershipLostError)
    assert isinstance(results[2], SequenceConflictError)
    assert "1 events are stored, the handle expected 0" in str(results[2])
    assert setup.stored("good") == [0]
    assert setup.stored("lost") == []
    # ownership lost is for good; a sequence conflict leaves the events staged
    assert lost.failure is results[1]
    assert ahead.failure is None
    assert ahead.staged == [ev(0)]
    with pytest.raises(SessionOwnershipLostError):
        await setup.backend.flush(lost)


async def test_an_event_that_cannot_be_encoded_fails_only_its_session(setup: Setup) -> None:
    good = await setup.session("good", ev(0))
    bad = await setup.session("bad", ev(0), Event("user/message", None, 0.0, {}))  # no seq
    results = await flush_together(setup, good, bad)
    assert results[0] is None
    assert isinstance(results[1], StoreError)
    assert "an event cannot be stored" in str(results[1])
    assert bad.failure is results[1]  # for good
    assert setup.stored("good") == [0]
    assert setup.stored("bad") == []


async def test_a_non_database_error_is_retried_one_session_at_a_time(setup: Setup) -> None:
    good = await setup.session("good", ev(0))
    # a session id SQLite cannot bind (a lone surrogate): the driver raises UnicodeEncodeError
    bad = SqliteStaging("bad\udc80", "tok", 0, staged=[ev(0)])
    results = await flush_together(setup, good, bad)
    assert results[0] is None  # committed alone, after the shared round failed
    assert isinstance(results[1], StoreError)
    assert isinstance(results[1].__cause__, UnicodeEncodeError)
    assert bad.staged == [ev(0)]  # nothing of it was stored
    assert setup.stored("good") == [0]
    assert setup.counters()[:3] == (1, 1, 1)


# --- database failures ------------------------------------------------------------------------


async def test_a_busy_file_is_retried_until_it_commits(
    setup: Setup, autojump_clock: trio.testing.MockClock
) -> None:
    s1 = await setup.session("s1", ev(0))
    setup.plan.add("BEGIN IMMEDIATE", "before", BUSY, times=2)
    start = trio.current_time()
    await setup.backend.flush(s1)
    assert trio.current_time() - start == pytest.approx(RETRY_DELAYS[0] + RETRY_DELAYS[1])
    assert setup.stored("s1") == [0]
    assert setup.counters() == (1, 1, 1, 2)


async def test_a_lasting_failure_fails_the_flush_and_keeps_the_events_staged(
    setup: Setup, autojump_clock: trio.testing.MockClock
) -> None:
    s1 = await setup.session("s1", ev(0), ev(1))
    setup.plan.add("BEGIN IMMEDIATE", "before", BUSY, times=len(RETRY_DELAYS) + 1)
    with pytest.raises(StoreError, match=r"injected before BEGIN IMMEDIATE") as info:
        await setup.backend.flush(s1)
    assert f"session {'s1'!r}" in str(info.value)
    assert setup.backend.retries == len(RETRY_DELAYS)
    assert (s1.staged, s1.stored_count, s1.failure, s1.flush_error) == (
        [ev(0), ev(1)],
        0,
        None,
        None,
    )
    await setup.backend.flush(s1)  # the file is free again: the same events commit
    assert setup.stored("s1") == [0, 1]


async def test_a_disk_error_is_not_retried(setup: Setup) -> None:
    s1 = await setup.session("s1", ev(0))
    setup.plan.add("INSERT INTO EVENTS", "before", 13)  # SQLITE_FULL
    with pytest.raises(StoreError, match="injected"):
        await setup.backend.flush(s1)
    assert setup.backend.retries == 0
    assert s1.staged == [ev(0)]
    assert setup.stored("s1") == []


async def test_a_commit_acknowledgement_lost_after_storing_counts_as_committed(
    setup: Setup,
) -> None:
    s1 = await setup.session("s1", ev(0), ev(1))
    s2 = await setup.session("s2", ev(0))
    setup.plan.add("COMMIT", "after", IOERR)
    assert await flush_together(setup, s1, s2) == [None, None]
    assert (s1.stored_count, s2.stored_count) == (2, 1)
    assert setup.stored("s1") == [0, 1]  # read back, not written twice
    assert setup.counters() == (1, 2, 3, 0)


async def test_an_unknown_outcome_ends_the_sessions(setup: Setup) -> None:
    s1 = await setup.session("s1", ev(0))
    setup.plan.add("COMMIT", "after", IOERR)
    setup.plan.add("SELECT SEQ, JSON", "before", IOERR)
    with pytest.raises(StoreError, match="the outcome of a commit is unknown"):
        await setup.backend.flush(s1)
    assert s1.failure is not None
    with pytest.raises(StoreError, match="outcome of a commit is unknown"):
        await setup.backend.flush(s1)


# --- release, renew, checkpoints -----------------------------------------------------------------


async def test_release_drops_an_empty_session_and_keeps_a_stored_one(setup: Setup) -> None:
    empty = await setup.session("empty")
    kept = await setup.session("kept", ev(0))
    await setup.backend.flush(kept)
    await setup.backend.release(empty, 10.0)
    await setup.backend.release(kept, 10.0)

    def rows(conn: sqlite3.Connection) -> tuple[list[Any], list[Any]]:
        owners = conn.execute("SELECT session_id FROM owners").fetchall()
        sessions = conn.execute("SELECT session_id FROM sessions ORDER BY 1").fetchall()
        return owners, sessions

    assert await setup.conns.on_writer(rows) == ([], [("kept",)])


async def test_renew_is_only_a_checkpoint(setup: Setup) -> None:
    s1 = await setup.session("s1")
    with trio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(trio.Cancelled):
            await setup.backend.renew(s1)


async def test_every_committed_round_counts_towards_a_checkpoint(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_checkpoint, "CHECKPOINT_EVERY", 2)
    s1 = await setup.session("s1")
    expected = [0, 1, 1, 2]  # a checkpoint starts every second round
    for i, checkpoints in enumerate(expected):
        s1.staged.append(ev(i))
        await setup.backend.flush(s1)
        async with setup.conns.writer_lock:
            await setup.checkpointer.aclose()  # waits for a checkpoint still running
        assert setup.checkpointer.checkpoints == checkpoints
