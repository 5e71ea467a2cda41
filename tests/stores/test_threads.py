"""``stores/_threads.py``: one hop to a worker thread and back."""

from __future__ import annotations

import threading
import time

import pytest
import trio

from dsh_agent_loop.stores._threads import run_in_worker


async def test_runs_in_another_thread_and_returns_the_result() -> None:
    here = threading.get_ident()
    there = await run_in_worker(threading.get_ident)
    assert there != here
    assert await run_in_worker(lambda: 41 + 1) == 42


async def test_raises_what_the_function_raised() -> None:
    def fail() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        await run_in_worker(fail)


async def test_a_cancel_waits_for_the_call_then_arrives() -> None:
    finished = threading.Event()

    def slow() -> str:
        time.sleep(0.2)
        finished.set()
        return "done"

    with trio.CancelScope() as scope:
        scope.deadline = trio.current_time() + 0.05
        result = await run_in_worker(slow)  # the started call is not abandoned...
        assert finished.is_set()
        assert result == "done"
        await trio.lowlevel.checkpoint()  # ...the cancel is delivered at the next checkpoint
        pytest.fail("not cancelled")
    assert scope.cancelled_caught


async def test_a_cancel_before_the_call_starts_nothing() -> None:
    ran = []
    with trio.CancelScope() as scope:
        scope.cancel()
        await run_in_worker(lambda: ran.append(1))
    assert scope.cancelled_caught
    assert ran == []
