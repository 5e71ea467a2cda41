"""The SessionStore contract (docs/design.md#store-protocol), checked on every backend: memory,
sqlite, jsonl, postgres.

Each test gets a ``StoreFactory``; calling it twice gives two store objects on the same
location (the same file, directory or tables), which is how "durable" is checked. The memory
factory returns one shared object, for which the same statements hold.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from dsh_agent_loop._errors import (
    SequenceConflictError,
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionNotFoundError,
    SessionOwnershipLostError,
    StoreError,
)
from dsh_agent_loop._frozen import thaw
from dsh_agent_loop._session.store import ReadHandle, SessionStore, WriteHandle
from dsh_agent_loop.stores import SqliteStore

from .conftest import StoreFactory, drop_pg_tables, ev, header, new_pg_prefix, postgres_dsn


async def stored_events(store: SessionStore, sid: str) -> list[object]:
    handle = await store.open(sid, "read")
    try:
        return list(await handle.read())
    finally:
        await handle.close()


async def make_session(store: SessionStore, sid: str, n: int) -> None:
    handle = await store.create(header(sid))
    await handle.append([ev(i) for i in range(n)])
    await handle.close()


# --- create / open / list / stat / delete ------------------------------------------------------


async def test_created_session_is_absent_until_its_first_flush(store: SessionStore) -> None:
    handle = await store.create(header("s1"))
    assert isinstance(handle, WriteHandle)
    await handle.append([ev(0), ev(1)])
    assert await store.stat("s1") is None
    assert await store.list() == []
    with pytest.raises(SessionNotFoundError):
        await store.open("s1", "read")

    await handle.flush()

    info = await store.stat("s1")
    assert info is not None
    assert (info.session_id, info.agent_id, info.created_at) == (
        "s1",
        "agent-1",
        "2024-05-01T12:00:00Z",
    )
    assert info.event_count == 2
    assert [i.session_id for i in await store.list()] == ["s1"]
    assert await stored_events(store, "s1") == [ev(0), ev(1)]
    await handle.close()


async def test_header_round_trips(store_factory: StoreFactory) -> None:
    given = header(
        "s/ü 1%",
        cwd="/home/ada/проект",
        parent_session_id=None,
        extra={"nested": [1, 2.5, True, None, "x"]},
    )
    handle = await store_factory().create(given)
    assert thaw(handle.header) == given
    await handle.append([ev(0)])
    await handle.close()

    other = store_factory()
    reader = await other.open("s/ü 1%", "read")
    assert isinstance(reader, ReadHandle)
    assert reader.session_id == "s/ü 1%"
    assert thaw(reader.header) == given
    await reader.close()
    writer = await other.open("s/ü 1%", "write")
    assert thaw(writer.header) == given
    await writer.close()


async def test_list_and_stat_report_event_count_and_last_turn_end(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()
    first = await store.create(header("a"))
    await first.append(
        [
            ev(0, "turn/start"),
            ev(1, "turn/end", reason={"type": "completed"}),
            ev(2, "turn/start"),
        ]
    )
    await first.flush()
    # A later batch without a turn/end must keep the earlier one; a newer one replaces it.
    await first.append([ev(3)])
    await first.flush()
    second = await store.create(header("b", agent_id="agent-2"))
    await second.append([ev(0, "turn/start")])
    await second.close()

    info = await store_factory().stat("a")
    assert info is not None
    assert (info.event_count, info.last_turn_end) == (4, {"type": "completed"})

    await first.append([ev(4, "turn/end", reason={"type": "error", "code": "X"})])
    await first.close()

    infos = {i.session_id: i for i in await store_factory().list()}
    assert set(infos) == {"a", "b"}
    assert infos["a"].event_count == 5
    assert infos["a"].last_turn_end == {"type": "error", "code": "X"}
    assert (infos["b"].event_count, infos["b"].last_turn_end) == (1, None)
    assert infos["b"].agent_id == "agent-2"


async def test_create_of_a_stored_id_raises_already_exists(store: SessionStore) -> None:
    await make_session(store, "s1", 1)
    with pytest.raises(SessionAlreadyExistsError):
        await store.create(header("s1"))
    assert await stored_events(store, "s1") == [ev(0)]


async def test_unknown_ids_are_not_found(store: SessionStore) -> None:
    with pytest.raises(SessionNotFoundError):
        await store.open("nope", "read")
    with pytest.raises(SessionNotFoundError):
        await store.open("nope", "write")
    assert await store.stat("nope") is None
    await store.delete("nope")  # deleting an absent session is not an error
    assert await store.list() == []


async def test_delete_removes_the_session_and_frees_the_id(store: SessionStore) -> None:
    await make_session(store, "s1", 2)
    await make_session(store, "s2", 1)
    await store.delete("s1")
    assert await store.stat("s1") is None
    assert [i.session_id for i in await store.list()] == ["s2"]
    with pytest.raises(SessionNotFoundError):
        await store.open("s1", "read")
    handle = await store.create(header("s1"))
    await handle.append([ev(0, "user/message", text="again")])
    await handle.close()
    assert await stored_events(store, "s1") == [ev(0, "user/message", text="again")]


async def test_deleting_an_owned_session_fences_its_owner(store_factory: StoreFactory) -> None:
    store = store_factory()
    handle = await store.create(header("s1"))
    await handle.append([ev(0)])
    await handle.flush()
    await store_factory().delete("s1")
    await handle.append([ev(1)])
    if store_factory.durable:
        with pytest.raises(SessionOwnershipLostError):
            await handle.flush()
        with pytest.raises(SessionOwnershipLostError):
            await handle.append([ev(2)])
        with pytest.raises(SessionOwnershipLostError):
            await handle.close()  # its unflushed event is reported lost
    else:  # MemoryStore documents that the owner keeps writing into the detached record
        await handle.close()
    assert await store.stat("s1") is None
    fresh = await store.create(header("s1"))
    await fresh.abort()


# --- append rules ------------------------------------------------------------------------------


async def test_append_skips_identical_prefix_and_rejects_gaps_and_conflicts(
    store: SessionStore,
) -> None:
    handle = await store.create(header("s1"))
    await handle.append([ev(0), ev(1), ev(2)])
    await handle.append([ev(1), ev(2), ev(3)])  # retried batch with one new event (staged)
    with pytest.raises(SequenceConflictError):
        await handle.append([ev(5)])  # gap
    with pytest.raises(SequenceConflictError):
        await handle.append([ev(2, text="different")])  # conflicts with a staged event
    with pytest.raises(SequenceConflictError):
        await handle.append([ev(4), ev(6)])  # not dense
    await handle.flush()
    await handle.append([ev(0), ev(1), ev(2), ev(3), ev(4)])  # stored prefix skipped
    with pytest.raises(SequenceConflictError):
        await handle.append([ev(1, text="different"), ev(2)])  # conflicts with a stored event
    await handle.append([])
    await handle.close()
    assert await stored_events(store, "s1") == [ev(i) for i in range(5)]


async def test_read_offset_and_length_span_stored_and_staged_events(store: SessionStore) -> None:
    handle = await store.create(header("s1"))
    await handle.append([ev(i) for i in range(6)])
    await handle.flush()
    await handle.append([ev(i) for i in range(6, 10)])

    assert await handle.read() == [ev(i) for i in range(10)]
    assert await handle.read(3, 4) == [ev(i) for i in range(3, 7)]
    assert await handle.read(8) == [ev(8), ev(9)]
    assert await handle.read(2, 0) == []
    assert await handle.read(20) == []
    reader = await store.open("s1", "read")
    assert await reader.read(4) == [ev(4), ev(5)]  # the stored part only
    assert await reader.read(1, 2) == [ev(1), ev(2)]
    await reader.close()
    await handle.close()


async def test_inherited_events_start_a_new_session_unflushed(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()
    inherited = [ev(0, "system/message", text="sys"), ev(1)]
    handle = await store.create(header("fork"), inherited_events=inherited)
    assert await handle.read() == inherited
    assert await store.stat("fork") is None
    seed_end = ev(2, "session/end-seed", inherited=True)
    await handle.append([*inherited, seed_end])
    await handle.flush()
    assert await stored_events(store_factory(), "fork") == [*inherited, seed_end]
    await handle.close()


# --- durability and ownership ------------------------------------------------------------------


async def test_flush_is_the_durability_barrier(store_factory: StoreFactory) -> None:
    writer_store, reader_store = store_factory(), store_factory()
    handle = await writer_store.create(header("s1"))
    await handle.append([ev(0), ev(1), ev(2)])
    await handle.flush()
    await handle.append([ev(3)])  # not flushed

    assert await stored_events(reader_store, "s1") == [ev(0), ev(1), ev(2)]
    info = await reader_store.stat("s1")
    assert info is not None
    assert info.event_count == 3

    await handle.close()  # close drains
    assert await stored_events(reader_store, "s1") == [ev(i) for i in range(4)]


async def test_never_flushed_session_leaves_no_trace_and_its_id_is_reusable(
    store_factory: StoreFactory, tmp_path: Path
) -> None:
    store = store_factory()
    handle = await store.create(header("s1"), inherited_events=[ev(0)])
    await handle.append([ev(0), ev(1)])
    await handle.abort()
    await handle.abort()  # idempotent

    other = store_factory()
    assert await other.stat("s1") is None
    assert await other.list() == []
    with pytest.raises(SessionNotFoundError):
        await other.open("s1", "read")
    with pytest.raises(SessionNotFoundError):
        await other.open("s1", "write")
    if store_factory.backend == "jsonl":
        assert os.listdir(tmp_path / "sessions") == []

    again = await other.create(header("s1", agent_id="agent-9"))
    await again.append([ev(0, text="second life")])
    await again.close()
    assert await stored_events(store, "s1") == [ev(0, text="second life")]
    info = await store.stat("s1")
    assert info is not None
    assert info.agent_id == "agent-9"


async def test_closing_a_session_with_no_event_leaves_no_trace(store: SessionStore) -> None:
    handle = await store.create(header("s1"))
    await handle.close()
    assert await store.stat("s1") is None
    with pytest.raises(SessionNotFoundError):
        await store.open("s1", "write")
    reused = await store.create(header("s1"))
    await reused.abort()


async def test_abort_drops_unflushed_events_and_releases_ownership(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()
    await make_session(store, "s1", 2)
    handle = await store.open("s1", "write")
    await handle.append([ev(2), ev(3)])
    await handle.abort()
    with pytest.raises(trio.ClosedResourceError):
        await handle.append([ev(4)])

    other = store_factory()
    assert await stored_events(other, "s1") == [ev(0), ev(1)]
    again = await other.open("s1", "write")  # ownership was released
    assert await again.read() == [ev(0), ev(1)]
    await again.close()


async def test_close_is_idempotent_flushes_and_releases(store_factory: StoreFactory) -> None:
    store = store_factory()
    handle = await store.create(header("s1"))
    await handle.append([ev(0)])
    await handle.close()
    await handle.close()
    with pytest.raises(trio.ClosedResourceError):
        await handle.append([ev(1)])
    with pytest.raises(trio.ClosedResourceError):
        await handle.flush()
    other = store_factory()
    reopened = await other.open("s1", "write")
    assert await reopened.read() == [ev(0)]
    await reopened.close()


async def test_open_for_write_of_an_owned_session_raises(store_factory: StoreFactory) -> None:
    store, other = store_factory(), store_factory()
    stored = await store.create(header("stored"))
    await stored.append([ev(0)])
    await stored.flush()
    pending = await store.create(header("pending"))  # created, never flushed
    await pending.append([ev(0)])

    for candidate in (store, other):
        for sid in ("stored", "pending"):
            with pytest.raises(SessionAlreadyOwnedError) as caught:
                await candidate.open(sid, "write")
            assert sid in str(caught.value)
        with pytest.raises(SessionAlreadyOwnedError):
            await candidate.create(header("pending"))
        with pytest.raises(SessionAlreadyExistsError):
            await candidate.create(header("stored"))
    if store_factory.durable:  # a durable backend names the owner (host/pid)
        with pytest.raises(SessionAlreadyOwnedError) as caught:
            await other.open("stored", "write")
        assert str(os.getpid()) in str(caught.value)

    await stored.close()
    await pending.abort()
    again = await other.open("stored", "write")
    await again.close()
    created = await other.create(header("pending"))
    await created.abort()


async def test_aclose_then_use_reopens_lazily(store: SessionStore) -> None:
    await make_session(store, "s1", 2)
    await store.aclose()
    await store.aclose()
    assert [i.session_id for i in await store.list()] == ["s1"]
    handle = await store.open("s1", "write")
    await store.aclose()  # a live handle keeps working after the store closes its connections
    await handle.append([ev(2)])
    await handle.flush()
    await handle.close()
    await store.aclose()
    assert await stored_events(store, "s1") == [ev(0), ev(1), ev(2)]


async def test_lease_ttl_and_renew(store_factory: StoreFactory) -> None:
    handle = await store_factory().create(header("s1"))
    expected = 30.0 if store_factory.backend == "postgres" else None
    assert handle.lease_ttl == expected
    await handle.renew()
    await handle.append([ev(0)])
    await handle.flush()
    await handle.close()
    with pytest.raises(trio.ClosedResourceError):
        await handle.renew()


async def test_stores_satisfy_the_protocol(store: SessionStore) -> None:
    assert isinstance(store, SessionStore)
    async with store:  # ``async with store`` closes it (and it reopens when used again)
        await make_session(store, "s1", 1)
    assert await store.stat("s1") is not None


# --- backend specifics the contract relies on --------------------------------------------------


async def test_sqlite_group_commit_batches_concurrent_flushes(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        handles = []
        for i in range(20):
            handle = await store.create(header(f"s{i}"))
            await handle.append([ev(0), ev(1)])
            handles.append(handle)
        before = store.statistics()
        async with trio.open_nursery() as nursery:
            for handle in handles:
                nursery.start_soon(handle.flush)
        after = store.statistics()
        assert after.handles_committed - before.handles_committed == 20
        assert after.events_committed - before.events_committed == 40
        assert after.commits - before.commits <= 3  # 20 flushes, at most a few transactions
        for handle in handles:
            await handle.close()
        assert {i.event_count for i in await store.list()} == {2}


async def test_sqlite_group_commit_isolates_a_handle_that_lost_ownership(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        handles = {}
        for sid in ("a", "b", "c"):
            handles[sid] = await store.create(header(sid))
            await handles[sid].append([ev(0)])
        await store.delete("b")  # "b" loses its owner row before its first flush
        results: dict[str, str] = {}

        async def flush(sid: str) -> None:
            try:
                await handles[sid].flush()
            except SessionOwnershipLostError:
                results[sid] = "lost"
            else:
                results[sid] = "ok"

        before = store.statistics().commits
        async with trio.open_nursery() as nursery:
            for sid in handles:
                nursery.start_soon(flush, sid)
        assert results == {"a": "ok", "b": "lost", "c": "ok"}
        assert store.statistics().commits - before <= 2
        assert sorted(i.session_id for i in await store.list()) == ["a", "c"]
        await handles["a"].close()
        await handles["c"].close()
        await handles["b"].abort()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
async def test_sqlite_sessions_share_one_writer_connection(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db") as store:
        first = await store.create(header("s0"))
        baseline = _open_fds()
        handles = [first]
        for i in range(1, 300):
            handles.append(await store.create(header(f"s{i}")))
        assert _open_fds() - baseline <= 2
        for handle in handles:
            await handle.abort()


async def test_sqlite_full_durability_and_bad_option(tmp_path: Path) -> None:
    async with SqliteStore(tmp_path / "s.db", durability="full") as store:
        await make_session(store, "s1", 1)
        assert await stored_events(store, "s1") == [ev(0)]
    with pytest.raises(ValueError, match="durability"):
        SqliteStore(tmp_path / "s.db", durability="sometimes")  # type: ignore[arg-type]


async def test_sqlite_close_past_its_timeout_drops_unflushed_and_raises(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db", close_timeout=0.2)
    blocker = SqliteStore(tmp_path / "s.db", busy_timeout=0.0)
    try:
        handle = await store.create(header("s1"))
        await handle.append([ev(0)])
        await handle.flush()
        await handle.append([ev(1)])
        release = trio.Event()

        async def stuck_commit(task_status: trio.TaskStatus[None]) -> None:
            async with (
                store._connections.writer_lock
            ):  # a commit that never ends, as the handle sees it
                task_status.started()
                await release.wait()

        async with trio.open_nursery() as nursery:
            await nursery.start(stuck_commit)
            start = trio.current_time()
            with pytest.raises(StoreError, match="close timed out"):
                await handle.close()
            assert 0.2 <= trio.current_time() - start < 2.0  # close_timeout plus release grace
            release.set()
        assert await stored_events(blocker, "s1") == [ev(0)]
        await handle.close()  # closed already: a no-op
    finally:
        await store.aclose()
        await blocker.aclose()


async def test_postgres_late_append_after_takeover_is_fenced() -> None:
    from dsh_agent_loop.stores.postgres import PostgresStore

    dsn, prefix = postgres_dsn(), new_pg_prefix()
    stale_store = PostgresStore(dsn, table_prefix=prefix, lease_ttl=0.3)
    new_store = PostgresStore(dsn, table_prefix=prefix)
    try:
        stale = await stale_store.create(header("s1"))
        await stale.append([ev(0)])
        await stale.flush()
        with pytest.raises(SessionAlreadyOwnedError, match=f"pid {os.getpid()}"):
            await new_store.open("s1", "write")
        await trio.sleep(0.5)  # real time: the lease is judged by the database clock
        owner = await new_store.open("s1", "write")
        await owner.append([ev(1, text="new owner")])
        await owner.flush()

        await stale.append([ev(1, text="stale owner")])
        with pytest.raises(SessionOwnershipLostError):
            await stale.flush()
        with pytest.raises(SessionOwnershipLostError):
            await stale.renew()
        with pytest.raises(SessionOwnershipLostError):
            await stale.close()  # its unflushed event is reported lost

        await owner.renew()
        await owner.append([ev(2)])
        await owner.close()
        assert await stored_events(new_store, "s1") == [ev(0), ev(1, text="new owner"), ev(2)]
    finally:
        await stale_store.aclose()
        await new_store.aclose()
        drop_pg_tables(dsn, prefix)


@pytest.mark.parametrize(
    ("committed", "losses"),
    [(True, 1), (False, 1), (False, 99)],
    ids=["committed", "not-committed-once", "not-committed-always"],
)
async def test_postgres_ambiguous_commit_is_resolved_by_reading_back(
    monkeypatch: pytest.MonkeyPatch, committed: bool, losses: int
) -> None:
    import psycopg

    from dsh_agent_loop.stores import _postgres_sync, postgres

    dsn, prefix = postgres_dsn(), new_pg_prefix()
    store = postgres.PostgresStore(dsn, table_prefix=prefix, retry_delays=(0.01, 0.05, 0.25))
    real_commit = _postgres_sync.commit
    lost = []

    def lose_acknowledgement(conn: _postgres_sync.Conn) -> None:
        if len(lost) >= losses:
            return real_commit(conn)
        lost.append(conn)
        if committed:
            real_commit(conn)
        conn.close()  # the server rolls back an uncommitted transaction
        raise psycopg.OperationalError("simulated: connection lost during COMMIT")

    try:
        handle = await store.create(header("s1"))
        await handle.append([ev(0)])
        await handle.flush()
        await handle.append([ev(1), ev(2)])
        monkeypatch.setattr(_postgres_sync, "commit", lose_acknowledgement)
        if losses == 1:
            # committed: read back, both rows are there with matching hashes; not committed:
            # read back, none is, so the batch is sent again on a new connection
            await handle.flush()
        else:
            with pytest.raises(StoreError, match="nothing was stored"):
                await handle.flush()  # every retry lost its COMMIT too
            assert len(lost) == 4  # the first try and the three of retry_delays
            monkeypatch.setattr(_postgres_sync, "commit", real_commit)
            await handle.flush()  # the events stayed staged: nothing lost
        await handle.close()
        assert await stored_events(store, "s1") == [ev(0), ev(1), ev(2)]
        info = await store.stat("s1")
        assert info is not None
        assert info.event_count == 3
    finally:
        await store.aclose()
        drop_pg_tables(dsn, prefix)


async def test_postgres_rejects_bad_options() -> None:
    from dsh_agent_loop.stores.postgres import PostgresStore

    with pytest.raises(ValueError, match="table_prefix"):
        PostgresStore("postgresql://x/y", table_prefix="bad-prefix; DROP")
    with pytest.raises(ValueError, match="lease_ttl"):
        PostgresStore("postgresql://x/y", lease_ttl=0)
