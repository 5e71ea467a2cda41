"""Group commit: the flushes that queue while a commit runs share the next one.

Rule. ``flush`` queues its session's ``Staging``; if no round is in flight, the flushing task
leads one: under the store's writer lock it takes every queued session that still has staged
events and no failure, and hands them to the store's ``commit`` as one batch. Flushes that
queue while a round runs wait for it to end (all wake together); the first of them whose
events are still staged leads the next round for everyone queued by then. No task is started:
the flushing tasks do the work themselves, so a flush costs one commit when alone and a share
of one under load.

A round's outcome per session is left on its ``Staging``: events committed (gone from
``staged``), ``flush_error`` set (the flush raises it once), or ``failure`` (writes no more).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar, final

import trio

from ._handles import Staging

__all__ = ["GroupCommit"]

R = TypeVar("R")

Commit = Callable[[list[Staging[R]]], Awaitable[None]]
"""Commits a batch in one transaction (writer lock held), settling each ``Staging``."""


@final
class GroupCommit(Generic[R]):
    """The commit rounds of one store.

    Args:
        lock: The store's writer lock (shared with its other writer transactions).
        commit: Commits one round's batch; see ``Commit``.
    """

    def __init__(self, lock: trio.Lock, commit: Commit[R]) -> None:
        self._lock = lock
        self._commit = commit
        self._queue: dict[Staging[R], None] = {}
        self._round: trio.Event | None = None
        """Set while a round is in flight; flushes queued meanwhile wait for it."""

    async def flush(self, staging: Staging[R]) -> None:
        """Commit ``staging``'s events, in a round of their own or in one already queued.

        Raises:
            StoreError: the round failed for this session (its events stay staged unless it
                failed for good).
        """
        if not staging.staged:
            await trio.lowlevel.checkpoint()
            return
        staging.check_writable()
        self._queue[staging] = None
        while staging.staged and staging.flush_error is None:
            staging.check_writable()  # (a round it rode in may have failed it)
            running = self._round
            if running is not None:  # it may carry our events; if not, lead the next one
                await running.wait()
                continue
            self._round = done = trio.Event()
            try:
                await self._lead(staging)
            finally:
                self._round = None
                done.set()
        error, staging.flush_error = staging.flush_error, None
        if error is not None:
            raise error

    def forget(self, staging: Staging[R]) -> None:
        """Take ``staging`` off the queue (its handle is closing)."""
        self._queue.pop(staging, None)

    async def _lead(self, leader: Staging[R]) -> None:
        lock = self._lock
        try:
            lock.acquire_nowait()  # uncontended: no scheduler pass (the commit hop yields)
        except trio.WouldBlock:
            await lock.acquire()
        try:
            self._queue[leader] = None
            batch = [s for s in self._queue if s.staged and s.failure is None]
            for staging in batch:
                self._queue.pop(staging, None)
            await self._commit(batch)
        finally:
            lock.release()
