"""``MemoryStore``: sessions in this process's memory (tests, simulations, the library default).

It follows the same contract as the durable backends, including write ownership and the
"never flushed leaves no trace" rule, so code tested on it behaves the same on SQLite. It
uses no threads, so runs on it are deterministic under ``MockClock``; ``append`` and ``flush``
complete without yielding (there is nothing to wait for), which keeps the writer cheap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, ClassVar, Literal, final, overload

import attrs
import trio

from .._errors import (
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionNotFoundError,
)
from .._frozen import freeze
from .._session.store import (
    ReadHandle,
    SessionInfo,
    StoreStatistics,
    WriteHandle,
    info_from_events,
)
from ..events import Event
from ._check import new_suffix
from ._handles import StoreReadHandle

__all__ = ["MemoryStore"]


@final
@attrs.define(eq=False)
class _Stored:
    header: Mapping[str, Any]
    session_id: str
    events: list[Event] = attrs.Factory(list)
    owner: _MemoryWriteHandle | None = None


async def _read_range(record: _Stored, start: int, stop: int | None) -> list[Event]:
    await trio.lowlevel.checkpoint()
    return record.events[start:stop]


@final
class _Sessions:
    """The sessions of one ``MemoryStore`` and its counters (what its write handles update)."""

    def __init__(self) -> None:
        self.records: dict[str, _Stored] = {}
        self.commits = self.events_committed = 0

    def forget_if_empty(self, record: _Stored) -> None:
        """Drop ``record`` if it stores nothing and has no owner (and is still the one kept)."""
        sid = record.session_id
        if not record.events and record.owner is None and self.records.get(sid) is record:
            del self.records[sid]

    def committed(self, count: int) -> None:
        """Count one flush that stored ``count`` events."""
        self.commits += 1
        self.events_committed += count


@final
@attrs.define(eq=False)
class _MemoryWriteHandle:
    # append and flush never suspend: the session writer may commit in the flushing task
    commits_inline: ClassVar[bool] = True

    _sessions: _Sessions
    _record: _Stored
    _staged: list[Event] | tuple[()] = ()  # () while nothing is staged (most of the time)
    _closed: bool = False

    @property
    def session_id(self) -> str:
        return self._record.session_id

    @property
    def header(self) -> Mapping[str, Any]:
        return self._record.header

    @property
    def lease_ttl(self) -> float | None:
        return None

    def _stored_at(self, seq: int) -> Event:
        stored = self._record.events
        return stored[seq] if seq < len(stored) else self._staged[seq - len(stored)]

    async def read(self, offset: int = 0, length: int | None = None) -> list[Event]:
        await trio.lowlevel.checkpoint()
        end = None if length is None else offset + length
        return [*self._record.events, *self._staged][offset:end]

    async def append(self, events: Sequence[Event]) -> None:
        if self._closed:
            self._check_open()
        record = self._record
        next_seq = len(record.events) + len(self._staged)
        new = new_suffix(record.session_id, next_seq, events, self._stored_at)
        if new:
            if self._staged:
                self._staged.extend(new)
            else:
                self._staged = list(new)

    async def flush(self) -> None:
        if self._closed:
            self._check_open()
        staged = self._staged
        if staged:
            self._record.events.extend(staged)
            self._sessions.committed(len(staged))
            self._staged = ()

    async def renew(self) -> None:
        self._check_open()
        await trio.lowlevel.checkpoint()

    async def close(self) -> None:
        if self._closed:
            return
        # flush never yields, so no cancellation can interrupt it: no shielding scope (one per
        # close was most of a quiet teardown's cost per agent)
        await self.flush()
        self._release()

    async def abort(self) -> None:
        if self._closed:
            return
        self._staged = ()
        self._release()
        await trio.lowlevel.cancel_shielded_checkpoint()

    def _release(self) -> None:
        self._closed = True
        if self._record.owner is self:
            self._record.owner = None
        self._sessions.forget_if_empty(self._record)

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("write handle is closed")


@final
class MemoryStore:
    """Sessions kept in memory for the life of this object."""

    def __init__(self) -> None:
        self._state = _Sessions()
        self._sessions = self._state.records

    async def __aenter__(self) -> MemoryStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def statistics(self) -> StoreStatistics:
        """Return the store's counters (every flush that stores events counts as a commit)."""
        state = self._state
        return StoreStatistics(
            commits=state.commits,
            handles_committed=state.commits,
            events_committed=state.events_committed,
        )

    def _visible(self, session_id: str) -> _Stored | None:
        record = self._sessions.get(session_id)
        return record if record is not None and record.events else None

    async def create(
        self, header: Mapping[str, Any], *, inherited_events: Sequence[Event] = ()
    ) -> WriteHandle:
        """Create a session and take write ownership of it."""
        await trio.lowlevel.checkpoint()
        sid = str(header["session_id"])
        existing = self._sessions.get(sid)
        if existing is not None:
            if existing.events:
                raise SessionAlreadyExistsError(f"session {sid!r} already exists")
            if existing.owner is not None:
                raise SessionAlreadyOwnedError(
                    f"session {sid!r} is owned by another writer in this process",
                    owner="this process",
                )
        record = _Stored(header=freeze(header), session_id=sid)
        self._sessions[sid] = record
        handle = _MemoryWriteHandle(self._state, record)
        record.owner = handle
        if inherited_events:
            await handle.append(list(inherited_events))
        return handle

    @overload
    async def open(self, session_id: str, mode: Literal["write"]) -> WriteHandle: ...
    @overload
    async def open(self, session_id: str, mode: Literal["read"] = "read") -> ReadHandle: ...
    async def open(
        self, session_id: str, mode: Literal["read", "write"] = "read"
    ) -> ReadHandle | WriteHandle:
        """Open a stored session for reading, or for writing (taking ownership)."""
        await trio.lowlevel.checkpoint()
        record = self._sessions.get(session_id)
        if mode == "write" and record is not None and record.owner is not None:
            raise SessionAlreadyOwnedError(
                f"session {session_id!r} is owned by another writer in this process",
                owner="this process",
            )
        if record is None or not record.events:
            raise SessionNotFoundError(f"session {session_id!r} not found")
        if mode == "read":
            return StoreReadHandle(session_id, record.header, partial(_read_range, record))
        handle = _MemoryWriteHandle(self._state, record)
        record.owner = handle
        return handle

    async def list(self) -> list[SessionInfo]:
        """List stored sessions."""
        await trio.lowlevel.checkpoint()
        return [info_from_events(r.header, r.events) for r in self._sessions.values() if r.events]

    async def stat(self, session_id: str) -> SessionInfo | None:
        """Describe one stored session, or None when absent."""
        await trio.lowlevel.checkpoint()
        record = self._visible(session_id)
        return None if record is None else info_from_events(record.header, record.events)

    async def delete(self, session_id: str) -> None:
        """Delete a session (a live owner's handle keeps writing into a detached record)."""
        await trio.lowlevel.checkpoint()
        self._sessions.pop(session_id, None)

    async def aclose(self) -> None:
        """Nothing to release; the sessions stay for reuse."""
        await trio.lowlevel.checkpoint()
