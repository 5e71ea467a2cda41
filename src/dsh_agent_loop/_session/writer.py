"""The session writer: one trio task per live session, the only place that talks to its handle.

Design rule (docs/reliability.md#commit-before-acknowledging): never acknowledge before commit.
``Session.append`` only queues
events and notes it here; the task group-commits everything queued (``append`` + ``flush`` on the
handle), then acknowledges the flush barriers the commit covered, then publishes the committed
events. Flush callers wait on the barrier; if the store fails, every waiting and later flush
raises the failure (the agent stops; nothing is reported durable that is not). Any exception a
handle raises counts, not only ``StoreError``: a driver error or a bug in a store becomes this
session's ``STORE_FAILED`` (its cause chained) and never escapes into its agent's task.

Group commit: appended events wait for a flush barrier, a batch of ``batch_limit`` events, or
about ``commit_delay`` seconds, whichever comes first, so a step's events share one commit and a
crash loses at most the last ``commit_delay`` or so of unacknowledged events (acknowledged ones
never). The delay is kept by one ``CommitTimer`` actor per runtime, which sweeps the writers
whose events have waited too long; so arming it costs an append nothing but a set insert (no
deadline, no task switch), whatever the number of sessions. A writer whose handle holds a lease
renews it every ``lease_ttl / 3``.
Closing commits what is left, then closes the handle, shielded and bounded.

Inline commits: a handle whose class itself sets ``commits_inline = True`` promises that its
``append`` and ``flush`` finish without suspending (the memory store). While the writer task is
parked (no commit of its own under way), a flush caller or the commit timer then commits in its
own task: the same commit, with no task switch to the writer and back. The handle is still used
by one task at a time (nothing can run while a commit that never suspends is under way), and a
flush is still a cancel point. Only the class's own attribute counts: a subclass or a wrapper
that delegates to such a handle may suspend, so it is committed by the writer task. A declared
handle that suspends anyway fails the session (``STORE_FAILED``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Coroutine, Sequence
from typing import Protocol, final

import attrs
import trio

from .._errors import StoreError
from .._wakeup import Wakeup
from ..events import Event
from .log import Session
from .store import WriteHandle

__all__ = [
    "CommitTimer",
    "CommitTimerStatistics",
    "SessionWriter",
    "WriterOwner",
    "WriterStatistics",
    "as_store_error",
]

#: Seconds a shutdown may spend committing what is left before the handle drops it.
CLOSE_TIMEOUT = 10.0
#: Seconds appended events may wait for a flush barrier before they are committed anyway.
COMMIT_DELAY = 0.05
#: Pending events that trigger a commit without waiting for a barrier.
BATCH_LIMIT = 512
#: Sessions of one runtime whose writers close their (suspending) handles at the same time.
CLOSE_CONCURRENCY = 256


def as_store_error(exc: BaseException) -> StoreError:
    """``exc`` as this session's store failure: a ``StoreError`` as is, anything else wrapped.

    Whatever a handle raises — an ``OSError``, a driver's error, a bug in a store — stops this
    session only (docs/design.md#store-failures): it becomes a ``StoreError`` with code
    ``STORE_FAILED`` whose cause
    is the original exception.
    """
    if isinstance(exc, StoreError):
        return exc
    message = f"session store failed: {type(exc).__name__}"
    try:
        text = str(exc)
    except Exception:  # an exception whose str() fails still names its type
        text = ""
    error = StoreError(f"{message}: {text}" if text else message)
    error.__cause__ = exc
    return error


@final
@attrs.frozen
class WriterStatistics:
    """Counters of one writer."""

    commits: int
    events_committed: int
    committed_seq: int
    failed: bool


@final
@attrs.frozen
class CommitTimerStatistics:
    """What the commit timer is waiting on."""

    waiting_writers: int
    """Writers with events that wait for the timer (no flush barrier asked for them yet)."""


@final
class CommitTimer:
    """Commits what writers left pending for ``commit_delay`` without a flush barrier.

    One actor per runtime: writers with pending events register on their first append; every
    ``commit_delay`` the timer asks the ones still dirty to commit (a parked writer whose handle
    commits inline is committed right there, in the timer's task). It parks while none are.
    """

    __slots__ = (
        "_closes",
        "_dirty",
        "_lot",
        "commit_delay",
    )

    def __init__(self, commit_delay: float = COMMIT_DELAY) -> None:
        self.commit_delay = commit_delay
        self._dirty: dict[SessionWriter, None] = {}
        self._lot = Wakeup()
        self._closes: trio.CapacityLimiter | None = None

    @property
    def closes(self) -> trio.CapacityLimiter:
        """Bounds the writers of this runtime closing a suspending handle at once.

        Disposing 100,000 agents at once would otherwise make 100,000 closes runnable
        together: every await of every close then waits for all the others' turns, and each
        close's ``close_timeout`` runs out while it waits for the scheduler, not the store.
        """
        if self._closes is None:
            self._closes = trio.CapacityLimiter(CLOSE_CONCURRENCY)
        return self._closes

    def note(self, writer: SessionWriter) -> None:
        """``writer`` has pending events (called on its first append after a commit)."""
        if not self._dirty:
            self._lot.fire()
        self._dirty[writer] = None

    def forget(self, writer: SessionWriter) -> None:
        """``writer`` committed (or closed)."""
        self._dirty.pop(writer, None)

    def statistics(self) -> CommitTimerStatistics:
        """A snapshot of what the timer waits on."""
        return CommitTimerStatistics(waiting_writers=len(self._dirty))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sweep dirty writers every ``commit_delay`` seconds, forever (cancel to stop)."""
        task_status.started()
        while True:
            while not self._dirty:
                await self._lot.park()
            marked = list(self._dirty)
            await trio.sleep(self.commit_delay)
            for writer in marked:
                if writer in self._dirty:
                    writer.request_commit()


class WriterOwner(Protocol):
    """Who a writer tells about commits and a store failure (the agent)."""

    def on_commit(self, batch: Sequence[Event]) -> None:
        """``batch`` is committed (called in the writer's task, after flush waiters wake)."""
        ...

    def on_store_failure(self, failure: StoreError) -> None:
        """The store failed; told once, synchronously (the agent may be idle)."""
        ...


@final
class SessionWriter:
    """Group-commits one session's appended events to its write handle."""

    __slots__ = (
        "_batch_limit",
        "_closing",
        "_commit_delay",
        "_commit_done",
        "_commits",
        "_committed_seq",
        "_dirty",
        "_events_committed",
        "_failure",
        "_flush_requested",
        "_handed_seq",
        "_idle_scope",
        "_inline",
        "_on_commit",
        "_on_failure",
        "_owner",
        "_parked",
        "_stopped",
        "_stopped_event",
        "_timer",
        "handle",
        "session",
    )

    def __init__(
        self,
        session: Session,
        handle: WriteHandle,
        *,
        durable_seq: int = -1,
        on_commit: Callable[[Sequence[Event]], None] | None = None,
        on_failure: Callable[[StoreError], None] | None = None,
        commit_delay: float = COMMIT_DELAY,
        batch_limit: int = BATCH_LIMIT,
        timer: CommitTimer | None = None,
        owner: WriterOwner | None = None,
    ) -> None:
        self.session = session
        self.handle = handle
        self._on_commit = on_commit
        self._on_failure = on_failure
        """Told once, synchronously, when the store fails (the agent may be idle)."""
        self._owner = owner
        """Told both (``on_commit``, ``on_store_failure``) after the two callbacks; passing the
        object instead of two bound methods saves two GC-tracked objects per session."""
        self._commit_delay = commit_delay
        self._batch_limit = batch_limit
        self._timer = timer
        # The writer's own park/unpark (what ``Wakeup`` does, inline: the writer is where an
        # idle agent's task waits, and a ``Wakeup`` would add an object and a coroutine frame
        # to every idle agent).
        self._parked: trio.lowlevel.Task | None = None
        self._dirty = False
        self._flush_requested = False
        self._closing = False
        self._idle_scope: trio.CancelScope | None = None
        # Events up to _handed_seq were given to the handle (stored or staged there);
        # events up to _committed_seq are durable.
        self._handed_seq = session.last_seq - session.pending_count()
        self._committed_seq = durable_seq
        self._commit_done: trio.Event | None = None
        self._failure: StoreError | None = None
        self._stopped = False
        self._stopped_event: trio.Event | None = None  # made only when someone waits
        session.waker = self
        session.wake_limit = batch_limit
        self._commits = 0
        self._events_committed = 0
        # the class's own declaration only (not inherited, not delegated): see the module doc
        self._inline = vars(type(handle)).get("commits_inline") is True

    # -- called by the session and the driver ----------------------------------------------
    def wake(self) -> None:
        """Note that events are pending (``Session.on_append``); never switches tasks."""
        if not self._dirty:
            self._dirty = True
            if self._timer is not None:
                self._timer.note(self)
            else:
                idle = self._idle_scope
                if idle is not None:
                    due = trio.current_time() + self._commit_delay
                    if due < idle.deadline:
                        idle.deadline = due
        elif self.session.pending_count() >= self._batch_limit:
            self._request_flush()

    def request_commit(self) -> None:
        """Commit what is pending soon, without waiting for it (the commit timer's nudge).

        With a handle that commits inline and the writer parked, it is committed now, in the
        caller's task (see the module doc).
        """
        if self._inline and self._parked is not None and self._failure is None:
            self._commit_inline()
        else:
            self._request_flush()

    def _request_flush(self) -> None:
        self._dirty = True
        if not self._flush_requested:
            self._flush_requested = True
            self._fire()

    async def flush(self) -> None:
        """Wait until every event appended so far is committed (the durability barrier).

        Raises:
            StoreError: the store failed (every later flush raises it too).
        """
        target = self.session.last_seq
        if self._committed_seq >= target:
            return
        if self._inline and self._parked is not None and self._failure is None:
            # The writer is parked and the handle commits without suspending: commit here, in
            # the caller's task (no task switch to the writer and back). Like waiting for the
            # writer, the flush is a cancel point (the commit is made either way).
            self._commit_inline()
            await trio.lowlevel.checkpoint_if_cancelled()
        while self._committed_seq < target:
            if self._failure is not None:
                raise self._failure
            if self._stopped:
                raise StoreError("the session writer is closed")
            done = self._commit_done
            if done is None:
                done = self._commit_done = trio.Event()
            self._request_flush()
            await done.wait()

    @property
    def failure(self) -> StoreError | None:
        """The store failure that stopped this writer, if any."""
        return self._failure

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
        self._dirty = (
            self._dirty or self.session.has_pending() or self._handed_seq > self._committed_seq
        )
        if self._dirty and self._timer is not None:
            self._timer.note(self)  # the seed written at create/resume commits without a barrier
        ttl = self.handle.lease_ttl
        task_status.started()
        try:
            if ttl is None and self._timer is not None:
                # The common case: no lease to renew, and the runtime's timer keeps the commit
                # delay. Inline, not a method: one frame less per parked writer (W3 memory).
                while not self._closing:
                    while not (self._flush_requested or self._closing):
                        self._parked = trio.lowlevel.current_task()
                        await trio.lowlevel.wait_task_rescheduled(self._unpark)
                    if self._dirty and self._failure is None:
                        await self._commit()
            await self._run_timed(ttl)
        except Exception as exc:  # a bug here stops this session, never its agent's task
            if self._failure is None:
                self._fail(exc)
        finally:
            self._idle_scope = None
            try:
                await self._close_bounded()
            except Exception as exc:  # reported by whoever closes the writer
                if self._failure is None:
                    self._failure = as_store_error(exc)
            finally:
                if self._timer is not None:
                    self._timer.forget(self)
                self._stopped = True
                if self._stopped_event is not None:
                    self._stopped_event.set()
                self._release_waiters()

    async def _run_timed(self, ttl: float | None) -> None:
        # Keeps its own commit deadline (no runtime timer) and renews a lease if there is one.
        next_renew = trio.current_time() + ttl / 3 if ttl is not None else math.inf
        while not self._closing:
            with trio.CancelScope() as idle:
                deadline = next_renew
                if self._dirty:
                    deadline = min(deadline, trio.current_time() + self._commit_delay)
                idle.deadline = deadline
                self._idle_scope = idle
                while not (self._flush_requested or self._closing):
                    self._parked = trio.lowlevel.current_task()
                    await trio.lowlevel.wait_task_rescheduled(self._unpark)
            self._idle_scope = None
            if self._dirty and self._failure is None:
                await self._commit()
            if ttl is not None and trio.current_time() >= next_renew:
                next_renew = trio.current_time() + ttl / 3
                await self._renew()

    def _fire(self) -> None:
        task = self._parked
        if task is not None:
            self._parked = None
            trio.lowlevel.reschedule(task)

    def _unpark(self, _: object) -> trio.lowlevel.Abort:
        self._parked = None  # cancelled while parked
        return trio.lowlevel.Abort.SUCCEEDED

    async def _renew(self) -> None:
        if self._failure is not None:
            return
        try:
            await self.handle.renew()
        except Exception as exc:  # any failure of the handle is this session's failure
            self._fail(exc)

    async def _commit(self) -> None:
        self._dirty = False
        self._flush_requested = False
        if self._timer is not None:
            self._timer.forget(self)
        batch = self.session.take_pending()
        if batch or self._handed_seq > self._committed_seq:
            try:
                if batch:
                    await self.handle.append(batch)
                    self._handed_seq = batch[-1].seq  # type: ignore[assignment]
                await self.handle.flush()
            except Exception as exc:  # any failure of the handle is this session's failure
                self._fail(exc)
                return
            self._committed(batch)
        else:
            self._release_waiters()

    def _commit_inline(self) -> None:
        """``_commit`` run to its end in the caller's task (the handle never suspends)."""
        try:
            _run_inline(self._commit())
        except Exception as exc:  # a suspending handle, or a raising observer of commits
            self._fail(exc)

    def _committed(self, batch: list[Event]) -> None:
        """Count the commit, release the flush barriers it covered, then publish ``batch``."""
        self._events_committed += self._handed_seq - self._committed_seq
        self._committed_seq = self._handed_seq
        self._commits += 1
        self._release_waiters()
        if batch:
            if self._on_commit is not None:
                self._on_commit(batch)
            if self._owner is not None:
                self._owner.on_commit(batch)

    def _fail(self, exc: Exception) -> None:
        failure = self._failure = as_store_error(exc)
        self._release_waiters()
        if self._on_failure is not None:
            self._on_failure(failure)
        if self._owner is not None:
            self._owner.on_store_failure(failure)

    def _release_waiters(self) -> None:
        done, self._commit_done = self._commit_done, None
        if done is not None:
            done.set()

    async def _close_bounded(self) -> None:
        """Final commit and close, shielded and bounded by ``CLOSE_TIMEOUT``.

        A handle that may suspend first waits (shielded) for a place among the runtime's
        ``CommitTimer.closes``; the bound starts once it has one.
        """
        if self._inline or self._timer is None:
            # one scope, shielded and bounded (a scope each is a cost per agent at exit)
            with trio.CancelScope(shield=True, deadline=trio.current_time() + CLOSE_TIMEOUT):
                await self._final_commit_and_close()
            return
        closes = self._timer.closes
        with trio.CancelScope(shield=True):
            async with closes:
                with trio.move_on_after(CLOSE_TIMEOUT):
                    await self._final_commit_and_close()

    async def _final_commit_and_close(self) -> None:
        if self._failure is None and (
            self.session.has_pending() or self._handed_seq > self._committed_seq
        ):
            await self._commit()
        if self._failure is None:
            await self.handle.close()
        else:
            await self.handle.abort()

    def request_close(self) -> None:
        """Ask the task to commit what is pending and close the handle; never waits."""
        self._closing = True
        self._fire()

    async def aclose(self) -> None:
        """Commit what is pending, close the handle, and wait for the task to end."""
        self.request_close()
        if self._stopped:
            await trio.lowlevel.checkpoint()
            return
        if self._stopped_event is None:
            self._stopped_event = trio.Event()
        await self._stopped_event.wait()

    @property
    def stopped(self) -> bool:
        """True once the writer task has ended."""
        return self._stopped


def _run_inline(step: Coroutine[object, None, None]) -> None:
    """Run a coroutine that must finish without suspending (a ``commits_inline`` commit)."""
    try:
        step.send(None)
    except StopIteration:
        return
    step.close()
    raise RuntimeError("a handle that declares commits_inline suspended")
