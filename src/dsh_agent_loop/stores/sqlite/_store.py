"""``SqliteStore``: every session of a process in one SQLite file, with group commit.

Design. One writer connection per store serves all its sessions, so 10,000 live sessions
hold two descriptors, not 10,000; a second connection serves reads (``_connections``). The
transactions themselves live in ``_sync``, the commit path in ``_commit``, the background WAL
checkpoint in ``_checkpoint``; this module wires them together behind ``SessionStore``.

Ownership is an ``owners`` row per session: (host, pid, process start time, random token,
lock slot). Taking it happens in a ``BEGIN IMMEDIATE`` transaction, so exactly one of several
racing processes wins; claims made concurrently in this process share one (``_claims``), each
with its own outcome. Liveness is proved by a lock, not judged by pid: each owning store holds
an open-file-description lock on its own byte (slot) of ``<path>-owners``, which the kernel
drops when the process dies (``_owner_lock``: why a pid cannot be trusted across the PID
namespaces of containers sharing a volume). An owner whose slot is no longer locked is dead
and is replaced at once; an owner in this same store is live (two handles on one session
conflict here too). Rows from earlier versions, without a slot, are judged by host, pid and
start time.

Files. A database file this store creates is ``0600`` (``_connections.create_private``);
SQLite gives its ``-wal`` and ``-shm`` files the database's bits, and so does the lock file.
An existing file keeps the bits it has. Stored seqs that are not dense (a row deleted or
added by hand) are a ``StoreCorruptError`` naming the session and the seq (``_sync``).

Any failure is a ``StoreError``, and only the sessions it concerns see it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import sqlite3
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Literal, final, overload

import attrs
import trio

from ..._errors import StoreError
from ..._frozen import freeze
from ..._session.store import ReadHandle, SessionInfo, StoreStatistics, WriteHandle
from ...events import Event
from .._handles import RELEASE_GRACE, StagedWriteHandle, StoreReadHandle
from .._rows import load_header
from . import _sync as sql
from ._checkpoint import WalCheckpointer
from ._claims import Claims
from ._commit import SqliteBackend, SqliteStaging
from ._connections import Connections

__all__ = ["SqliteStore", "SqliteStoreStatistics"]


def _identity(pid: int) -> tuple[str | None, str | None]:
    """(start time, PID namespace) of this process (worker thread); None where unknown."""
    try:
        pid_ns: str | None = os.readlink("/proc/self/ns/pid")
    except OSError:
        pid_ns = None
    return sql.process_start_time(pid)[1], pid_ns


@final
@attrs.frozen
class SqliteStoreStatistics(StoreStatistics):
    """Counters of a ``SqliteStore`` (since it was built)."""

    checkpoints: int = 0
    """Background WAL checkpoints finished."""


@final
class SqliteStore:
    """Sessions in one SQLite database file (the embedded default backend).

    Args:
        path: The database file; created (with its parent directories) on first use.
        durability: ``"normal"`` (``synchronous=NORMAL``: survives a process crash) or
            ``"full"`` (``synchronous=FULL``: also survives power loss).
        busy_timeout: Seconds to wait for another process's write lock.
        close_timeout: Bound, in seconds, on a write handle's ``close``.
        connection_factory: The ``sqlite3.Connection`` subclass to open connections with
            (``sqlite3.connect(factory=...)``); tests pass one that injects faults.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Literal["normal", "full"] = "normal",
        busy_timeout: float = 5.0,
        close_timeout: float = 10.0,
        connection_factory: type[sqlite3.Connection] = sqlite3.Connection,
    ) -> None:
        if durability not in ("normal", "full"):
            raise ValueError(f"durability must be 'normal' or 'full', not {durability!r}")
        self._path = os.fspath(path)
        self._close_timeout = close_timeout
        self._connections = Connections(
            self._path,
            synchronous="FULL" if durability == "full" else "NORMAL",
            busy_timeout=busy_timeout,
            factory=connection_factory,
        )
        self._checkpointer = WalCheckpointer(self._connections)
        self._backend = SqliteBackend(self._connections, self._checkpointer)
        self._claims = Claims(self._connections, self._whoami)
        self._me: sql.Owner | None = None

    @property
    def path(self) -> str:
        """The database file's path, as given."""
        return self._path

    async def __aenter__(self) -> SqliteStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def statistics(self) -> SqliteStoreStatistics:
        """Return the store's commit counters."""
        backend = self._backend
        return SqliteStoreStatistics(
            commits=backend.commits,
            handles_committed=backend.handles_committed,
            events_committed=backend.events_committed,
            retries=backend.retries + self._connections.retries,
            checkpoints=self._checkpointer.checkpoints,
        )

    async def _whoami(self) -> sql.Owner:
        """This process as an owner (host, pid, start time, PID namespace), computed once."""
        if self._me is None:
            pid = os.getpid()
            start_time, pid_ns = await self._connections.hop(partial(_identity, pid))
            lock = self._connections.owner_lock
            self._me = sql.Owner(socket.gethostname(), pid, start_time, pid_ns, lock)
        return self._me

    def _handle(self, sid: str, header: Mapping[str, Any], token: str, count: int) -> WriteHandle:
        staging = SqliteStaging(sid, token, count)
        return StagedWriteHandle(self._backend, staging, header, self._close_timeout)

    async def _read_range(self, sid: str, start: int, stop: int | None) -> list[Event]:
        return await self._connections.on_reader(
            partial(sql.events, sid=sid, start=start, stop=stop)
        )

    # --- SessionStore ---

    async def create(
        self, header: Mapping[str, Any], *, inherited_events: Sequence[Event] = ()
    ) -> WriteHandle:
        """Create a session and take write ownership of it.

        Raises:
            SessionAlreadyExistsError: the id has stored events.
            SessionAlreadyOwnedError: a live writer holds the (not yet flushed) id.
        """
        frozen = freeze(header)
        sid, token = str(frozen["session_id"]), secrets.token_hex(16)
        await self._claims.claim(sid, token, frozen)
        handle = self._handle(sid, frozen, token, 0)
        if inherited_events:
            try:
                await handle.append(list(inherited_events))
            except BaseException:  # nobody gets the handle: give the ownership back
                with contextlib.suppress(StoreError):
                    await handle.abort()
                raise
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
            SessionNotFoundError: no stored event for ``session_id``.
            SessionAlreadyOwnedError: ``mode="write"`` and a live writer owns it.
            StoreCorruptError: stored data of the session is corrupt (seqs not dense: the
                message names the seq; a header that does not decode); nothing is taken.
        """
        connections = self._connections
        if mode == "read":
            header = await connections.on_reader(partial(sql.header, sid=session_id))
            return StoreReadHandle(session_id, header, partial(self._read_range, session_id))
        token = secrets.token_hex(16)
        count, header_json = await self._claims.claim(session_id, token, None)
        try:
            header = load_header(header_json, session_id)
        except StoreError:  # corrupt: give the ownership just taken back
            release = partial(sql.release, sid=session_id, token=token, drop_if_empty=False)
            with (  # best effort: the corruption is what is reported
                trio.CancelScope(shield=True),
                trio.move_on_after(RELEASE_GRACE),
                contextlib.suppress(StoreError),
            ):
                await connections.on_writer(release)
            raise
        return self._handle(session_id, header, token, count)

    async def list(self) -> list[SessionInfo]:
        """List stored sessions (those with at least one stored event), oldest first."""
        return await self._connections.on_reader(partial(sql.infos, sid=None))

    async def stat(self, session_id: str) -> SessionInfo | None:
        """Describe one stored session, or None when absent."""
        infos = await self._connections.on_reader(partial(sql.infos, sid=session_id))
        return infos[0] if infos else None

    async def delete(self, session_id: str) -> None:
        """Delete a session, its events and its owner row (a live owner then loses it)."""
        await self._connections.on_writer(partial(sql.delete, sid=session_id))

    async def aclose(self) -> None:
        """Close the connections and end the checkpoint thread; the store reconnects if used."""
        connections = self._connections
        async with connections.writer_lock, connections.reader_lock:
            await self._checkpointer.aclose()
            await connections.close()
