"""The session writer: one trio task per live session, the only place that talks to its handle.

Design rule (RELIABILITY.md): never acknowledge before commit. ``Session.append`` only queues
events and wakes this task; the task group-commits everything queued (``append`` + ``flush`` on
the handle), then acknowledges the flush barriers that the commit covered, then publishes
``session/event`` for the committed events. Flush callers wait on the barrier; if the store
fails, every waiting and later flush raises the failure (the agent stops; nothing is reported
durable that is not). The writer renews the handle's lease every ``lease_ttl / 3`` while idle.
Closing commits what is left, then closes the handle, shielded and bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import final

import attrs
import trio

from ..errors import StoreError
from ..events import Event
from .log import Session
from .store import WriteHandle

__all__ = ["SessionWriter", "WriterStatistics"]

#: Seconds a shutdown may spend committing what is left before the handle drops it.
CLOSE_TIMEOUT = 10.0


@attrs.frozen
class WriterStatistics:
    """Counters of one writer."""

    commits: int
    events_committed: int
    committed_seq: int
    failed: bool


@final
class SessionWriter:
    """Group-commits one session's appended events to its write handle."""

    def __init__(
        self,
        session: Session,
        handle: WriteHandle,
        *,
        durable_seq: int = -1,
        on_commit: Callable[[Sequence[Event]], None] | None = None,
    ) -> None:
        self.session = session
        self.handle = handle
        self._on_commit = on_commit
        self._lot = trio.lowlevel.ParkingLot()
        self._dirty = False
        self._closing = False
        # Events up to _handed_seq were given to the handle (stored or staged there);
        # events up to _committed_seq are durable.
        self._handed_seq = session.last_seq - len(session._pending)
        self._committed_seq = durable_seq
        self._commit_done = trio.Event()
        self._failure: BaseException | None = None
        self._stopped = trio.Event()
        self._commits = 0
        self._events_committed = 0

    # -- called by the session and the driver ----------------------------------------------
    def wake(self) -> None:
        """Note that events are pending (``Session.on_append``)."""
        if not self._dirty:
            self._dirty = True
            self._lot.unpark()

    async def flush(self) -> None:
        """Wait until every event appended so far is committed (the durability barrier).

        Raises:
            StoreError: the store failed (every later flush raises it too).
        """
        target = self.session.last_seq
        while self._committed_seq < target:
            if self._failure is not None:
                raise self._failure_error()
            if self._stopped.is_set():
                raise StoreError("the session writer is closed")
            done = self._commit_done
            self.wake()
            await done.wait()
        if self._failure is not None and self._committed_seq < target:
            raise self._failure_error()

    @property
    def failure(self) -> BaseException | None:
        """The store failure that stopped this writer, if any."""
        return self._failure

    def _failure_error(self) -> StoreError:
        failure = self._failure
        if isinstance(failure, StoreError):
            return failure
        error = StoreError(f"session store failed: {failure!r}")
        error.__cause__ = failure
        return error

    def statistics(self) -> WriterStatistics:
        """A snapshot of the writer's counters."""
        return WriterStatistics(
            commits=self._commits,
            events_committed=self._events_committed,
            committed_seq=self._committed_seq,
            failed=self._failure is not None,
        )

    # -- the actor ---------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Commit until closed; then commit what is left and close the handle."""
        self.session.on_append = self.wake
        self._dirty = self.session.has_pending() or self._handed_seq > self._committed_seq
        task_status.started()
        try:
            while not self._closing:
                await self._wait_for_work()
                if self._dirty and self._failure is None:
                    await self._commit()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
                await self._final_commit_and_close()
            self._stopped.set()
            self._release_waiters()

    async def _wait_for_work(self) -> None:
        ttl = self.handle.lease_ttl
        while not self._dirty and not self._closing:
            if ttl is None:
                await self._lot.park()
                continue
            with trio.move_on_after(ttl / 3) as scope:
                await self._lot.park()
            if scope.cancelled_caught and self._failure is None:
                try:
                    await self.handle.renew()
                except StoreError as exc:
                    self._fail(exc)

    async def _commit(self) -> None:
        self._dirty = False
        batch = self.session.take_pending()
        if batch or self._handed_seq > self._committed_seq:
            try:
                if batch:
                    await self.handle.append(batch)
                    self._handed_seq = batch[-1].seq  # type: ignore[assignment]
                await self.handle.flush()
            except (StoreError, OSError) as exc:
                self._fail(exc)
                return
            self._events_committed += self._handed_seq - self._committed_seq
            self._committed_seq = self._handed_seq
            self._commits += 1
        self._release_waiters()
        if batch and self._on_commit is not None:
            self._on_commit(batch)

    def _fail(self, exc: BaseException) -> None:
        self._failure = exc
        self._release_waiters()

    def _release_waiters(self) -> None:
        done, self._commit_done = self._commit_done, trio.Event()
        done.set()

    async def _final_commit_and_close(self) -> None:
        if self._failure is None and (
            self.session.has_pending() or self._handed_seq > self._committed_seq
        ):
            await self._commit()
        if self._failure is None:
            await self.handle.close()
        else:
            await self.handle.abort()

    async def aclose(self) -> None:
        """Commit what is pending, close the handle, and wait for the task to end."""
        self._closing = True
        self._lot.unpark_all()
        await self._stopped.wait()

    @property
    def stopped(self) -> bool:
        """True once the writer task has ended."""
        return self._stopped.is_set()
