"""``stores/_group_commit.py``: flushes (and releases) queued behind a round share the next one."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from dsh_agent_loop._errors import StoreError
from dsh_agent_loop.stores._group_commit import Batches, GroupCommit, GroupRelease
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


# --- GroupRelease ---------------------------------------------------------------------------------


class Releaser:
    """Records each release transaction; the first one waits for ``gate``."""

    def __init__(self) -> None:
        self.rounds: list[list[str]] = []
        self.gate = trio.Event()
        self.fail: StoreError | None = None
        self.current: list[Staging[str]] | None = None

    async def release(self, batch: list[Staging[str]]) -> None:
        self.current = batch
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        self.rounds.append([s.session_id for s in batch])


async def _release_all(group: GroupRelease[str], sessions: list[Staging[str]]) -> dict[str, str]:
    """Release every session concurrently; the error text per session ('' when released)."""
    results: dict[str, str] = {}

    async def release(s: Staging[str]) -> None:
        try:
            await group.release(s)
        except StoreError as exc:
            results[s.session_id] = str(exc)
        else:
            results[s.session_id] = ""

    async with trio.open_nursery() as nursery:
        for s in sessions:
            nursery.start_soon(release, s)
    return results


async def test_releases_queued_behind_one_share_the_next_transaction() -> None:
    releaser = Releaser()
    group = GroupRelease[str](releaser.release)
    sessions = [staging(f"s{i}") for i in range(50)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_release_all, group, sessions)
        await trio.testing.wait_all_tasks_blocked()  # one leads, 49 queue behind it
        releaser.gate.set()
    assert len(releaser.rounds) == 2
    released = sorted(name for r in releaser.rounds for name in r)
    assert released == sorted(s.session_id for s in sessions)


async def test_a_release_transaction_carries_at_most_limit_sessions() -> None:
    releaser = Releaser()
    group = GroupRelease[str](releaser.release, limit=10)
    sessions = [staging(f"s{i}") for i in range(31)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_release_all, group, sessions)
        await trio.testing.wait_all_tasks_blocked()
        releaser.gate.set()
    assert [len(r) for r in releaser.rounds] == [1, 10, 10, 10]
    assert len({name for r in releaser.rounds for name in r}) == 31  # each released exactly once


async def test_a_failed_release_fails_every_session_it_carried_once() -> None:
    releaser = Releaser()
    releaser.fail = StoreError("disk I/O error")
    group = GroupRelease[str](releaser.release)
    sessions = [staging(f"s{i}") for i in range(5)]
    results: dict[str, str] = {}

    async def release_all() -> None:
        results.update(await _release_all(group, sessions))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(release_all)
        await trio.testing.wait_all_tasks_blocked()
        releaser.gate.set()
    assert results == {s.session_id: "disk I/O error" for s in sessions}
    assert all(s.release_error is None for s in sessions)  # raised, not left behind
    releaser.fail = None
    assert await _release_all(group, sessions[:1]) == {"s0": ""}  # it may be tried again


async def test_a_cancelled_leader_hands_the_queued_releases_to_the_next_one() -> None:
    releaser = Releaser()
    group = GroupRelease[str](releaser.release)
    first, rest = staging("first"), [staging(f"s{i}") for i in range(4)]
    scopes = {s.session_id: trio.CancelScope() for s in rest}
    released: list[str] = []

    async def release(s: Staging[str]) -> None:
        with scopes[s.session_id]:
            await group.release(s)
            released.append(s.session_id)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(group.release, first)  # round 1 waits at the gate
        await trio.testing.wait_all_tasks_blocked()
        for s in rest:  # all queue behind round 1
            nursery.start_soon(release, s)
        await trio.testing.wait_all_tasks_blocked()
        gate_1, releaser.gate = releaser.gate, trio.Event()
        gate_1.set()
        await trio.testing.wait_all_tasks_blocked()  # round 2 carries all four, at the gate
        assert releaser.current is not None
        assert len(releaser.current) == 4
        leader = releaser.current[0].session_id
        scopes[leader].cancel()  # before its transaction ran
        await trio.testing.wait_all_tasks_blocked()
        releaser.gate.set()
    assert releaser.rounds[0] == ["first"]
    assert sorted(releaser.rounds[1]) == sorted(
        s.session_id for s in rest if s.session_id != leader
    )
    assert sorted(released) == sorted(releaser.rounds[1])


# --- Batches --------------------------------------------------------------------------------------


class StepCounter(trio.abc.Instrument):
    """Counts task steps (each time a task runs until its next checkpoint)."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


async def test_a_batch_wakes_only_the_tasks_it_carried_and_the_next_leader() -> None:
    rounds: list[list[int]] = []

    async def run(batch: list[int]) -> None:
        await trio.lowlevel.checkpoint()  # (a hop: the others queue meanwhile)
        rounds.append(batch)

    batches = Batches[int](run, limit=10)
    counter = StepCounter()
    trio.lowlevel.add_instrument(counter)
    try:
        async with trio.open_nursery() as nursery:
            for i in range(600):
                nursery.start_soon(batches.submit, i)
    finally:
        trio.lowlevel.remove_instrument(counter)
    assert sorted(i for r in rounds for i in r) == list(range(600))  # each carried once
    assert max(len(r) for r in rounds) == 10
    # ~1,300 steps; waking every waiting task after each of the 61 batches: ~18,000
    assert counter.steps < 5 * 600


async def test_an_item_whose_task_left_is_not_queued_again_when_its_batch_did_not_run() -> None:
    ran: list[list[str]] = []
    first_done, lock = trio.Event(), trio.Lock()

    async def run(batch: list[str]) -> None:
        if batch == ["x"]:
            await first_done.wait()
            ran.append(batch)
            return
        async with lock:  # a leader cancelled here: the batch did not run
            ran.append(batch)

    batches = Batches[str](run, limit=10)
    scopes = {"a": trio.CancelScope(), "b": trio.CancelScope()}

    async def submit(item: str) -> None:
        with scopes[item]:
            await batches.submit(item)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(batches.submit, "x")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(submit, "a")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(submit, "b")
        await trio.testing.wait_all_tasks_blocked()
        await lock.acquire()
        first_done.set()  # "x" ends; "a" leads a and b, and waits for the lock
        await trio.testing.wait_all_tasks_blocked()
        scopes["b"].cancel()  # "b" leaves while its batch is under way
        await trio.testing.wait_all_tasks_blocked()
        scopes["a"].cancel()  # the leader gives up before the batch ran
        await trio.testing.wait_all_tasks_blocked()
        lock.release()
    await batches.submit("later")
    assert ran == [["x"], ["later"]]  # "b" was not carried by a later batch for nobody


async def test_patience_waits_for_a_long_queue_that_moves(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 50 items, at most 2 a batch, each batch 1 s: the last waits 26 s (the first leads a batch
    # of its own) with a patience of 3 s.
    ran: list[int] = []

    async def run(batch: list[int]) -> None:
        await trio.sleep(1.0)
        ran.extend(batch)

    batches = Batches[int](run, limit=2)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for i in range(50):
            nursery.start_soon(batches.submit, i, 3.0)
    assert sorted(ran) == list(range(50))
    assert trio.current_time() - start == pytest.approx(26.0)


async def test_patience_gives_up_on_a_stuck_batch_and_takes_its_item_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gate = trio.Event()
    ran: list[list[int]] = []

    async def run(batch: list[int]) -> None:
        if batch == [0]:
            await gate.wait()  # stuck until released below
        ran.append(batch)

    batches = Batches[int](run, limit=10)
    timed_out: list[int] = []

    async def waiter(i: int) -> None:
        try:
            await batches.submit(i, 3.0)
        except trio.TooSlowError:
            timed_out.append(i)

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(batches.submit, 0)  # leads the stuck batch (no patience: not bounded)
        await trio.sleep(0.5)
        for i in (1, 2):
            nursery.start_soon(waiter, i)
        await trio.sleep(10)
        assert sorted(timed_out) == [1, 2]
        assert trio.current_time() - start == pytest.approx(10.5)
        gate.set()
    assert ran == [[0]]  # the items that gave up were not run for nobody


async def test_patience_bounds_a_leader_that_cannot_start_its_batch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lock = trio.Lock()
    ran: list[list[int]] = []

    async def run(batch: list[int]) -> None:
        async with lock:  # the store's writer lock, held elsewhere below
            ran.append(batch)

    batches = Batches[int](run, limit=10)
    unlock = trio.Event()

    async def hold(task_status: trio.TaskStatus[None]) -> None:
        async with lock:
            task_status.started()
            await unlock.wait()

    async with trio.open_nursery() as nursery:
        await nursery.start(hold)
        start = trio.current_time()
        with pytest.raises(trio.TooSlowError):
            await batches.submit(1, 2.0)
        assert trio.current_time() - start == pytest.approx(2.0)
        unlock.set()
    await batches.submit(2, 2.0)  # the queue is usable again, and 1 is not run for nobody
    assert ran == [[2]]
