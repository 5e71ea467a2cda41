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
Its queue is a ``Batches`` (also behind ``SqliteStore``'s concurrent reads): unlike the flush
rounds above, a batch that ends wakes only the tasks it carried and the next leader, since
100,000 waiting tasks woken after each of a hundred batches would cost more than the SQL.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Hashable
from itertools import islice
from typing import Final, Generic, TypeVar, final

import attrs
import trio

from .._errors import StoreError
from ._handles import Staging

__all__ = ["RELEASE_BATCH", "Batches", "GroupCommit", "GroupRelease"]

R = TypeVar("R")
K = TypeVar("K", bound=Hashable)

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
@attrs.define(eq=False)
class _Pending(Generic[K]):
    """One queued item of ``Batches`` and its waiting task's wake-up."""

    item: K
    woken: trio.Event = attrs.Factory(trio.Event)
    done: bool = False
    gone: bool = False
    """Its task left (cancelled) while a batch that carried it ran: never queue it again."""


@final
class Batches(Generic[K]):
    """Items that queue while a batch runs, carried by the next one, at most ``limit`` each.

    Whoever submits when no batch runs leads one: it takes the oldest queued items (its own
    among them, unless more than ``limit`` are older) and runs them. When a batch ends, only
    the tasks whose items it carried wake, and one more: the oldest still queued, to lead the
    next batch. So 100,000 items submitted at once cost about 100,000 wake-ups in all, not
    one per waiting task per batch.

    A task cancelled while its item waits in the queue takes the item out. Cancelled while a
    batch that carries it runs, it leaves at once (the batch still settles the item; what the
    item then means is the caller's business), and should that batch turn out not to have
    run, the item is not queued again: nobody waits for it.

    Args:
        run: Runs one batch; it settles each item itself (results, errors). It may raise only
            when the batch did not run (cancelled before it started): its items are queued
            again.
        limit: At most this many items per batch.
    """

    def __init__(self, run: Callable[[list[K]], Awaitable[None]], *, limit: int) -> None:
        self._run = run
        self._limit = limit
        self._queue: dict[K, _Pending[K]] = {}
        self._leading = False
        self._progress_at = -math.inf
        """When a batch last started or ended (``trio.current_time()``)."""

    async def submit(self, item: K, patience: float | None = None) -> None:
        """Return once a batch that carried ``item`` has run (cancelled before: not run).

        With ``patience``, waiting for other tasks' batches gives up (``trio.TooSlowError``,
        like a cancel) once no batch has started or ended for ``patience`` seconds: a long
        queue that moves is waited for, a stuck batch is not. Leading a batch (waiting for
        the store, then running it) gives up after ``patience`` seconds too.
        """
        pending = _Pending(item)
        self._queue[item] = pending
        try:
            while not pending.done:
                if self._leading:
                    if patience is None:
                        await pending.woken.wait()  # its batch ran, or it leads the next one
                    else:
                        await self._wait_patiently(pending.woken, patience)
                    pending.woken = trio.Event()
                elif patience is None:
                    await self._lead()
                else:
                    with trio.fail_after(patience):
                        await self._lead()
        finally:
            if self._queue.pop(item, None) is not None:
                if not self._leading:
                    self._wake_next()  # (it may have been the one woken to lead)
            elif not pending.done:  # in a running batch: should it not run, drop it
                pending.gone = True

    async def _wait_patiently(self, woken: trio.Event, patience: float) -> None:
        while True:
            with trio.move_on_at(self._progress_at + patience):
                await woken.wait()
                return
            if trio.current_time() >= self._progress_at + patience:
                raise trio.TooSlowError  # no batch started or ended for ``patience`` seconds

    async def _lead(self) -> None:
        queue = self._queue
        batch = list(islice(queue.values(), self._limit))
        for pending in batch:
            del queue[pending.item]
        self._leading = True
        self._progress_at = trio.current_time()
        try:
            await self._run([pending.item for pending in batch])
        except BaseException:  # it did not run: the items wait for the next batch
            for pending in batch:  # (those whose task has left: nobody waits for them)
                if not pending.gone:
                    queue[pending.item] = pending
            raise
        finally:
            self._leading = False
            self._progress_at = trio.current_time()
            self._wake_next()
        for pending in batch:
            pending.done = True
            pending.woken.set()

    def _wake_next(self) -> None:
        """Wake the oldest queued item's task: it leads the next batch."""
        for pending in self._queue.values():
            pending.woken.set()
            return


@final
class GroupRelease(Generic[R]):
    """The ownership releases of one store, many per transaction (``Batches``).

    Args:
        release: Releases one batch; see ``Release``.
        limit: At most this many sessions per transaction.
    """

    def __init__(self, release: Release[R], *, limit: int = RELEASE_BATCH) -> None:
        self._release = release
        self._batches = Batches[Staging[R]](self._run, limit=limit)

    async def release(self, staging: Staging[R], patience: float | None = None) -> None:
        """Give ``staging``'s ownership up, in a transaction of its own or in a shared one.

        Cancelled before its transaction ran, the session stays owned. ``patience``: see
        ``Batches.submit`` (100,000 handles closing at once queue behind each other's
        transactions for longer than any one close may take, yet never stall).

        Raises:
            StoreError: the transaction that carried this session failed.
            trio.TooSlowError: no transaction started or ended for ``patience`` seconds while
                this one waited (the session stays owned).
        """
        staging.release_error = None
        await self._batches.submit(staging, patience)
        error, staging.release_error = staging.release_error, None
        if error is not None:
            raise error

    async def _run(self, batch: list[Staging[R]]) -> None:
        try:
            await self._release(batch)
        except StoreError as exc:
            for staging in batch:
                staging.release_error = exc
