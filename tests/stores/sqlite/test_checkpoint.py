"""``stores/sqlite/_checkpoint.py``: the background WAL checkpoint and the end of its thread."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from dsh_agent_loop.stores import SqliteStore
from dsh_agent_loop.stores.sqlite import _checkpoint

from ..conftest import ev, header


async def _commit(store: SqliteStore, count: int) -> None:
    handle = await store.create(header("s1"))
    for i in range(count):
        await handle.append([ev(i)])
        await handle.flush()
    await handle.close()


async def test_wal_checkpoints_run_beside_commits_and_close_waits_for_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_checkpoint, "CHECKPOINT_EVERY", 3)
    store = SqliteStore(tmp_path / "s.db")
    await _commit(store, 10)
    await store.aclose()  # waits for a checkpoint still running, closes its connection
    assert store.statistics().checkpoints >= 1
    assert not store._checkpointer.running
    assert not store._checkpointer.connected
    async with SqliteStore(tmp_path / "s.db") as again:
        handle = await again.open("s1", "read")
        assert len(await handle.read()) == 10


async def test_no_checkpoint_thread_outlives_aclose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_checkpoint, "CHECKPOINT_EVERY", 2)
    in_checkpoint, go_on, returned = threading.Event(), threading.Event(), threading.Event()
    real = _checkpoint.WalCheckpointer._checkpoint

    def gated(self: Any) -> None:
        in_checkpoint.set()
        go_on.wait(5)
        try:
            real(self)
        finally:
            returned.set()

    monkeypatch.setattr(_checkpoint.WalCheckpointer, "_checkpoint", gated)
    store = SqliteStore(tmp_path / "s.db")
    await _commit(store, 2)
    while not in_checkpoint.is_set():  # the second commit started one: it is held
        await trio.sleep(0.001)
    assert store._checkpointer.running
    closed = trio.Event()

    async def close() -> None:
        await store.aclose()
        closed.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(close)
        await trio.sleep(0.05)
        assert not closed.is_set()  # aclose waits for the checkpoint thread
        go_on.set()
    assert returned.is_set()  # the thread had finished when aclose returned
    assert not store._checkpointer.running
    assert not store._checkpointer.connected
    assert store.statistics().checkpoints == 1


async def test_a_failed_checkpoint_is_not_counted_and_the_next_one_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_checkpoint, "CHECKPOINT_EVERY", 1)
    calls: list[int] = []
    real = _checkpoint.WalCheckpointer._checkpoint

    def first_fails(self: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("injected")
        real(self)

    monkeypatch.setattr(_checkpoint.WalCheckpointer, "_checkpoint", first_fails)
    async with SqliteStore(tmp_path / "s.db") as store:
        handle = await store.create(header("s1"))
        for i in range(4):
            await handle.append([ev(i)])
            await handle.flush()
            while store._checkpointer.running:
                await trio.sleep(0.001)
        await handle.close()
        assert len(calls) >= 2
        assert store.statistics().checkpoints == len(calls) - 1
