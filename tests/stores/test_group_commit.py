"""``stores/_group_commit.py``: flushes queued behind a round share the next one."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from dsh_agent_loop.errors import StoreError
from dsh_agent_loop.stores._group_commit import GroupCommit
from dsh_agent_loop.stores._handles import Staging

from .conftest import ev


class Recorder:
    def __init__(self) -> None:
        self.rounds: list[list[str]] = []
        self.fail: dict[str, Exception] = {}

    async def commit(self, batch: list[Staging[str]]) -> None:
        await trio.lowlevel.checkpoint()
        self.rounds.append([s.session_id for s in batch])
        for staging in batch:
            error = self.fail.get(staging.session_id)
            if error is None:
                staging.committed(len(staging.staged))
            else:
                staging.flush_error = error


def staging(sid: str, *events: int) -> Staging[str]:
    return Staging[str](sid, "token", 0, staged=[ev(i) for i in events])


async def test_flushes_queued_behind_the_lock_commit_in_one_round() -> None:
    lock, recorder = trio.Lock(), Recorder()
    group = GroupCommit[str](lock, recorder.commit)
    sessions = [staging(sid, 0, 1) for sid in ("a", "b", "c")]
    await lock.acquire()  # as another writer transaction would
    async with trio.open_nursery() as nursery:
        for s in sessions:
            nursery.start_soon(group.flush, s)
        await trio.testing.wait_all_tasks_blocked()
        lock.release()
    assert [sorted(r) for r in recorder.rounds] == [["a", "b", "c"]]
    assert all(s.staged == [] and s.stored_count == 2 for s in sessions)


async def test_a_flush_with_nothing_staged_commits_nothing() -> None:
    recorder = Recorder()
    group = GroupCommit[str](trio.Lock(), recorder.commit)
    await group.flush(staging("a"))
    assert recorder.rounds == []


async def test_a_round_error_is_raised_once_by_its_session_only() -> None:
    lock, recorder = trio.Lock(), Recorder()
    recorder.fail["bad"] = StoreError("refused")
    group = GroupCommit[str](lock, recorder.commit)
    good, bad = staging("good", 0), staging("bad", 0)
    results: dict[str, BaseException | None] = {}

    async def flush(s: Staging[str]) -> None:
        try:
            await group.flush(s)
        except StoreError as exc:
            results[s.session_id] = exc
        else:
            results[s.session_id] = None

    await lock.acquire()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(flush, good)
        nursery.start_soon(flush, bad)
        await trio.testing.wait_all_tasks_blocked()
        lock.release()
    assert results["good"] is None
    assert isinstance(results["bad"], StoreError)
    assert bad.flush_error is None
    assert bad.staged == [ev(0)]  # kept for the next try
    recorder.fail.clear()
    await group.flush(bad)
    assert bad.stored_count == 1


async def test_a_failed_session_is_refused_before_any_round() -> None:
    recorder = Recorder()
    group = GroupCommit[str](trio.Lock(), recorder.commit)
    lost = staging("lost", 0)
    lost.fail(StoreError("gone"))
    with pytest.raises(StoreError, match="gone"):
        await group.flush(lost)
    assert recorder.rounds == []
