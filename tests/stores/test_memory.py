"""``MemoryStore`` (``stores/_memory.py``): in-process ownership, visibility and counters.

The behaviour every backend shares is in ``test_conformance``; these are the memory store's own.
"""

from __future__ import annotations

import pytest
import trio

from dsh_agent_loop._errors import (
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionNotFoundError,
)
from dsh_agent_loop._session.store import StoreStatistics
from dsh_agent_loop.stores import MemoryStore

from .conftest import ev, header


async def test_a_created_session_is_invisible_until_it_stores_an_event():
    store = MemoryStore()
    handle = await store.create(header("s1"))
    assert await store.stat("s1") is None
    assert await store.list() == []
    with pytest.raises(SessionNotFoundError):
        await store.open("s1")
    await handle.append([ev(0)])
    assert await store.stat("s1") is None  # staged, not flushed
    await handle.flush()
    info = await store.stat("s1")
    assert info is not None
    assert info.event_count == 1
    await handle.close()


async def test_only_one_writer_per_session_in_the_process():
    store = MemoryStore()
    handle = await store.create(header("s1"))
    with pytest.raises(SessionAlreadyOwnedError) as info:
        await store.create(header("s1"))
    assert info.value.owner == "this process"
    await handle.append([ev(0)])
    await handle.flush()
    with pytest.raises(SessionAlreadyOwnedError):
        await store.open("s1", "write")
    await handle.close()
    again = await store.open("s1", "write")
    await again.close()
    with pytest.raises(SessionAlreadyExistsError):
        await store.create(header("s1"))


async def test_an_empty_session_closed_or_aborted_is_forgotten_and_can_be_created_again():
    store = MemoryStore()
    first = await store.create(header("s1"))
    await first.close()
    second = await store.create(header("s1"))
    await second.append([ev(0)])
    await second.abort()  # staged events are dropped
    third = await store.create(header("s1"))
    assert await third.read() == []
    await third.close()


async def test_a_closed_handle_refuses_writes_and_close_flushes():
    store = MemoryStore()
    handle = await store.create(header("s1"))
    await handle.append([ev(0), ev(1)])
    await handle.close()
    await handle.close()  # idempotent
    reader = await store.open("s1")
    assert [e.seq for e in await reader.read()] == [0, 1]
    await reader.close()
    for operation in (handle.append([ev(2)]), handle.flush(), handle.renew()):
        with pytest.raises(trio.ClosedResourceError):
            await operation


async def test_a_write_handle_reads_stored_and_staged_events_and_has_no_lease():
    store = MemoryStore()
    handle = await store.create(header("s1"), inherited_events=[ev(0)])
    await handle.flush()
    await handle.append([ev(1), ev(2)])
    assert [e.seq for e in await handle.read()] == [0, 1, 2]
    assert [e.seq for e in await handle.read(1, 1)] == [1]
    assert handle.lease_ttl is None
    assert handle.session_id == "s1"
    assert handle.header["agent_id"] == "agent-1"
    await handle.close()


async def test_delete_detaches_a_live_writer():
    store = MemoryStore()
    handle = await store.create(header("s1"))
    await handle.append([ev(0)])
    await handle.flush()
    await store.delete("s1")
    await store.delete("s1")  # absent: nothing to do
    assert await store.stat("s1") is None
    await handle.append([ev(1)])
    await handle.flush()  # goes on writing into the detached record
    assert await store.list() == []
    await handle.close()


async def test_statistics_count_flushes_that_stored_events():
    async with MemoryStore() as store:
        assert store.statistics() == StoreStatistics()
        handle = await store.create(header("s1"))
        await handle.flush()  # nothing staged: not a commit
        await handle.append([ev(0), ev(1)])
        await handle.flush()
        await handle.append([ev(2)])
        await handle.close()
        assert store.statistics() == StoreStatistics(
            commits=2, handles_committed=2, events_committed=3
        )


async def test_sessions_outlive_aclose():
    store = MemoryStore()
    handle = await store.create(header("s1"), inherited_events=[ev(0)])
    await handle.close()
    await store.aclose()
    assert [info.session_id for info in await store.list()] == ["s1"]


async def test_close_in_a_cancelled_scope_still_stores_what_was_staged():
    store = MemoryStore()
    handle = await store.create(header("s1"))
    await handle.append([ev(0), ev(1)])
    with trio.CancelScope() as scope:
        scope.cancel()
        await handle.close()  # stores without yielding: a cancel cannot cut it short
    reader = await store.open("s1")
    assert [e.seq for e in await reader.read()] == [0, 1]
    await reader.close()
    assert store.statistics().events_committed == 2
