"""``stores/sqlite/_reads.py``: concurrent reads share worker hops, each with its own outcome."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from dsh_agent_loop._errors import StoreError
from dsh_agent_loop.stores import SqliteStore
from dsh_agent_loop.stores.sqlite import _reads
from dsh_agent_loop.stores.sqlite._reads import ReadQueue

from ..conftest import ev, header


class Calls:
    """A stand-in reader connection's call; ``block`` holds the worker until set."""

    def __init__(self) -> None:
        self.block = threading.Event()

    def call(self, read: Any) -> Any:
        self.block.wait(5)
        return read(None)


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the worker hops ``ReadQueue`` makes (one entry per hop)."""
    counted: list[int] = []
    real = _reads.run_in_worker

    async def counting(fn: Any) -> Any:
        counted.append(1)
        return await real(fn)

    monkeypatch.setattr(_reads, "run_in_worker", counting)
    return counted


async def test_reads_queued_behind_a_hop_share_the_next_one(hops: list[int]) -> None:
    calls = Calls()
    queue = ReadQueue(trio.Lock(), calls.call)
    results: dict[int, int] = {}

    async def read(i: int) -> None:
        results[i] = await queue.read(lambda _conn: i * 10)

    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(read, i)
        await trio.testing.wait_all_tasks_blocked()  # one hop blocked, 19 reads queued
        calls.block.set()
    assert results == {i: i * 10 for i in range(20)}
    assert len(hops) == 2  # the first read alone, then the 19 queued behind it


async def test_a_failing_read_fails_alone_and_a_hop_carries_at_most_limit(
    hops: list[int],
) -> None:
    calls = Calls()
    queue = ReadQueue(trio.Lock(), calls.call, limit=4)
    results: dict[int, object] = {}

    def boom(_conn: object) -> int:
        raise ValueError("bad row")

    async def read(i: int) -> None:
        try:
            results[i] = await queue.read(boom if i == 3 else (lambda _conn: i))
        except ValueError as exc:
            results[i] = str(exc)

    async with trio.open_nursery() as nursery:
        for i in range(9):
            nursery.start_soon(read, i)
        await trio.testing.wait_all_tasks_blocked()
        calls.block.set()
    assert results == {i: ("bad row" if i == 3 else i) for i in range(9)}
    assert len(hops) == 3  # 1, then 4 and 4


async def test_a_read_cancelled_while_queued_never_runs() -> None:
    calls = Calls()
    queue = ReadQueue(trio.Lock(), calls.call)
    ran: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(queue.read, lambda _conn: ran.append("first"))
        await trio.testing.wait_all_tasks_blocked()
        with trio.CancelScope() as scope:
            scope.cancel()
            await queue.read(lambda _conn: ran.append("cancelled"))
        assert scope.cancelled_caught
        calls.block.set()
    assert await queue.read(lambda _conn: ran.append("after")) is None
    assert ran == ["first", "after"]


async def test_many_sessions_read_back_concurrently_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with SqliteStore(path) as store:
        for i in range(30):
            handle = await store.create(header(f"s{i}"))
            await handle.append([ev(0), ev(1)])
            await handle.close()
    found: dict[str, list[Any]] = {}
    async with SqliteStore(path) as store:

        async def read_back(sid: str) -> None:
            handle = await store.open(sid, "read")
            found[sid] = list(await handle.read())

        async with trio.open_nursery() as nursery:
            for i in range(30):
                nursery.start_soon(read_back, f"s{i}")
        sqlite3.connect(path).execute("DROP TABLE events").connection.commit()
        with pytest.raises(StoreError, match="no such table"):
            await store.open("s0", "read")
    assert found == {f"s{i}": [ev(0), ev(1)] for i in range(30)}
