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

``GroupRelease`` does the same for giving ownership up: the releases that queue while one
transaction runs share the next one (at most ``RELEASE_BATCH`` sessions each), so closing
100,000 handles at once costs about a hundred transactions, not 100,000 worker-thread hops.
A release that fails, fails every session of its transaction (none of them was released).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from itertools import islice
from typing import Final, Generic, TypeVar, final

import trio

from ..errors import StoreError
from ._handles import Staging

__all__ = ["RELEASE_BATCH", "GroupCommit", "GroupRelease"]

R = TypeVar("R")

Commit = Callable[[list[Staging[R]]], Awaitable[None]]
"""Commits a batch in one transaction (writer lock held), settling each ``Staging``."""
Release = Callable[[list[Staging[R]]], Awaitable[None]]
"""Gives ownership of every session of a batch up in one transaction (taking the writer lock
itself); raises ``StoreError`` when none of it happened."""

#: Most sessions whose ownership one release transaction gives up.
RELEASE_BATCH: Final = 1000


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


@final
class GroupRelease(Generic[R]):
    """The ownership releases of one store, many per transaction.

    Args:
        release: Releases one batch; see ``Release``.
        limit: At most this many sessions per transaction.
    """

    def __init__(self, release: Release[R], *, limit: int = RELEASE_BATCH) -> None:
        self._release = release
        self._limit = limit
        self._queue: dict[Staging[R], None] = {}
        self._round: trio.Event | None = None
        """Set while a release transaction is in flight; releases queued meanwhile wait."""

    async def release(self, staging: Staging[R]) -> None:
        """Give ``staging``'s ownership up, in a transaction of its own or in a shared one.

        Cancelled before its transaction ran, the session stays owned (it leaves the queue).

        Raises:
            StoreError: the transaction that carried this session failed.
        """
        staging.release_error = None
        self._queue[staging] = None
        try:
            while staging in self._queue:
                running = self._round
                if running is not None:  # it may carry ours; if not, lead the next one
                    await running.wait()
                    continue
                self._round = done = trio.Event()
                try:
                    await self._lead(staging)
                finally:
                    self._round = None
                    done.set()
        finally:
            self._queue.pop(staging, None)
        error, staging.release_error = staging.release_error, None
        if error is not None:
            raise error

    async def _lead(self, leader: Staging[R]) -> None:
        queue = self._queue
        del queue[leader]
        batch = [leader, *islice(queue, self._limit - 1)]
        for staging in batch[1:]:
            del queue[staging]
        try:
            await self._release(batch)
        except StoreError as exc:
            for staging in batch:
                staging.release_error = exc
        except BaseException:  # cancelled before it ran: the others wait for the next one
            for staging in batch[1:]:
                queue[staging] = None
            raise
