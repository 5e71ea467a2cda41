"""The storage seam: ``SessionStore`` and its handles, as the session layer consumes them.

The driver and the session writer talk to storage only through these protocols; concrete
backends live in ``dsh_agent_loop.stores`` and import this module, never the reverse.

Contract (docs/design.md#store-protocol), the part every backend's conformance test checks:

- ``create(header)`` takes write ownership of a new id; a taken id raises
  ``SessionAlreadyExistsError``. A session with no stored event is absent for ``list``/``stat``/
  ``open("read")`` and is reclaimed by the next ``create``.
- ``open(id, "write")`` raises ``SessionNotFoundError`` or ``SessionAlreadyOwnedError`` (also for a
  live owner that has not flushed yet).
- ``WriteHandle.append(events)``: the first seq must be <= the next stored seq; events already
  stored with identical content are skipped, different content at a stored seq or a gap raises
  ``SequenceConflictError``. ``flush()`` is the durability barrier. ``read()`` returns the valid log
  plus this handle's unflushed events, never a torn tail.
- ``close()`` is idempotent and bounded; ``abort()`` drops unflushed events, releases ownership,
  and leaves no trace of a never-flushed session.
- ``statistics()`` returns a ``StoreStatistics`` (a backend may return a subclass with more
  counters, as ``SqliteStoreStatistics`` does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, final, overload, runtime_checkable

import attrs

from ..events import TURN_END, Event

__all__ = [
    "FORMAT_VERSION",
    "ReadHandle",
    "SessionInfo",
    "SessionStore",
    "StoreStatistics",
    "WriteHandle",
    "info_from_events",
]

#: ``format_version`` written in every session header.
FORMAT_VERSION = 1


@final
@attrs.frozen
class SessionInfo:
    """What ``list()`` and ``stat()`` report about a stored session."""

    session_id: str
    """The session id."""
    agent_id: str
    """The agent id from the header."""
    created_at: str
    """ISO-8601 UTC creation time from the header."""
    event_count: int
    """Number of stored events."""
    last_turn_end: Mapping[str, Any] | None
    """The ``reason`` of the latest stored ``turn/end``, or None."""


@attrs.frozen
class StoreStatistics:
    """Counters of a store since it was built (trio's ``statistics()`` habit).

    Backends with more to report extend it (``SqliteStoreStatistics``).
    """

    commits: int = 0
    """Flush transactions (or writes) that stored events."""
    handles_committed: int = 0
    """Handle flushes served by them (more than ``commits`` when a store groups them)."""
    events_committed: int = 0
    """Events stored by them."""
    retries: int = 0
    """Calls repeated after a failure that stored nothing."""


def info_from_events(header: Mapping[str, Any], events: Sequence[Event]) -> SessionInfo:
    """Build a ``SessionInfo`` from a header and the stored events (for simple backends)."""
    last: Mapping[str, Any] | None = None
    for event in reversed(events):
        if event.type == TURN_END:
            last = event.data.get("reason")
            break
    return SessionInfo(
        session_id=str(header["session_id"]),
        agent_id=str(header.get("agent_id", "")),
        created_at=str(header.get("created_at", "")),
        event_count=len(events),
        last_turn_end=last,
    )


@runtime_checkable
class ReadHandle(Protocol):
    """Read access to one stored session."""

    @property
    def session_id(self) -> str:
        """The session id."""
        ...

    @property
    def header(self) -> Mapping[str, Any]:
        """The session header."""
        ...

    async def read(self, offset: int = 0, length: int | None = None) -> list[Event]:
        """Return events ``offset .. offset+length`` of the physically valid log."""
        ...

    async def close(self) -> None:
        """Release the handle (idempotent)."""
        ...


@runtime_checkable
class WriteHandle(ReadHandle, Protocol):
    """Exclusive write access to one session. Called from one task at a time.

    A handle class may also set ``commits_inline = True`` in its own class body (not inherited):
    a promise that its ``append`` and ``flush`` finish without suspending. The session writer
    then commits in the flushing task when the writer is idle, with no task switch (the memory
    store does; a handle that suspends anyway fails its session with ``STORE_FAILED``).
    """

    @property
    def lease_ttl(self) -> float | None:
        """Lease length in seconds (the writer renews every third of it), or None: no lease."""
        ...

    async def append(self, events: Sequence[Event]) -> None:
        """Stage ``events`` (with seqs) for the next flush; see the module contract."""
        ...

    async def flush(self) -> None:
        """Make everything appended so far durable (the durability barrier)."""
        ...

    async def renew(self) -> None:
        """Extend the ownership lease; raises ``SessionOwnershipLostError`` when it was lost."""
        ...

    async def abort(self) -> None:
        """Drop unflushed events and release ownership; a never-flushed session leaves no trace."""
        ...


@runtime_checkable
class SessionStore(Protocol):
    """A place where sessions live. Methods are async; connections open lazily."""

    async def create(
        self, header: Mapping[str, Any], *, inherited_events: Sequence[Event] = ()
    ) -> WriteHandle:
        """Create a session and take write ownership of it."""
        ...

    @overload
    async def open(self, session_id: str, mode: Literal["write"]) -> WriteHandle: ...
    @overload
    async def open(self, session_id: str, mode: Literal["read"] = "read") -> ReadHandle: ...
    async def open(
        self, session_id: str, mode: Literal["read", "write"] = "read"
    ) -> ReadHandle | WriteHandle:
        """Open a stored session for reading, or for writing (taking ownership)."""
        ...

    async def list(self) -> list[SessionInfo]:
        """List stored sessions (those with at least one stored event)."""
        ...

    async def stat(self, session_id: str) -> SessionInfo | None:
        """Describe one stored session, or None when absent."""
        ...

    async def delete(self, session_id: str) -> None:
        """Delete a session and its events."""
        ...

    async def aclose(self) -> None:
        """Release connections; a closed store reopens lazily if used again."""
        ...

    def statistics(self) -> StoreStatistics:
        """Return the store's counters."""
        ...
