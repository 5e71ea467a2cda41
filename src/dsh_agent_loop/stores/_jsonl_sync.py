"""``JsonlStore``'s synchronous side: parsing a session file, locking it, writing, releasing.

Nothing here touches trio; each function runs whole in a worker thread. A file holds the
header on line 1 and one event per line; only the last line may be torn (no newline, or it
does not parse). A line that parses but carries the wrong seq is never a torn write (a write
cut short leaves a prefix of what it wrote), so it is corruption even as the last line: it is
never cut off. A file this store creates is ``0600``; an existing one keeps its bits.
``flock`` is taken on the handle's own descriptor, and the descriptor's inode is compared with
the path's after locking (an aborting owner may have unlinked the file in between). The file is
read and written with ``pread``/``pwrite`` on that descriptor only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Mapping
from typing import Any, Final, final

import attrs

from .._errors import (
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionNotFoundError,
    SessionOwnershipLostError,
    StoreCorruptError,
    StoreError,
)
from .._frozen import freeze, thaw
from .._session.store import SessionInfo, info_from_events
from ..events import Event
from ._rows import decode_event, escape_surrogates

__all__ = [
    "SUFFIX",
    "Log",
    "create",
    "flush",
    "list_sessions",
    "open_write",
    "read_path",
    "release",
    "unlink",
]

SUFFIX: Final = ".jsonl"


@final
@attrs.frozen
class Log:
    """What a file holds: the header (None when torn or missing) and its valid events."""

    header: Mapping[str, Any] | None
    events: list[Event]
    valid_end: int
    """Byte offset just past the last valid line."""


def _corrupt(path: str, line_no: int, why: str, *, last: bool = False) -> StoreCorruptError:
    where = "" if last else " and more lines follow it"
    return StoreCorruptError(
        f"{path}: line {line_no} is corrupt ({why}){where}; the log was left untouched"
    )


class _Misplaced(Exception):
    """A line that parses as an event with another seq than its place (never torn)."""


def _parse_line(line: bytes, index: int) -> Mapping[str, Any] | Event:
    if index == 0:
        header = json.loads(line)
        if not isinstance(header, dict) or not isinstance(header.get("session_id"), str):
            raise ValueError("the header is not an object with a session_id")
        return freeze(header)  # type: ignore[no-any-return]
    event = decode_event(line)
    if event.seq != index - 1:
        raise _Misplaced(f"seq {event.seq!r} where {index - 1} was expected")
    return event


def _parse(data: bytes, path: str) -> Log:
    """Parse a session file; a torn last line is left out, a bad earlier line raises."""
    header: Mapping[str, Any] | None = None
    events: list[Event] = []
    pos = 0
    while (newline := data.find(b"\n", pos)) >= 0:
        index = len(events) + (header is not None)
        try:
            item = _parse_line(data[pos:newline], index)
        except _Misplaced as exc:
            raise _corrupt(path, index + 1, str(exc), last=newline + 1 == len(data)) from None
        except ValueError as exc:
            if newline + 1 == len(data):
                break  # the torn last line of an interrupted write
            raise _corrupt(path, index + 1, str(exc)) from None
        if isinstance(item, Event):
            events.append(item)
        else:
            header = item
        pos = newline + 1
    return Log(header, events, pos)


def _read_fd(fd: int) -> bytes:
    chunks: list[bytes] = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def read_path(path: str) -> Log | None:
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
            fd = os.open(path, flags, 0o600)
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


def create(path: str, sid: str, header: Mapping[str, Any]) -> tuple[int, int]:
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


def open_write(path: str, sid: str) -> tuple[int, Log]:
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


def flush(sid: str, fd: int, offset: int, payload: bytes, directory: str | None) -> int:
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


def release(fd: int, path: str, unlink: bool) -> None:
    try:
        if unlink:  # still holding the lock, so nobody else is using this file
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    finally:
        os.close(fd)


def list_sessions(directory: str) -> list[SessionInfo]:
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    infos = []
    for name in names:
        if not name.endswith(SUFFIX):
            continue
        try:
            log = read_path(os.path.join(directory, name))
        except StoreError:
            continue  # corrupt: ``stat``/``open`` report it
        if log is not None and log.header is not None and log.events:
            infos.append(info_from_events(log.header, log.events))
    return infos


def unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
