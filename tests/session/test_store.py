"""The store contract's shared pieces (``_session/store.py``): ``info_from_events``, protocols."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsh_agent_loop._session.store import (
    FORMAT_VERSION,
    ReadHandle,
    SessionInfo,
    SessionStore,
    StoreStatistics,
    WriteHandle,
    info_from_events,
)
from dsh_agent_loop.events import Event
from dsh_agent_loop.stores import JsonlStore, MemoryStore, SqliteStore

HEADER = {"session_id": "s1", "agent_id": "a1", "created_at": "2026-01-01T00:00:00Z"}


def ev(seq: int, type: str, data: dict | None = None) -> Event:
    return Event(type, seq, float(seq), data or {})


def test_info_reports_the_header_count_and_latest_turn_end():
    events = [
        ev(0, "turn/start", {"turn": 1}),
        ev(1, "turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
        ev(2, "turn/start", {"turn": 2}),
        ev(3, "turn/end", {"turn": 2, "reason": {"kind": "error", "code": "X"}}),
        ev(4, "user/message", {}),
    ]
    assert info_from_events(HEADER, events) == SessionInfo(
        session_id="s1",
        agent_id="a1",
        created_at="2026-01-01T00:00:00Z",
        event_count=5,
        last_turn_end={"kind": "error", "code": "X"},
    )


def test_info_of_a_session_without_turn_ends_or_header_fields():
    info = info_from_events({"session_id": 7}, [ev(0, "turn/start")])
    assert info == SessionInfo("7", "", "", 1, None)
    assert info_from_events(HEADER, []).event_count == 0


def test_info_needs_a_session_id():
    with pytest.raises(KeyError):
        info_from_events({}, [])


def test_statistics_start_at_zero():
    assert StoreStatistics() == StoreStatistics(0, 0, 0, 0)
    assert FORMAT_VERSION == 1


async def test_every_built_in_store_and_its_handles_meet_the_protocols(tmp_path: Path):
    header = {**HEADER, "format_version": FORMAT_VERSION}
    for store in (MemoryStore(), SqliteStore(tmp_path / "s.db"), JsonlStore(tmp_path / "j")):
        try:
            assert isinstance(store, SessionStore)
            handle = await store.create(header)
            assert isinstance(handle, WriteHandle)
            await handle.append([ev(0, "turn/start", {"turn": 1})])
            await handle.flush()
            await handle.close()
            reader = await store.open("s1")
            assert isinstance(reader, ReadHandle)
            await reader.close()
            assert isinstance(store.statistics(), StoreStatistics)
        finally:
            await store.aclose()
