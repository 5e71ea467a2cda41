"""``Wakeup``: a one-waiter park/unpark primitive, lighter than a ``trio.lowlevel.ParkingLot``.

Each agent driver and session writer parks on one of these between bursts of work; with
thousands of agents in one process the per-object cost matters. It holds at most one waiting
task (the actor that owns it) and is cancellable like any trio wait.
"""

from __future__ import annotations

from typing import final

import trio

__all__ = ["Wakeup"]


@final
class Wakeup:
    """Park one task until ``fire()``; ``fire()`` with nobody parked does nothing."""

    __slots__ = ("_task",)

    def __init__(self) -> None:
        self._task: trio.lowlevel.Task | None = None

    async def park(self) -> None:
        """Wait until ``fire()`` (a cancellation point)."""
        if self._task is not None:
            raise RuntimeError("another task is already parked here")
        self._task = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(self._abort)

    def _abort(self, _: object) -> trio.lowlevel.Abort:
        self._task = None
        return trio.lowlevel.Abort.SUCCEEDED

    def fire(self) -> None:
        """Wake the parked task, if any."""
        task = self._task
        if task is not None:
            self._task = None
            trio.lowlevel.reschedule(task)


@final
class Latch:
    """A one-shot event whose ``trio.Event`` is only made when someone waits before it is set."""

    __slots__ = ("_event", "_set")

    def __init__(self) -> None:
        self._set = False
        self._event: trio.Event | None = None

    def set(self) -> None:
        """Set it (idempotent) and wake every waiter."""
        self._set = True
        if self._event is not None:
            self._event.set()

    def is_set(self) -> bool:
        """True once set."""
        return self._set

    async def wait(self) -> None:
        """Wait until set (returns at once when it already is)."""
        if self._set:
            await trio.lowlevel.checkpoint()
            return
        if self._event is None:
            self._event = trio.Event()
        await self._event.wait()
