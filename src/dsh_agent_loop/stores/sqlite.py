"""``SqliteStore``: every session of a process in one SQLite file, with group commit.

Design. One writer connection per store serves all its sessions, so 10,000 live sessions
hold two descriptors, not 10,000; a second connection serves reads (WAL lets it read while
the writer commits). Every blocking call runs in a worker thread (one hop per call, see
``_threads``); the trio thread never waits on SQLite. The file is opened by SQLite only (a
plain ``open()`` and ``close()`` of the file would drop the process's POSIX locks on it).
The transactions themselves live in ``_sqlite_sync``.

Ownership is an ``owners`` row per session: (host, pid, process start time, random token).
Taking it happens in one ``BEGIN IMMEDIATE`` transaction, so exactly one of several racing
processes wins. An owner whose process is gone, or whose pid now names a process with a
different start time, is dead and is replaced at once; an owner in this same process is
live (two handles on one session conflict here too).

Group commit. Appends are staged on the handle. ``flush`` queues its handle; if no commit
round is in flight, it leads one: it commits the staged events of every queued handle in one
transaction, checking inside it, per handle, that the owner row still carries the handle's
token. Flushes that queue while a round runs wait for it to end (all wake together), and the
first of them whose events are still staged leads the next round for everyone queued by
then. No task is started by the store: the flushing tasks do the work themselves.

Storage faults. A failed commit is settled before anything else happens: an open transaction
is rolled back (nothing was stored); when none is open any more (the failure came from
``COMMIT``, or SQLite rolled back by itself) the outcome is read back, and events stored
with identical content count as committed — never a blind retry. Busy/locked errors and a
lost connection are retried a few times once nothing was stored; other errors (disk full,
I/O error) fail the flush; an outcome that cannot be read back fails the handle for good.

Any failure is a ``StoreError``, and only the sessions it concerns see it. Every transaction
is rolled back on any exception (the write lock of the whole file must not outlive it). An
event that cannot be encoded fails its own handle for good before the transaction starts,
and a commit that fails for a reason other than a database error (a bug, a value the driver
refuses) is tried again one handle at a time, so it fails only the handle that causes it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final, Literal, TypeVar, final, overload

import attrs
import outcome
import trio

from .._frozen import freeze
from ..errors import (
    SessionOwnershipLostError,
    StoreError,
)
from ..events import Event
from ..session.store import ReadHandle, SessionInfo, WriteHandle
from . import _sqlite_sync as sql
from ._check import check_range, read_stored_and_staged, stage
from ._rows import last_turn_end, load_header
from ._threads import run_in_worker

__all__ = ["SqliteStore", "SqliteStoreStatistics"]

T = TypeVar("T")

#: Release after a timed-out close gets this much extra time (best effort).
_RELEASE_GRACE: Final = 1.0
#: Commits between two background WAL checkpoints (about SQLite's default 1,000 pages).
_CHECKPOINT_EVERY: Final = 300
#: The writer's own checkpoint threshold in pages: only a backstop for the background one.
_AUTOCHECKPOINT_PAGES: Final = 10_000
#: Seconds to wait before each repeat of a transaction that stored nothing (busy, lost
#: connection); SQLite's own busy timeout has already waited before a busy error surfaces.
_RETRY_DELAYS: Final = (0.01, 0.05, 0.25)


@attrs.frozen
class SqliteStoreStatistics:
    """Counters of a ``SqliteStore`` (since it was built)."""

    commits: int
    """Flush transactions committed."""
    handles_committed: int
    """Handle flushes served by those transactions (more than ``commits`` when grouped)."""
    events_committed: int
    """Events stored by them."""
    retries: int = 0
    """Transactions repeated after a failure that stored nothing."""
    checkpoints: int = 0
    """Background WAL checkpoints finished."""


@attrs.frozen
class _Round:
    """What one commit attempt did, as the worker thread settled it."""

    results: list[Exception | None] | None = None
    """Per-handle results when the transaction committed."""
    failure: Exception | None = None
    """What stopped it: a database error, or any other exception (rolled back)."""
    stored: list[bool] | None = None
    """After a failure: per handle, whether its events turned out stored (read back)."""
    unknown: BaseException | None = None
    """After a failure: why the outcome could not be read back."""
    broken: bool = False
    """The failure left the connection unusable (it was replaced)."""


# --- handles -----------------------------------------------------------------------------------


@attrs.define(eq=False)
class _SqliteReadHandle:
    _store: SqliteStore
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
        return await self._store._on_reader(
            partial(sql.events, sid=self._session_id, start=offset, stop=stop)
        )

    async def close(self) -> None:
        await trio.lowlevel.checkpoint()


@attrs.define(eq=False)
class _SqliteWriteHandle:
    _store: SqliteStore
    _session_id: str
    _header: Mapping[str, Any]
    _token: str
    _stored_count: int
    _staged: list[Event] = attrs.Factory(list)
    _rows: list[sql.Row] = attrs.Factory(list)
    """The ``events`` rows of ``_staged[:len(_rows)]``, encoded by ``_pending_rows``."""
    _flush_error: Exception | None = None
    _lost: bool = False
    _failure: StoreError | None = None
    """Set when a commit's outcome could not be settled: nothing more is written."""
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

    async def _fetch(self, start: int, stop: int) -> list[Event]:
        return await self._store._on_reader(
            partial(sql.events, sid=self._session_id, start=start, stop=stop)
        )

    async def read(self, offset: int = 0, length: int | None = None) -> list[Event]:
        return await read_stored_and_staged(
            offset, length, self._stored_count, self._staged, self._fetch
        )

    async def append(self, events: Sequence[Event]) -> None:
        self._check_usable()
        staged = self._staged
        await stage(self._session_id, self._stored_count, staged, events, self._fetch)
        self._check_usable()

    async def flush(self) -> None:
        self._check_usable()
        await self._store._flush(self)

    async def renew(self) -> None:
        self._check_usable()
        await trio.lowlevel.checkpoint()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        error: Exception | None = None
        deadline = trio.current_time() + self._store._close_timeout
        with trio.CancelScope(shield=True):
            with trio.move_on_at(deadline) as scope:
                try:
                    await self._store._flush(self)
                except Exception as exc:  # raised once ownership is released
                    error = exc
            if scope.cancelled_caught:
                error = StoreError(
                    f"session {self._session_id!r}: close timed out after "
                    f"{self._store._close_timeout}s; {len(self._staged)} unflushed events dropped"
                )
            release_error = await self._release(deadline)
        error = error or release_error
        if error is not None:
            raise error

    async def abort(self) -> None:
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            error = await self._release(trio.current_time() + self._store._close_timeout)
        if error is not None:
            raise error

    async def _release(self, deadline: float) -> StoreError | None:
        """Drop staged events and the owner row (and the session if nothing was stored).

        Past ``deadline`` it still gets a short grace: releasing is worth a try.
        """
        self._staged.clear()
        self._rows.clear()
        self._store._flush_queue.pop(self, None)
        release = partial(
            sql.release,
            sid=self._session_id,
            token=self._token,
            drop_if_empty=self._stored_count == 0,
        )
        with trio.move_on_at(max(deadline, trio.current_time() + _RELEASE_GRACE)):
            try:
                await self._store._on_writer(release)
            except StoreError as exc:
                return exc
            return None
        return StoreError(f"session {self._session_id!r}: releasing ownership timed out")

    def _check_usable(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("write handle is closed")
        self._check_writable()

    def _check_writable(self) -> None:
        if self._lost:
            raise SessionOwnershipLostError(
                f"session {self._session_id!r}: write ownership was lost"
            )
        if self._failure is not None:
            raise self._failure

    def _pending_rows(self) -> list[sql.Row]:
        """The rows of every staged event: those not encoded yet are encoded now.

        Encoding happens here, on the trio thread right before a commit hop, rather than in
        the worker: the events are hot in this thread's cache, and the worker then runs
        nothing but SQL. Staged events only grow at the end and leave from the front (with
        their rows), so ``_rows`` stays a prefix of ``_staged``.
        """
        rows, staged = self._rows, self._staged
        if len(rows) < len(staged):
            sid, row = self._session_id, sql.event_row
            rows.extend([row(sid, event) for event in staged[len(rows) :]])
        return rows

    def _committed(self, count: int) -> None:
        self._stored_count += count
        del self._staged[:count]
        del self._rows[:count]


# --- the store ---------------------------------------------------------------------------------


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
        self._synchronous = "FULL" if durability == "full" else "NORMAL"
        self._busy_timeout = busy_timeout
        self._close_timeout = close_timeout
        self._factory = connection_factory
        self._writer_lock = trio.Lock()
        self._reader_lock = trio.Lock()
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._me: sql.Owner | None = None
        self._flush_queue: dict[_SqliteWriteHandle, None] = {}
        self._round: trio.Event | None = None
        """Set while a commit round is in flight; flushes queued meanwhile wait for it."""
        self._commits = self._handles_committed = self._events_committed = self._retries = 0
        self._checkpointer: sqlite3.Connection | None = None
        self._checkpointing: trio.Event | None = None
        self._commits_since_checkpoint = self._checkpoints = 0

    async def __aenter__(self) -> SqliteStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def statistics(self) -> SqliteStoreStatistics:
        """Return the store's commit counters."""
        return SqliteStoreStatistics(
            self._commits,
            self._handles_committed,
            self._events_committed,
            self._retries,
            self._checkpoints,
        )

    # --- connections (the worker-thread side) ---

    def _connect(self) -> sqlite3.Connection:
        parent = os.path.dirname(os.path.abspath(self._path))
        os.makedirs(parent, exist_ok=True)
        conn = sqlite3.connect(
            self._path,
            timeout=self._busy_timeout,
            isolation_level=None,
            check_same_thread=False,
            factory=self._factory,
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            conn.executescript(sql.SCHEMA)
        except BaseException:
            conn.close()
            raise
        return conn

    def _writer_conn(self) -> sqlite3.Connection:
        if self._writer is None:
            conn = self._connect()
            try:
                conn.execute(f"PRAGMA wal_autocheckpoint={_AUTOCHECKPOINT_PAGES}")
            except BaseException:
                conn.close()
                raise
            self._writer = conn
        return self._writer

    def _checkpoint_call(self) -> None:
        """Copy the WAL back into the database file (worker thread, never two at once)."""
        if self._checkpointer is None:
            self._checkpointer = self._connect()
        self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def _settle_writer(self) -> Literal["rolled-back", "unknown", "broken"]:
        """After a failure on the writer connection (worker thread, writer lock held)."""
        conn, state = self._writer, "broken"
        if conn is not None:
            state = sql.settle(conn)
        if state == "broken":
            self._writer = None
            if conn is not None:
                conn.close()
        return state  # type: ignore[return-value]

    def _writer_call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return fn(self._writer_conn())
        except BaseException as exc:
            conn = self._writer
            if isinstance(exc, sqlite3.Error) or (conn is not None and conn.in_transaction):
                self._settle_writer()
            raise

    def _reader_call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._reader is None:
            self._reader = self._connect()
        try:
            return fn(self._reader)
        except BaseException as exc:
            conn = self._reader
            settle = isinstance(exc, sqlite3.Error) or conn.in_transaction
            if settle and sql.settle(conn) == "broken":
                self._reader = None
                conn.close()
            raise

    def _commit_call(self, work: Sequence[sql.Work]) -> _Round:
        """One commit attempt, settled: committed, not committed, or read back."""
        try:
            conn = self._writer_conn()
        except Exception as exc:
            return _Round(failure=exc, stored=[False] * len(work), broken=True)
        try:
            return _Round(results=sql.commit(conn, work))
        except sqlite3.Error as exc:
            failure = exc
        except Exception as exc:  # rolled back by ``commit``: nothing was stored
            broken = conn.in_transaction and self._settle_writer() == "broken"
            return _Round(failure=exc, stored=[False] * len(work), broken=broken)
        state = self._settle_writer()
        if state == "rolled-back":
            return _Round(failure=failure, stored=[False] * len(work))
        try:
            conn = self._writer_conn()
            stored = [sql.rows_stored(conn, w) for w in work]
        except Exception as exc:
            if isinstance(exc, sqlite3.Error):
                self._settle_writer()
            return _Round(failure=failure, unknown=exc, broken=state == "broken")
        return _Round(failure=failure, stored=stored, broken=state == "broken")

    # --- connections (the trio side) ---

    def _error(self, exc: BaseException, sid: str | None = None) -> StoreError:
        """``exc`` as a ``StoreError`` naming the file (and the session), its cause chained."""
        where = f"sqlite store {self._path!r}" + ("" if sid is None else f", session {sid!r}")
        what = str(exc) if isinstance(exc, sqlite3.Error) else f"{type(exc).__name__}: {exc}"
        error = StoreError(f"{where}: {what}")
        if sql.is_corrupt(exc):
            error.code = "STORE_CORRUPT"
        error.__cause__ = exc
        return error

    async def _hop(self, fn: Callable[[], T]) -> T:
        try:
            return await run_in_worker(fn)
        except StoreError:
            raise
        except Exception as exc:  # sqlite3, OS (the file's directory), encoding, bugs
            raise self._error(exc) from exc

    async def _on_writer(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run an idempotent writer transaction, repeated a few times after a database error."""
        async with self._writer_lock:
            for delay in (*_RETRY_DELAYS, None):
                try:
                    return await run_in_worker(partial(self._writer_call, fn))
                except StoreError:
                    raise
                except sqlite3.Error as exc:
                    if delay is None or sql.is_corrupt(exc):
                        raise self._error(exc) from exc
                except Exception as exc:  # not worth another try (rolled back)
                    raise self._error(exc) from exc
                self._retries += 1
                await trio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _on_reader(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        async with self._reader_lock:
            return await self._hop(partial(self._reader_call, fn))

    async def _whoami(self) -> sql.Owner:
        """This process as an owner (host, pid, start time), computed once."""
        if self._me is None:
            pid = os.getpid()
            start_time = await self._hop(lambda: sql.process_start_time(pid)[1])
            self._me = sql.Owner(socket.gethostname(), pid, start_time)
        return self._me

    # --- group commit ---

    async def _flush(self, handle: _SqliteWriteHandle) -> None:
        if not handle._staged:
            await trio.lowlevel.checkpoint()
            return
        handle._check_writable()
        self._flush_queue[handle] = None
        while handle._staged and handle._flush_error is None:
            handle._check_writable()  # (a round it rode in may have failed it)
            running = self._round
            if running is not None:  # it may carry our events; if not, lead the next one
                await running.wait()
                continue
            self._round = done = trio.Event()
            try:
                await self._lead_round(handle)
            finally:
                self._round = None
                done.set()
        error, handle._flush_error = handle._flush_error, None
        if error is not None:
            raise error

    async def _lead_round(self, leader: _SqliteWriteHandle) -> None:
        lock = self._writer_lock  # shared with the other writer transactions
        try:
            lock.acquire_nowait()  # uncontended: no scheduler pass (the commit hop yields)
        except trio.WouldBlock:
            await lock.acquire()
        try:
            await self._commit_round(leader)
        finally:
            lock.release()

    async def _commit_round(self, leader: _SqliteWriteHandle) -> None:
        """Commit every queued handle's staged events in one transaction (writer lock held)."""
        self._flush_queue[leader] = None
        batch = [h for h in self._flush_queue if h._staged and not (h._lost or h._failure)]
        for handle in batch:
            self._flush_queue.pop(handle, None)
        failed = await self._commit_batch(batch)
        if len(failed) > 1:  # not a database error: find whose events cause it
            for handle in failed:
                handle._flush_error = None
                await self._commit_batch([handle])

    async def _commit_batch(self, batch: list[_SqliteWriteHandle]) -> list[_SqliteWriteHandle]:
        """Commit ``batch`` in one transaction, retried while nothing was stored and it may help.

        Returns the handles a failure other than a database error left uncommitted (each
        has that failure as its flush error; nothing of theirs was stored).
        """
        delays = iter(_RETRY_DELAYS)
        while batch := [h for h in batch if h._flush_error is None]:
            encoded = [(h, w) for h in batch if (w := self._work(h)) is not None]
            if not encoded:
                return []
            batch, work = [h for h, _ in encoded], [w for _, w in encoded]
            attempt = await run_in_worker(partial(self._commit_call, work))
            if attempt.results is not None:
                self._committed_round()
                for handle, w, result in zip(batch, work, attempt.results, strict=True):
                    self._settle_handle(handle, len(w.rows), result)
                return []
            failure = attempt.failure
            assert failure is not None
            batch = self._after_failure(batch, work, attempt)
            delay = next(delays, None) if batch else None
            if delay is None or not (attempt.broken or sql.is_busy(failure)):
                for handle in batch:  # nothing stored: the events stay staged
                    handle._flush_error = self._error(failure, handle._session_id)
                return [] if isinstance(failure, sqlite3.Error) else batch
            self._retries += 1
            await trio.sleep(delay)
        return []

    def _work(self, handle: _SqliteWriteHandle) -> sql.Work | None:
        """A snapshot of ``handle``'s staged events for the worker (appends may follow).

        None if an event cannot be encoded: the handle then fails for good (that event, and
        every later one, can never be stored).
        """
        try:
            rows = handle._pending_rows()
        except Exception as exc:
            handle._failure = handle._flush_error = StoreError(
                f"session {handle._session_id!r}: an event cannot be stored "
                f"({type(exc).__name__}: {exc}); the session writes no more"
            )
            handle._failure.__cause__ = exc
            return None
        return sql.Work(
            handle._session_id,
            handle._token,
            handle._stored_count,
            rows[:],
            last_turn_end(handle._staged),  # (as long as rows: no await in between)
        )

    def _committed_round(self) -> None:
        self._commits += 1
        self._commits_since_checkpoint += 1
        if self._commits_since_checkpoint >= _CHECKPOINT_EVERY and self._checkpointing is None:
            self._commits_since_checkpoint = 0
            self._start_checkpoint()

    def _start_checkpoint(self) -> None:
        """Checkpoint the WAL in a worker thread, off every flush's path.

        A checkpoint fsyncs (with ``synchronous=NORMAL``) and took milliseconds inside the
        commit that crossed SQLite's threshold, while every other flush waited behind it.
        A passive checkpoint runs beside commits; ``aclose`` waits for it. A failure is
        ignored: the writer's own autocheckpoint remains the backstop.
        """
        done = self._checkpointing = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def finished(ok: bool) -> None:
            self._checkpointing = None
            self._checkpoints += ok
            done.set()

        def deliver(result: outcome.Outcome[None]) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(finished, isinstance(result, outcome.Value))

        trio.lowlevel.start_thread_soon(self._checkpoint_call, deliver)

    def _settle_handle(
        self, handle: _SqliteWriteHandle, count: int, error: Exception | None
    ) -> None:
        if error is None:
            handle._committed(count)
            self._handles_committed += 1
            self._events_committed += count
        else:
            handle._lost = handle._lost or isinstance(error, SessionOwnershipLostError)
            handle._flush_error = error

    def _after_failure(
        self, batch: list[_SqliteWriteHandle], work: list[sql.Work], attempt: _Round
    ) -> list[_SqliteWriteHandle]:
        """Apply a failed attempt; return the handles whose events are known not stored."""
        if attempt.stored is None:  # the outcome is unknown: these handles write no more
            for handle in batch:
                handle._failure = StoreError(
                    f"session {handle._session_id!r}: the outcome of a commit is unknown "
                    f"({attempt.failure}; reading back failed: {attempt.unknown})"
                )
                handle._flush_error = handle._failure
            return []
        if any(attempt.stored):
            self._committed_round()
        pending = []
        for handle, w, stored in zip(batch, work, attempt.stored, strict=True):
            if stored:
                self._settle_handle(handle, len(w.rows), None)
            else:
                pending.append(handle)
        return pending

    # --- SessionStore ---

    async def create(
        self, header: Mapping[str, Any], *, inherited_events: Sequence[Event] = ()
    ) -> WriteHandle:
        """Create a session and take write ownership of it.

        Raises:
            SessionAlreadyExistsError: the id has stored events.
            SessionAlreadyOwnedError: a live writer holds the (not yet flushed) id.
        """
        frozen = freeze(dict(header))
        sid = str(frozen["session_id"])
        me, token = await self._whoami(), secrets.token_hex(16)
        acquire = partial(sql.acquire, sid=sid, me=me, token=token, header=frozen)
        await self._on_writer(acquire)
        handle = _SqliteWriteHandle(self, sid, frozen, token, 0)
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
            SessionNotFoundError: no stored event for ``session_id``.
            SessionAlreadyOwnedError: ``mode="write"`` and a live writer owns it.
        """
        if mode == "read":
            header = await self._on_reader(partial(sql.header, sid=session_id))
            return _SqliteReadHandle(self, session_id, header)
        me, token = await self._whoami(), secrets.token_hex(16)
        acquire = partial(sql.acquire, sid=session_id, me=me, token=token, header=None)
        count, header_json = await self._on_writer(acquire)
        try:
            header = load_header(header_json, session_id)
        except StoreError:  # corrupt: give the ownership just taken back
            release = partial(sql.release, sid=session_id, token=token, drop_if_empty=False)
            with (  # best effort: the corruption is what is reported
                trio.CancelScope(shield=True),
                trio.move_on_after(_RELEASE_GRACE),
                contextlib.suppress(StoreError),
            ):
                await self._on_writer(release)
            raise
        return _SqliteWriteHandle(self, session_id, header, token, count)

    async def list(self) -> list[SessionInfo]:
        """List stored sessions (those with at least one stored event), oldest first."""
        return await self._on_reader(partial(sql.infos, sid=None))

    async def stat(self, session_id: str) -> SessionInfo | None:
        """Describe one stored session, or None when absent."""
        infos = await self._on_reader(partial(sql.infos, sid=session_id))
        return infos[0] if infos else None

    async def delete(self, session_id: str) -> None:
        """Delete a session, its events and its owner row (a live owner then loses it)."""
        await self._on_writer(partial(sql.delete, sid=session_id))

    async def aclose(self) -> None:
        """Close the connections; the store reconnects if used again."""
        async with self._writer_lock, self._reader_lock:
            if self._checkpointing is not None:
                await self._checkpointing.wait()
            conns = [c for c in (self._writer, self._reader, self._checkpointer) if c is not None]
            self._writer = self._reader = self._checkpointer = None
            for conn in conns:
                await self._hop(conn.close)
