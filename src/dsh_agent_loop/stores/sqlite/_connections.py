"""``SqliteStore``'s connections: the writer, the reader, and the one hop to each.

Design. One writer connection serves every session of the file; a second one serves reads
(WAL lets it read while the writer commits). Each has a trio lock (one user at a time), and
every blocking call runs in a worker thread, one hop per call (``_threads``), except that
concurrent reads share hops (``_reads``); the trio thread never waits on SQLite. The file is
opened by SQLite only: a plain ``open()`` and ``close()`` of it would drop the process's POSIX
locks on it.

A failure is settled on the spot, in the worker: an open transaction is rolled back (the
write lock of the whole file must not outlive it), and a connection that cannot even do that
is closed and replaced on next use. ``commit_attempt`` is one settled commit: committed, not
committed, or read back (``Attempt``). Every failure leaves as a ``StoreError`` naming the
file (``error``), its cause chained.
"""

from __future__ import annotations

import errno
import os
import secrets
import sqlite3
from collections.abc import Callable, Sequence
from functools import partial
from typing import Final, Literal, TypeVar, final

import attrs
import trio

from ..._errors import StoreError
from .._threads import run_in_worker
from . import _sync as sql
from ._owner_lock import OwnerLock
from ._reads import ReadQueue

__all__ = ["RETRY_DELAYS", "Attempt", "Connections", "create_private"]

T = TypeVar("T")

#: The writer's own checkpoint threshold in pages: only a backstop for the background one.
_AUTOCHECKPOINT_PAGES: Final = 10_000
#: Seconds to wait before each repeat of a transaction that stored nothing (busy, lost
#: connection); SQLite's own busy timeout has already waited before a busy error surfaces.
RETRY_DELAYS: Final = (0.01, 0.05, 0.25)


def create_private(path: str) -> None:
    """Create the database file ``0600`` if it does not exist yet (worker thread).

    SQLite would create it ``0644`` (less the umask), and its ``-wal`` and ``-shm`` files take
    the database file's permission bits, so all three end up readable by the owner alone. An
    existing file keeps its bits: whoever made it chose them (a group-shared volume, say).
    The file is made under a name of its own and hard-linked into place, which fails if the
    path exists meanwhile: no descriptor of ours is ever open on the database file itself
    (closing one would drop this process's POSIX locks on it, SQLite's among them). Where hard
    links are not supported, SQLite creates the file (its default bits).
    """
    if os.path.lexists(path):
        return
    temporary = f"{path}.{secrets.token_hex(8)}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # (a umask may have taken the owner's bits away)
    finally:
        os.close(fd)
    try:
        os.link(temporary, path)
    except FileExistsError:
        pass  # someone else made it first: theirs stands
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
            raise
    finally:
        os.unlink(temporary)


@final
@attrs.frozen
class Attempt:
    """What one commit attempt did, as the worker thread settled it."""

    results: list[Exception | None] | None = None
    """Per-session results when the transaction committed."""
    failure: Exception | None = None
    """What stopped it: a database error, or any other exception (rolled back)."""
    stored: list[bool] | None = None
    """After a failure: per session, whether its events turned out stored (read back)."""
    unknown: BaseException | None = None
    """After a failure: why the outcome could not be read back."""
    broken: bool = False
    """The failure left the connection unusable (it was replaced)."""


@final
class Connections:
    """The writer and reader connections of one database file, opened lazily.

    Args:
        path: The database file.
        synchronous: ``NORMAL`` or ``FULL``.
        busy_timeout: Seconds to wait for another process's write lock.
        factory: The ``sqlite3.Connection`` subclass to connect with.
    """

    def __init__(
        self,
        path: str,
        *,
        synchronous: str,
        busy_timeout: float,
        factory: type[sqlite3.Connection],
    ) -> None:
        self.path = path
        self._synchronous = synchronous
        self._busy_timeout = busy_timeout
        self._factory = factory
        self.writer_lock = trio.Lock()
        """Held by every writer transaction, commits included."""
        self.reader_lock = trio.Lock()
        """Held while the reader connection is in use (``ReadQueue``'s hops, closing)."""
        self._reads = ReadQueue(self.reader_lock, self._reader_call)
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self.owner_lock = OwnerLock(path)
        """This store's proof of life as an owner: used by claims, on the writer thread."""
        self.retries = 0
        """Writer transactions repeated after a database error."""

    @property
    def writer(self) -> sqlite3.Connection | None:
        """The open writer connection, if any."""
        return self._writer

    # --- the worker-thread side ---

    def connect(self) -> sqlite3.Connection:
        """Open a configured connection (worker thread): WAL, ``synchronous``, the schema."""
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        create_private(self.path)
        conn = sqlite3.connect(
            self.path,
            timeout=self._busy_timeout,
            isolation_level=None,
            check_same_thread=False,
            factory=self._factory,
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            conn.executescript(sql.SCHEMA)
            sql.migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _writer_conn(self) -> sqlite3.Connection:
        if self._writer is None:
            conn = self.connect()
            try:
                conn.execute(f"PRAGMA wal_autocheckpoint={_AUTOCHECKPOINT_PAGES}")
            except BaseException:
                conn.close()
                raise
            self._writer = conn
        return self._writer

    def _settle_writer(self) -> Literal["rolled-back", "unknown", "broken"]:
        """After a failure on the writer connection (worker thread, writer lock held)."""
        conn = self._writer
        state = "broken" if conn is None else sql.settle(conn)
        if state == "broken":
            self._writer = None
            if conn is not None:
                conn.close()
        return state

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
            self._reader = self.connect()
        try:
            return fn(self._reader)
        except BaseException as exc:
            conn = self._reader
            settle = isinstance(exc, sqlite3.Error) or conn.in_transaction
            if settle and sql.settle(conn) == "broken":
                self._reader = None
                conn.close()
            raise

    def _commit_call(self, work: Sequence[sql.Work]) -> Attempt:
        """One commit attempt, settled: committed, not committed, or read back."""
        try:
            conn = self._writer_conn()
        except Exception as exc:
            return Attempt(failure=exc, stored=[False] * len(work), broken=True)
        try:
            return Attempt(results=sql.commit(conn, work))
        except sqlite3.Error as exc:
            failure = exc
        except Exception as exc:  # rolled back by ``commit``: nothing was stored
            broken = conn.in_transaction and self._settle_writer() == "broken"
            return Attempt(failure=exc, stored=[False] * len(work), broken=broken)
        state = self._settle_writer()
        if state == "rolled-back":
            return Attempt(failure=failure, stored=[False] * len(work))
        try:
            conn = self._writer_conn()
            stored = [sql.rows_stored(conn, w) for w in work]
        except Exception as exc:
            if isinstance(exc, sqlite3.Error):
                self._settle_writer()
            return Attempt(failure=failure, unknown=exc, broken=state == "broken")
        return Attempt(failure=failure, stored=stored, broken=state == "broken")

    # --- the trio side ---

    def error(self, exc: BaseException, sid: str | None = None) -> StoreError:
        """``exc`` as a ``StoreError`` naming the file (and the session), its cause chained."""
        where = f"sqlite store {self.path!r}" + ("" if sid is None else f", session {sid!r}")
        what = str(exc) if isinstance(exc, sqlite3.Error) else f"{type(exc).__name__}: {exc}"
        error = StoreError(f"{where}: {what}")
        if sql.is_corrupt(exc):
            error.code = "STORE_CORRUPT"
        error.__cause__ = exc
        return error

    async def hop(self, fn: Callable[[], T]) -> T:
        """Run the blocking ``fn`` in a worker thread; any failure leaves as a ``StoreError``."""
        try:
            return await run_in_worker(fn)
        except StoreError:
            raise
        except Exception as exc:  # sqlite3, OS (the file's directory), encoding, bugs
            raise self.error(exc) from exc

    async def on_writer(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run an idempotent writer transaction, repeated a few times after a database error."""
        async with self.writer_lock:
            for delay in (*RETRY_DELAYS, None):
                try:
                    return await run_in_worker(partial(self._writer_call, fn))
                except StoreError:
                    raise
                except sqlite3.Error as exc:
                    if delay is None or sql.is_corrupt(exc):
                        raise self.error(exc) from exc
                except Exception as exc:  # not worth another try (rolled back)
                    raise self.error(exc) from exc
                self.retries += 1
                await trio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def on_reader(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run a read on the reader connection (concurrent reads share hops: ``ReadQueue``)."""
        try:
            return await self._reads.read(fn)
        except StoreError:
            raise
        except Exception as exc:  # sqlite3, OS (the file's directory), decoding, bugs
            raise self.error(exc) from exc

    async def commit_attempt(self, work: Sequence[sql.Work]) -> Attempt:
        """One settled commit of ``work`` (the caller holds the writer lock)."""
        return await run_in_worker(partial(self._commit_call, work))

    def _drop_owner_lock(self) -> None:
        """Drop the owner lock, unless an owner row still carries its slot (worker thread).

        A handle still open would otherwise lose its session to the first process that asked:
        its owner would look dead. Then the lock stays, as the ownership does, until the
        handle's release and the next close (or until the process ends). So it does when the
        rows cannot be read (the safe side: closing must not fail on it).
        """
        slot = self.owner_lock.held_slot
        try:
            in_use = slot is not None and sql.slot_in_use(self._writer_conn(), slot)
        except (sqlite3.Error, OSError):
            self._settle_writer()
            return
        if not in_use:
            self.owner_lock.close()

    async def close(self) -> None:
        """Close both connections (the caller holds both locks); they reopen on next use.

        The owner lock goes too, once no owner row carries its slot (``_drop_owner_lock``).
        """
        try:
            if self.owner_lock.held_slot is not None:
                await self.hop(self._drop_owner_lock)
        finally:
            conns = [c for c in (self._writer, self._reader) if c is not None]
            self._writer = self._reader = None
            for conn in conns:
                await self.hop(conn.close)
