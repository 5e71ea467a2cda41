"""One hop to a worker thread and back, for the stores' blocking database calls.

``trio.to_thread.run_sync`` is the general tool; a store's commit path calls it once per flush,
and there its fixed cost (copying the context, naming the OS thread, two scheduler passes in
the limiter, the ``from_thread`` plumbing) was about half of a small SQLite commit. This is the
part of it a store needs, on the same primitive (trio's thread cache): run ``fn`` in a cached
worker thread and reschedule the waiting task with its outcome. Like ``run_sync`` by default,
the wait cannot be abandoned: a database call that started is waited for, and a cancel that
arrived meanwhile is delivered at the caller's next checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import outcome
import trio

__all__ = ["run_in_worker"]

T = TypeVar("T")


def _cannot_abort(_: object) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED


async def run_in_worker(fn: Callable[[], T]) -> T:
    """Run the blocking ``fn`` in a worker thread; return its result or raise its exception.

    Concurrency is bounded by the caller (each store serialises its connections' users).
    """
    await trio.lowlevel.checkpoint_if_cancelled()
    task = trio.lowlevel.current_task()
    token = trio.lowlevel.current_trio_token()

    def deliver(result: outcome.Outcome[T]) -> None:
        token.run_sync_soon(trio.lowlevel.reschedule, task, result)

    trio.lowlevel.start_thread_soon(fn, deliver)  # calls deliver(outcome.capture(fn)) there
    return await trio.lowlevel.wait_task_rescheduled(_cannot_abort)  # type: ignore[no-any-return]
