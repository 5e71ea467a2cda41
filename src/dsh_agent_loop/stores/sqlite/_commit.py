"""``SqliteStore``'s write path: its handles' backend, and how one commit round is settled.

A round (``_group_commit``) commits the staged events of every queued session in one
transaction, checking inside it, per session, that the owner row still carries the handle's
token. A failed commit is settled before anything else happens: an open transaction is rolled
back (nothing was stored); when none is open any more (the failure came from ``COMMIT``, or
SQLite rolled back by itself) the outcome is read back, and events stored with identical
content count as committed — never a blind retry. Busy/locked errors and a lost connection
are retried a few times once nothing was stored; other errors (disk full, I/O error) fail
the flush; an outcome that cannot be read back fails the sessions for good. Releases of
ownership are grouped the same way (``GroupRelease``): one transaction deletes the owner rows
of every handle that closed meanwhile.

Only the sessions a failure concerns see it. An event that cannot be encoded fails its own
session for good before the transaction starts, and a commit that fails for a reason other
than a database error (a bug, a value the driver refuses) is tried again one session at a
time, so it fails only the session that causes it. Rows are encoded on the trio thread right
before the commit hop (the events are hot in its cache); the worker runs nothing but SQL.
"""

from __future__ import annotations

import sqlite3
from functools import partial
from typing import final

import trio

from ..._errors import SessionOwnershipLostError, StoreError
from ...events import Event
from .._group_commit import GroupCommit, GroupRelease
from .._handles import Staging
from .._rows import last_turn_end
from . import _sync as sql
from ._checkpoint import WalCheckpointer
from ._connections import RETRY_DELAYS, Attempt, Connections

__all__ = ["SqliteBackend", "SqliteStaging"]

SqliteStaging = Staging[sql.Row]


@final
class SqliteBackend:
    """What ``SqliteStore``'s write handles call (``StagingBackend``), and its commit counters."""

    def __init__(self, connections: Connections, checkpointer: WalCheckpointer) -> None:
        self._connections = connections
        self._checkpointer = checkpointer
        self._group = GroupCommit[sql.Row](connections.writer_lock, self._commit_round)
        self._releases = GroupRelease[sql.Row](self._release_batch)
        self.commits = self.handles_committed = self.events_committed = self.retries = 0

    # --- StagingBackend ---

    async def fetch(self, staging: SqliteStaging, start: int, stop: int) -> list[Event]:
        """Stored events ``start .. stop`` of the session."""
        read = partial(sql.events, sid=staging.session_id, start=start, stop=stop)
        return await self._connections.on_reader(read)

    async def flush(self, staging: SqliteStaging) -> None:
        """Commit the staged events, grouped with whatever else is queued."""
        await self._group.flush(staging)

    async def renew(self, staging: SqliteStaging) -> None:
        """No lease: the owner row lasts until released."""
        await trio.lowlevel.checkpoint()

    async def release(self, staging: SqliteStaging, patience: float) -> None:
        """Delete the owner row (and the session, if nothing of it was stored).

        Releases that queue meanwhile share one transaction (``GroupRelease``); ``patience``
        bounds a wait during which no transaction starts or ends.
        """
        self._group.forget(staging)
        await self._releases.release(staging, patience)

    async def _release_batch(self, batch: list[SqliteStaging]) -> None:
        releases = [(s.session_id, s.token, s.stored_count == 0) for s in batch]
        await self._connections.on_writer(partial(sql.release_many, releases=releases))

    # --- one round ---

    async def _commit_round(self, batch: list[SqliteStaging]) -> None:
        failed = await self._commit_batch(batch)
        if len(failed) > 1:  # not a database error: find whose events cause it
            for staging in failed:
                staging.flush_error = None
                await self._commit_batch([staging])

    async def _commit_batch(self, batch: list[SqliteStaging]) -> list[SqliteStaging]:
        """Commit ``batch`` in one transaction, retried while nothing was stored and it may help.

        Returns the sessions a failure other than a database error left uncommitted (each
        has that failure as its flush error; nothing of theirs was stored).
        """
        delays = iter(RETRY_DELAYS)
        while batch := [s for s in batch if s.flush_error is None]:
            encoded = [(s, w) for s in batch if (w := self._work(s)) is not None]
            if not encoded:
                return []
            batch, work = [s for s, _ in encoded], [w for _, w in encoded]
            attempt = await self._connections.commit_attempt(work)
            if attempt.results is not None:
                self._committed_round()
                for staging, w, result in zip(batch, work, attempt.results, strict=True):
                    self._settle(staging, len(w.rows), result)
                return []
            failure = attempt.failure
            assert failure is not None
            batch = self._after_failure(batch, work, attempt)
            delay = next(delays, None) if batch else None
            if delay is None or not (attempt.broken or sql.is_busy(failure)):
                for staging in batch:  # nothing stored: the events stay staged
                    staging.flush_error = self._connections.error(failure, staging.session_id)
                return [] if isinstance(failure, sqlite3.Error) else batch
            self.retries += 1
            await trio.sleep(delay)
        return []

    def _work(self, staging: SqliteStaging) -> sql.Work | None:
        """A snapshot of the staged events for the worker (appends may follow).

        None if an event cannot be encoded: the session then fails for good.
        """
        sid = staging.session_id
        try:
            rows = staging.pending_rows(lambda event: sql.event_row(sid, event))
        except StoreError as exc:
            staging.flush_error = exc
            return None
        return sql.Work(
            sid,
            staging.token,
            staging.stored_count,
            rows[:],
            last_turn_end(staging.staged),  # (as long as rows: no await in between)
        )

    def _committed_round(self) -> None:
        self.commits += 1
        self._checkpointer.committed()

    def _settle(self, staging: SqliteStaging, count: int, error: Exception | None) -> None:
        if error is None:
            staging.committed(count)
            self.handles_committed += 1
            self.events_committed += count
            return
        if isinstance(error, SessionOwnershipLostError):
            staging.fail(error)
        staging.flush_error = error

    def _after_failure(
        self, batch: list[SqliteStaging], work: list[sql.Work], attempt: Attempt
    ) -> list[SqliteStaging]:
        """Apply a failed attempt; return the sessions whose events are known not stored."""
        if attempt.stored is None:  # the outcome is unknown: these sessions write no more
            for staging in batch:
                staging.flush_error = staging.fail(
                    StoreError(
                        f"session {staging.session_id!r}: the outcome of a commit is unknown "
                        f"({attempt.failure}; reading back failed: {attempt.unknown})"
                    )
                )
            return []
        if any(attempt.stored):
            self._committed_round()
        pending = []
        for staging, w, stored in zip(batch, work, attempt.stored, strict=True):
            if stored:
                self._settle(staging, len(w.rows), None)
            else:
                pending.append(staging)
        return pending
