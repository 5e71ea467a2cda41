"""``Wakeup`` and ``Latch`` (``_wakeup.py``): one-waiter park/fire and a lazy one-shot event."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from dsh_agent_loop._wakeup import Latch, Wakeup


async def test_fire_wakes_the_parked_task(autojump_clock):
    wakeup = Wakeup()
    woken: list[float] = []

    async def sleeper() -> None:
        await wakeup.park()
        woken.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sleeper)
        await trio.sleep(5)
        assert woken == []
        wakeup.fire()
    assert woken == [5.0]


async def test_fire_with_nobody_parked_does_nothing_and_is_not_remembered(autojump_clock):
    wakeup = Wakeup()
    wakeup.fire()
    wakeup.fire()
    with trio.move_on_after(1) as scope:
        await wakeup.park()  # an earlier fire does not let a later park through
    assert scope.cancelled_caught


async def test_a_second_parked_task_is_refused(autojump_clock):
    wakeup = Wakeup()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(wakeup.park)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(RuntimeError, match="already parked"):
            await wakeup.park()
        wakeup.fire()


async def test_a_cancelled_park_frees_the_slot_for_the_next_waiter(autojump_clock):
    wakeup = Wakeup()
    with trio.move_on_after(1):
        await wakeup.park()
    wakeup.fire()  # nobody is parked: must not reschedule the cancelled task
    done: list[str] = []

    async def again() -> None:
        await wakeup.park()
        done.append("again")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(again)
        await trio.testing.wait_all_tasks_blocked()
        wakeup.fire()
    assert done == ["again"]


async def test_one_fire_wakes_one_park_and_the_wakeup_is_reusable(autojump_clock):
    wakeup = Wakeup()
    rounds: list[int] = []

    async def loop() -> None:
        for i in range(3):
            await wakeup.park()
            rounds.append(i)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop)
        for expected in range(1, 4):
            await trio.testing.wait_all_tasks_blocked()
            wakeup.fire()
            await trio.testing.wait_all_tasks_blocked()
            assert len(rounds) == expected


async def test_latch_wait_returns_once_set_and_wakes_every_waiter(autojump_clock):
    latch = Latch()
    assert not latch.is_set()
    woken: list[int] = []

    async def waiter(i: int) -> None:
        await latch.wait()
        woken.append(i)

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(waiter, i)
        await trio.sleep(1)
        assert woken == []
        latch.set()
    assert sorted(woken) == [0, 1, 2]
    assert latch.is_set()


async def test_a_set_latch_returns_at_once_but_still_checkpoints(autojump_clock):
    latch = Latch()
    latch.set()
    latch.set()  # idempotent
    assert latch.is_set()
    with trio.CancelScope() as scope:
        scope.cancel()
        await latch.wait()  # a cancellation point even when already set
    assert scope.cancelled_caught
    start = trio.current_time()
    await latch.wait()
    assert trio.current_time() == start


async def test_a_latch_makes_no_event_until_someone_waits_before_it_is_set(autojump_clock):
    latch = Latch()
    latch.set()
    await latch.wait()
    assert latch._event is None
    waited = Latch()
    with trio.move_on_after(1):
        await waited.wait()
    assert isinstance(waited._event, trio.Event)
