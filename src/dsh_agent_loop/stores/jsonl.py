"""``JsonlStore``: one human-readable JSON-lines file per session.

Design. ``<dir>/<session_id>.jsonl`` (unsafe characters of the id percent-escaped) holds the
header on line 1 and one event per line. Ownership is ``flock(LOCK_EX | LOCK_NB)`` on the write
handle's own descriptor: no side files, and the kernel drops the lock when the owner dies, so
a crashed owner's session can be taken over at once. flock locks belong to the open file
description, so two handles of one process on one file conflict as well. After locking, the
descriptor's inode is compared with the path's, since an aborting owner may have unlinked the
file in between; on a mismatch the lock is taken again on the new file.

Only the last line may be torn (no newline, or it does not parse): readers skip it and
``open("write")`` truncates it. A bad line followed by more lines is corruption: ``open``
raises ``StoreError`` (code ``STORE_CORRUPT``) and truncates nothing. A flush is one
``pwrite`` at the end of the valid log plus ``fsync``; a failed write is cut off again.

Every failure is a ``StoreError`` naming the directory (and the session): an OS error (the
directory is a file, a path is a directory), a corrupt file, a session id that cannot name a
file. Lines are encoded by ``_rows`` (lone surrogates escaped); an event that cannot be
encoded at all fails its handle for good, before anything is written.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final, Literal, TypeVar, final, overload
from urllib.parse import quote

import attrs
import trio

from .._frozen import freeze, thaw
from ..errors import (
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionNotFoundError,
    SessionOwnershipLostError,
    StoreError,
)
from ..events import Event, event_from_json
from ..session.store import ReadHandle, SessionInfo, WriteHandle, info_from_events
from ._check import check_range, new_suffix
from ._rows import escape_surrogates, event_json

__all__ = ["JsonlStore"]

T = TypeVar("T")

_MAX_THREADS: Final = 8
_SUFFIX: Final = ".jsonl"


@attrs.frozen
class _Log:
    """What a file holds: the header (None when torn or missing) and its valid events."""

    header: Mapping[str, Any] | None
    events: list[Event]
    valid_end: int
    """Byte offset just past the last valid line."""


def _corrupt(path: str, line_no: int, why: str) -> StoreError:
    return StoreError(
        f"{path}: line {line_no} is corrupt ({why}) and more lines follow it; "
        "the log was left untouched",
        code="STORE_CORRUPT",
    )


def _parse_line(line: bytes, index: int) -> Mapping[str, Any] | Event:
    if index == 0:
        header = json.loads(line)
        if not isinstance(header, dict) or not isinstance(header.get("session_id"), str):
            raise ValueError("the header is not an object with a session_id")
        return freeze(header)  # type: ignore[no-any-return]
    event = event_from_json(line)
    if event.seq != index - 1:
        raise ValueError(f"seq {event.seq} where {index - 1} was expected")
    return event


def _parse(data: bytes, path: str) -> _Log:
    """Parse a session file; a torn last line is left out, a bad earlier line raises."""
    header: Mapping[str, Any] | None = None
    events: list[Event] = []
    pos = 0
    while (newline := data.find(b"\n", pos)) >= 0:
        index = len(events) + (header is not None)
        try:
            item = _parse_line(data[pos:newline], index)
        except ValueError as exc:
            if newline + 1 == len(data):
                break  # the torn last line of an interrupted write
            raise _corrupt(path, index + 1, str(exc)) from None
        if isinstance(item, Event):
            events.append(item)
        else:
            header = item
        pos = newline + 1
    return _Log(header, events, pos)


def _read_fd(fd: int) -> bytes:
    chunks: list[bytes] = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _read_path(path: str) -> _Log | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return _parse(_read_fd(fd), path)
    finally:
        os.close(fd)


def _lock_owner(fd: int) -> str | None:
    """Name the process holding the flock on ``fd``'s file, from ``/proc/locks``."""
    st = os.fstat(fd)
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == key:
            return f"pid {parts[4]} on host {socket.gethostname()}"
    return None


def _lock(path: str, sid: str, *, create: bool) -> int:
    """Open and flock ``path``; return the descriptor that holds the lock."""
    flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    for _ in range(10):
        try:
            fd = os.open(path, flags, 0o644)
        except FileNotFoundError:
            raise SessionNotFoundError(f"session {sid!r} not found") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                raise _owned_error(fd, path, sid, create) from None
            finally:
                os.close(fd)
        except BaseException:
            os.close(fd)
            raise
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        os.close(fd)  # unlinked or replaced since we opened it: lock the current file
    raise StoreError(f"{path}: the file keeps being replaced; could not lock it")


def _owned_error(fd: int, path: str, sid: str, create: bool) -> Exception:
    if create:
        with contextlib.suppress(StoreError):
            if _parse(_read_fd(fd), path).events:
                return SessionAlreadyExistsError(f"session {sid!r} already exists")
    owner = _lock_owner(fd)
    who = owner or "another live writer"
    return SessionAlreadyOwnedError(f"session {sid!r} is owned by {who} ({path})", owner=owner)


def _create_sync(path: str, sid: str, header: Mapping[str, Any]) -> tuple[int, int]:
    """Lock (creating) the file, reclaim it if it holds no event, write the header."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = _lock(path, sid, create=True)
    try:
        if _parse(_read_fd(fd), path).events:
            raise SessionAlreadyExistsError(f"session {sid!r} already exists")
        line = json.dumps(thaw(header), ensure_ascii=False, separators=(",", ":")) + "\n"
        line = escape_surrogates(line)
        os.ftruncate(fd, 0)
        size = _write_all(fd, line.encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd, size


def _open_write_sync(path: str, sid: str) -> tuple[int, _Log]:
    """Lock the file, refuse corruption, truncate a torn tail."""
    fd = _lock(path, sid, create=False)
    try:
        data = _read_fd(fd)
        log = _parse(data, path)
        if not log.events:
            raise SessionNotFoundError(f"session {sid!r} not found")
        if log.valid_end < len(data):
            os.ftruncate(fd, log.valid_end)
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd, log


def _write_all(fd: int, payload: bytes, offset: int) -> int:
    view = memoryview(payload)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
    return offset


def _flush_sync(sid: str, fd: int, offset: int, payload: bytes, directory: str | None) -> int:
    """Append ``payload`` at ``offset`` and fsync; on failure cut the file back to ``offset``."""
    if os.fstat(fd).st_nlink == 0:
        raise SessionOwnershipLostError(f"session {sid!r} was deleted while owned")
    try:
        os.ftruncate(fd, offset)  # drops the remains of an earlier failed write
        end = _write_all(fd, payload, offset)
        os.fsync(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, offset)
        raise
    if directory is not None:  # the file's directory entry must be durable too
        dir_fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return end


def _release_sync(fd: int, path: str, unlink: bool) -> None:
    try:
        if unlink:  # still holding the lock, so nobody else is using this file
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    finally:
        os.close(fd)


def _list_sync(directory: str) -> list[SessionInfo]:
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    infos = []
    for name in names:
        if not name.endswith(_SUFFIX):
            continue
        try:
            log = _read_path(os.path.join(directory, name))
        except StoreError:
            continue  # corrupt: ``stat``/``open`` report it
        if log is not None and log.header is not None and log.events:
            infos.append(info_from_events(log.header, log.events))
    return infos


@attrs.define(eq=False)
class _JsonlReadHandle:
    _store: JsonlStore
    _session_id: str
    _header: Mapping[str, Any]

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def header(self) -> Mapping[str, Any]:
        return self._header

    async def read(self, offset: int = 0, length: int | None = None) -> list[Event]:
        stop = check_range(offset, length)
        path = self._store._path(self._session_id)
        log = await self._store._thread(partial(_read_path, path), self._session_id)
        return [] if log is None else log.events[offset:stop]

    async def close(self) -> None:
        await trio.lowlevel.checkpoint()


@attrs.define(eq=False)
class _JsonlWriteHandle:
    _store: JsonlStore
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
        flush = partial(_flush_sync, self._session_id, self._fd, self._size, payload, directory)
        try:
            self._size = await self._store._thread(flush, self._session_id)
        except SessionOwnershipLostError:
            self._lost = True
            raise
        self._new_file = False
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
            with trio.move_on_after(self._store._close_timeout) as scope:
                try:
                    await self._flush()
                except Exception as exc:  # raised once the lock is released
                    error = exc
            if scope.cancelled_caught:
                error = StoreError(
                    f"session {self._session_id!r}: close timed out after "
                    f"{self._store._close_timeout}s; {len(self._staged)} unflushed events dropped"
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
            await self._store._thread(
                partial(_release_sync, self._fd, self._path, unlink=not self._stored)
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
        self._close_timeout = close_timeout
        self._limiter = trio.CapacityLimiter(_MAX_THREADS)

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
        return os.path.join(self._directory, name + _SUFFIX)

    async def _thread(self, fn: Callable[[], T], sid: str | None = None) -> T:
        try:
            return await trio.to_thread.run_sync(fn, limiter=self._limiter)
        except StoreError:
            raise
        except Exception as exc:  # OS errors, and whatever else: never a bare one
            where = f"jsonl store {self._directory!r}"
            where += "" if sid is None else f", session {sid!r}"
            raise StoreError(f"{where}: {type(exc).__name__}: {exc}") from exc

    async def create(
        self, header: Mapping[str, Any], *, inherited_events: Sequence[Event] = ()
    ) -> WriteHandle:
        """Create a session and take write ownership of it.

        Raises:
            SessionAlreadyExistsError: the file holds stored events.
            SessionAlreadyOwnedError: a live writer holds the (not yet flushed) file.
        """
        frozen = freeze(dict(header))
        sid = str(frozen["session_id"])
        path = self._path(sid)
        fd, size = await self._thread(partial(_create_sync, path, sid, frozen), sid)
        handle = _JsonlWriteHandle(self, sid, path, fd, frozen, size, [], True)
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
            StoreError: the file is corrupt (code ``STORE_CORRUPT``); nothing was changed.
        """
        path = self._path(session_id)
        if mode == "read":
            log = await self._thread(partial(_read_path, path), session_id)
            if log is None or log.header is None or not log.events:
                raise SessionNotFoundError(f"session {session_id!r} not found")
            return _JsonlReadHandle(self, session_id, log.header)
        fd, stored = await self._thread(partial(_open_write_sync, path, session_id), session_id)
        assert stored.header is not None
        return _JsonlWriteHandle(
            self, session_id, path, fd, stored.header, stored.valid_end, stored.events, False
        )

    async def list(self) -> list[SessionInfo]:
        """List stored sessions (files with at least one event); corrupt files are skipped."""
        return await self._thread(partial(_list_sync, self._directory))

    async def stat(self, session_id: str) -> SessionInfo | None:
        """Describe one stored session, or None when absent.

        Raises:
            StoreError: the file is corrupt (code ``STORE_CORRUPT``).
        """
        path = self._path(session_id)
        log = await self._thread(partial(_read_path, path), session_id)
        if log is None or log.header is None or not log.events:
            return None
        return info_from_events(log.header, log.events)

    async def delete(self, session_id: str) -> None:
        """Delete a session's file (a live owner keeps writing to the unlinked file)."""
        path = self._path(session_id)
        await self._thread(partial(_unlink, path), session_id)

    async def aclose(self) -> None:
        """Nothing to release: each write handle owns its descriptor."""
        await trio.lowlevel.checkpoint()


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
