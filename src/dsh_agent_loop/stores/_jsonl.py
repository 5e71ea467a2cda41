"""``JsonlStore``: one human-readable JSON-lines file per session.

Design. ``<dir>/<session_id>.jsonl`` (unsafe characters of the id percent-escaped) holds the
header on line 1 and one event per line. Ownership is ``flock(LOCK_EX | LOCK_NB)`` on the write
handle's own descriptor: no side files, and the kernel drops the lock when the owner dies, so
a crashed owner's session can be taken over at once. flock locks belong to the open file
description, so two handles of one process on one file conflict as well. After locking, the
descriptor's inode is compared with the path's, since an aborting owner may have unlinked the
file in between; on a mismatch the lock is taken again on the new file.

Only the last line may be torn (no newline, or it does not parse): readers skip it and
``open("write")`` truncates it. A bad line followed by more lines, or an event line whose seq
is not its place (even the last: no torn write makes one), is corruption: ``open`` raises
``StoreCorruptError`` (code ``STORE_CORRUPT``) and truncates nothing. Session files are created
``0600`` (an existing file keeps its bits). ``flock`` belongs to the open file, not to a pid, so
ownership holds across PID namespaces (containers sharing a volume) as on one host. A flush is one
``pwrite`` at the end of the valid log plus ``fsync``; a failed write is cut off again.

Every failure is a ``StoreError`` naming the directory (and the session): an OS error (the
directory is a file, a path is a directory), a corrupt file, a session id that cannot name a
file. Lines are encoded by ``_rows`` (lone surrogates escaped); an event that cannot be
encoded at all fails its handle for good, before anything is written. The file work itself
(parse, lock, write, release) runs in worker threads and lives in ``_jsonl_sync``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final, Literal, TypeVar, final, overload
from urllib.parse import quote

import attrs
import trio

from .._errors import (
    SessionNotFoundError,
    SessionOwnershipLostError,
    StoreError,
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
from . import _jsonl_sync as sync
from ._check import check_range, new_suffix
from ._handles import StoreReadHandle
from ._rows import event_json

__all__ = ["JsonlStore"]

T = TypeVar("T")

_MAX_THREADS: Final = 8


@final
class _Files:
    """The worker threads of one ``JsonlStore``, its settings and counters (its handles' view)."""

    def __init__(self, directory: str, close_timeout: float) -> None:
        self.directory = directory
        self.close_timeout = close_timeout
        self._limiter = trio.CapacityLimiter(_MAX_THREADS)
        self.commits = self.events_committed = 0

    async def run(self, fn: Callable[[], T], sid: str | None = None) -> T:
        """Run the blocking ``fn`` in a worker thread; any failure leaves as a ``StoreError``."""
        try:
            return await trio.to_thread.run_sync(fn, limiter=self._limiter)
        except StoreError:
            raise
        except Exception as exc:  # OS errors, and whatever else: never a bare one
            where = f"jsonl store {self.directory!r}"
            where += "" if sid is None else f", session {sid!r}"
            raise StoreError(f"{where}: {type(exc).__name__}: {exc}") from exc

    def committed(self, count: int) -> None:
        """Count one flush that stored ``count`` events."""
        self.commits += 1
        self.events_committed += count


@final
@attrs.define(eq=False)
class _JsonlWriteHandle:
    _files: _Files
    _session_id: str
    _path: str
    _fd: int
    _header: Mapping[str, Any]
    _size: int
    _stored: list[Event]
    _new_file: bool
    _staged: list[Event] = attrs.Factory(list)
    _lost: bool = False
    _failure: StoreError | None = None
    """Set when a staged event cannot be encoded: nothing more is written."""
    _closed: bool = False

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def header(self) -> Mapping[str, Any]:
        return self._header

    @property
    def lease_ttl(self) -> float | None:
        return None

    async def read(self, offset: int = 0, length: int | None = None) -> list[Event]:
        stop = check_range(offset, length)
        await trio.lowlevel.checkpoint()
        return (self._stored + self._staged)[offset:stop]

    def _payload(self, batch: list[Event]) -> bytes:
        try:
            return "".join([event_json(e) + "\n" for e in batch]).encode()
        except Exception as exc:
            self._failure = StoreError(
                f"session {self._session_id!r}: an event cannot be stored "
                f"({type(exc).__name__}: {exc}); the session writes no more"
            )
            raise self._failure from exc

    async def append(self, events: Sequence[Event]) -> None:
        self._check_open()
        stored = self._stored

        def stored_at(seq: int) -> Event:
            return stored[seq] if seq < len(stored) else self._staged[seq - len(stored)]

        next_seq = len(stored) + len(self._staged)
        self._staged.extend(new_suffix(self._session_id, next_seq, events, stored_at))
        await trio.lowlevel.checkpoint()

    async def flush(self) -> None:
        self._check_open()
        await self._flush()

    async def _flush(self) -> None:
        if not self._staged:
            await trio.lowlevel.checkpoint()
            return
        if self._lost:
            raise SessionOwnershipLostError(f"session {self._session_id!r} was deleted while owned")
        if self._failure is not None:
            raise self._failure
        batch = self._staged[: len(self._staged)]
        payload = self._payload(batch)
        directory = os.path.dirname(self._path) if self._new_file else None
        flush = partial(sync.flush, self._session_id, self._fd, self._size, payload, directory)
        try:
            self._size = await self._files.run(flush, self._session_id)
        except SessionOwnershipLostError:
            self._lost = True
            raise
        self._new_file = False
        self._files.committed(len(batch))
        self._stored.extend(batch)
        del self._staged[: len(batch)]

    async def renew(self) -> None:
        self._check_open()
        await trio.lowlevel.checkpoint()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        error: Exception | None = None
        with trio.CancelScope(shield=True):
            with trio.move_on_after(self._files.close_timeout) as scope:
                try:
                    await self._flush()
                except Exception as exc:  # raised once the lock is released
                    error = exc
            if scope.cancelled_caught:
                error = StoreError(
                    f"session {self._session_id!r}: close timed out after "
                    f"{self._files.close_timeout}s; {len(self._staged)} unflushed events dropped"
                )
            release_error = await self._release()
        error = error or release_error
        if error is not None:
            raise error

    async def abort(self) -> None:
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            error = await self._release()
        if error is not None:
            raise error

    async def _release(self) -> StoreError | None:
        """Drop staged events, unlock, and remove the file if it stores no event.

        Not time-bounded: closing the descriptor is what releases the lock, so it must happen.
        """
        self._staged.clear()
        try:
            await self._files.run(
                partial(sync.release, self._fd, self._path, unlink=not self._stored)
            )
        except StoreError as exc:
            return exc
        return None

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("write handle is closed")
        if self._lost:
            raise SessionOwnershipLostError(f"session {self._session_id!r} was deleted while owned")
        if self._failure is not None:
            raise self._failure


@final
class JsonlStore:
    """Sessions as JSON-lines files in one directory (single host; ownership by ``flock``).

    Args:
        directory: Where the ``<session_id>.jsonl`` files live; created on first ``create``.
        close_timeout: Bound, in seconds, on a write handle's ``close``.
    """

    def __init__(self, directory: str | os.PathLike[str], *, close_timeout: float = 10.0) -> None:
        self._directory = os.fspath(directory)
        self._files = _Files(self._directory, close_timeout)

    @property
    def directory(self) -> str:
        """The directory of the session files, as given."""
        return self._directory

    async def __aenter__(self) -> JsonlStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _path(self, session_id: str) -> str:
        """The file of ``session_id``.

        Raises:
            StoreError: the id is empty or not valid Unicode (it cannot name a file).
        """
        try:
            if not session_id:
                raise ValueError("a session id must not be empty")
            name = quote(session_id, safe="")
        except ValueError as exc:  # (UnicodeEncodeError included)
            raise StoreError(
                f"jsonl store {self._directory!r}: session id {session_id!r} cannot name a file "
                f"({exc})"
            ) from exc
        return os.path.join(self._directory, name + sync.SUFFIX)

    def statistics(self) -> StoreStatistics:
        """Return the store's counters (every flush is one write and ``fsync``)."""
        files = self._files
        return StoreStatistics(
            commits=files.commits,
            handles_committed=files.commits,
            events_committed=files.events_committed,
        )

    async def _read_range(self, sid: str, start: int, stop: int | None) -> list[Event]:
        log = await self._files.run(partial(sync.read_path, self._path(sid)), sid)
        return [] if log is None else log.events[start:stop]

    async def create(
        self, header: Mapping[str, Any], *, inherited_events: Sequence[Event] = ()
    ) -> WriteHandle:
        """Create a session and take write ownership of it.

        Raises:
            SessionAlreadyExistsError: the file holds stored events.
            SessionAlreadyOwnedError: a live writer holds the (not yet flushed) file.
        """
        frozen = freeze(header)
        sid = str(frozen["session_id"])
        path = self._path(sid)
        fd, size = await self._files.run(partial(sync.create, path, sid, frozen), sid)
        handle = _JsonlWriteHandle(self._files, sid, path, fd, frozen, size, [], True)
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
        """Open a stored session for reading, or for writing (taking ownership).

        Raises:
            SessionNotFoundError: no file, or a file without a stored event.
            SessionAlreadyOwnedError: ``mode="write"`` and another descriptor holds the lock.
            StoreCorruptError: the file is corrupt (code ``STORE_CORRUPT``); nothing was changed.
        """
        path = self._path(session_id)
        if mode == "read":
            log = await self._files.run(partial(sync.read_path, path), session_id)
            if log is None or log.header is None or not log.events:
                raise SessionNotFoundError(f"session {session_id!r} not found")
            return StoreReadHandle(session_id, log.header, partial(self._read_range, session_id))
        fd, stored = await self._files.run(partial(sync.open_write, path, session_id), session_id)
        assert stored.header is not None
        return _JsonlWriteHandle(
            self._files, session_id, path, fd, stored.header, stored.valid_end, stored.events, False
        )

    async def list(self) -> list[SessionInfo]:
        """List stored sessions (files with at least one event); corrupt files are skipped."""
        return await self._files.run(partial(sync.list_sessions, self._directory))

    async def stat(self, session_id: str) -> SessionInfo | None:
        """Describe one stored session, or None when absent.

        Raises:
            StoreError: the file is corrupt (code ``STORE_CORRUPT``).
        """
        path = self._path(session_id)
        log = await self._files.run(partial(sync.read_path, path), session_id)
        if log is None or log.header is None or not log.events:
            return None
        return info_from_events(log.header, log.events)

    async def delete(self, session_id: str) -> None:
        """Delete a session's file (a live owner keeps writing to the unlinked file)."""
        path = self._path(session_id)
        await self._files.run(partial(sync.unlink, path), session_id)

    async def aclose(self) -> None:
        """Nothing to release: each write handle owns its descriptor."""
        await trio.lowlevel.checkpoint()
