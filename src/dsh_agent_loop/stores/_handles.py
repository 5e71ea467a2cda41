"""The handles stores hand out: one read handle for every store, one staged write handle for SQL.

Design. A handle holds no connection and reaches into no other object. ``StoreReadHandle``
reads through the one callable its store gave it. ``StagedWriteHandle`` (SQLite and PostgreSQL)
keeps its session's write state in a ``Staging`` record and calls its store only through
``StagingBackend``: fetch stored events, flush, renew, release. The store's commit path reads
and settles the ``Staging``, never the handle.

``close`` and ``abort`` are written once, here. ``close`` flushes, shielded, for at most
``close_timeout``, then releases ownership; past the deadline the release still gets a short
grace (giving ownership back is worth a try) and the unflushed events are dropped. A flush
error surfaces only after the release, so a failed close never keeps the session owned.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Generic, Protocol, TypeVar, final

import attrs
import trio

from .._errors import StoreError
from ..events import Event
from ._check import check_range, read_stored_and_staged, stage

__all__ = ["RELEASE_GRACE", "StagedWriteHandle", "Staging", "StagingBackend", "StoreReadHandle"]

R = TypeVar("R")

#: Release after a timed-out close gets this much extra time (best effort).
RELEASE_GRACE: Final = 1.0

ReadRange = Callable[[int, int | None], Awaitable[list[Event]]]
"""Reads stored events ``start .. stop`` (exclusive; None: to the end) of one session."""


@final
@attrs.define(eq=False)
class StoreReadHandle:
    """Read access to one stored session, through its store's ``read_range``."""

    _session_id: str
    _header: Mapping[str, Any]
    _read_range: ReadRange

    @property
    def session_id(self) -> str:
        """The session id."""
        return self._session_id

    @property
    def header(self) -> Mapping[str, Any]:
        """The session header."""
        return self._header

    async def read(self, offset: int = 0, length: int | None = None) -> list[Event]:
        """Return stored events ``offset .. offset+length``.

        Raises:
            ValueError: a negative offset or length.
        """
        return await self._read_range(offset, check_range(offset, length))

    async def close(self) -> None:
        """Nothing to release: the store owns the connections."""
        await trio.lowlevel.checkpoint()


@final
@attrs.define(eq=False)
class Staging(Generic[R]):
    """One write handle's session state, as its store's commit path reads and settles it."""

    session_id: str
    token: str
    """The ownership claim (owner row token, lease token) every commit checks."""
    stored_count: int
    """Events stored so far: the seq of the first staged event."""
    epoch: int = 0
    """The lease's fencing epoch (PostgreSQL)."""
    staged: list[Event] = attrs.Factory(list)
    """Appended, not yet committed."""
    rows: list[R] = attrs.Factory(list)
    """The stored form of ``staged[:len(rows)]``, encoded by ``pending_rows``."""
    failure: StoreError | None = None
    """Set once the session can write no more (ownership lost, an unknown outcome)."""
    flush_error: Exception | None = None
    """What the last commit round that carried these events failed with (group commit)."""
    release_error: StoreError | None = None
    """What the release transaction that carried this session failed with (group release)."""

    def check_writable(self) -> None:
        """Raise the failure that ended writing, if any."""
        if self.failure is not None:
            raise self.failure

    def fail(self, error: StoreError) -> StoreError:
        """Stop writing for good, with ``error``; return it."""
        self.failure = error
        return error

    def pending_rows(self, encode: Callable[[Event], R]) -> list[R]:
        """The rows of every staged event: those not encoded yet are encoded now.

        Staged events only grow at the end and leave from the front (with their rows), so
        ``rows`` stays a prefix of ``staged``. An event that cannot be encoded fails the
        session for good (it, and every later event, can never be stored).

        Raises:
            StoreError: an event cannot be encoded.
        """
        rows, staged = self.rows, self.staged
        if len(rows) < len(staged):
            try:
                rows.extend([encode(event) for event in staged[len(rows) :]])
            except Exception as exc:
                error = self.fail(
                    StoreError(
                        f"session {self.session_id!r}: an event cannot be stored "
                        f"({type(exc).__name__}: {exc}); the session writes no more"
                    )
                )
                raise error from exc
        return rows

    def committed(self, count: int) -> None:
        """The first ``count`` staged events are stored."""
        self.stored_count += count
        del self.staged[:count]
        del self.rows[:count]

    def drop_staged(self) -> None:
        """Forget what was never committed (closing, aborting)."""
        self.staged.clear()
        self.rows.clear()


class StagingBackend(Protocol[R]):
    """What a staged write handle asks of its store (the store's internal interface)."""

    async def fetch(self, staging: Staging[R], start: int, stop: int) -> list[Event]:
        """Stored events ``start .. stop`` of the session."""
        ...

    async def flush(self, staging: Staging[R]) -> None:
        """Commit the staged events (the durability barrier)."""
        ...

    async def renew(self, staging: Staging[R]) -> None:
        """Extend the ownership lease (a checkpoint where there is none)."""
        ...

    async def release(self, staging: Staging[R], patience: float) -> None:
        """Give ownership up; drop the session if nothing of it was stored.

        ``patience``: seconds the release may wait without the store making progress on it
        (a store that queues releases counts a queue that moves as progress; one that does not
        bounds the whole release by it).

        Raises:
            StoreError: the release failed.
            trio.TooSlowError: out of patience (the session may stay owned).
        """
        ...


@final
@attrs.define(eq=False)
class StagedWriteHandle(Generic[R]):
    """A SQL store's write handle: appends staged in memory, committed by ``flush``."""

    _backend: StagingBackend[R]
    _staging: Staging[R]
    _header: Mapping[str, Any]
    _close_timeout: float
    _lease_ttl: float | None = None
    _closed: bool = False

    @property
    def session_id(self) -> str:
        """The session id."""
        return self._staging.session_id

    @property
    def header(self) -> Mapping[str, Any]:
        """The session header."""
        return self._header

    @property
    def lease_ttl(self) -> float | None:
        """Lease length in seconds, or None: no lease."""
        return self._lease_ttl

    async def _fetch(self, start: int, stop: int) -> list[Event]:
        return await self._backend.fetch(self._staging, start, stop)

    async def read(self, offset: int = 0, length: int | None = None) -> list[Event]:
        """Return the stored events then this handle's staged ones, ``offset .. +length``."""
        s = self._staging
        return await read_stored_and_staged(offset, length, s.stored_count, s.staged, self._fetch)

    async def append(self, events: Sequence[Event]) -> None:
        """Stage ``events``: the part already stored must match, no gap."""
        self._check_usable()
        s = self._staging
        await stage(s.session_id, s.stored_count, s.staged, events, self._fetch)
        self._check_usable()

    async def flush(self) -> None:
        """Make everything appended so far durable."""
        self._check_usable()
        await self._backend.flush(self._staging)

    async def renew(self) -> None:
        """Extend the ownership lease."""
        self._check_usable()
        await self._backend.renew(self._staging)

    async def close(self) -> None:
        """Flush (bounded by ``close_timeout``), then release ownership; idempotent."""
        if self._closed:
            return
        self._closed = True
        error: Exception | None = None
        deadline = trio.current_time() + self._close_timeout
        with trio.CancelScope(shield=True):
            with trio.move_on_at(deadline) as scope:
                try:
                    await self._backend.flush(self._staging)
                except Exception as exc:  # raised once ownership is released
                    error = exc
            if scope.cancelled_caught:
                error = StoreError(
                    f"session {self.session_id!r}: close timed out after "
                    f"{self._close_timeout}s; {len(self._staging.staged)} unflushed events dropped"
                )
            release_error = await self._release(deadline)
        error = error or release_error
        if error is not None:
            raise error

    async def abort(self) -> None:
        """Drop unflushed events and release ownership."""
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            error = await self._release(trio.current_time() + self._close_timeout)
        if error is not None:
            raise error

    async def _release(self, deadline: float) -> StoreError | None:
        """Drop staged events and give ownership up; past ``deadline`` a short grace.

        What is left of ``close_timeout`` (at least ``RELEASE_GRACE``) bounds the wait for a
        store that makes no progress, not the wait behind other sessions' releases: closing
        100,000 handles at once queues their releases for longer than one close may take.
        """
        self._staging.drop_staged()
        patience = max(deadline - trio.current_time(), RELEASE_GRACE)
        try:
            await self._backend.release(self._staging, patience)
        except StoreError as exc:
            return exc
        except trio.TooSlowError:
            return StoreError(f"session {self.session_id!r}: releasing ownership timed out")
        return None

    def _check_usable(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("write handle is closed")
        self._staging.check_writable()
