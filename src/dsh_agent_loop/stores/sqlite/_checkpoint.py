"""The background WAL checkpoint of one ``SqliteStore``, and the one place its thread lives.

Why. A checkpoint copies the WAL back into the database file and fsyncs (with
``synchronous=NORMAL``); run inside the commit that crossed SQLite's threshold it took
milliseconds while every other flush waited behind it. So the writer's own autocheckpoint is
only a backstop, and every ``CHECKPOINT_EVERY`` commits a passive checkpoint runs beside
commits, in a worker thread, on a connection of its own.

Lifecycle. The store owns one ``WalCheckpointer`` for its life. At most one checkpoint thread
runs at a time; ``aclose`` (which the store's ``aclose`` calls holding the writer lock, so no
commit can start another) waits for it and closes its connection: no checkpoint thread or
connection outlives the store's ``aclose``. A failed checkpoint is only counted out.
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Final, final

import outcome
import trio

from ._connections import Connections

__all__ = ["CHECKPOINT_EVERY", "WalCheckpointer"]

#: Commits between two background WAL checkpoints (about SQLite's default 1,000 pages).
CHECKPOINT_EVERY: Final = 300


@final
class WalCheckpointer:
    """Starts a passive WAL checkpoint every ``CHECKPOINT_EVERY`` commits; ``aclose`` ends it.

    Args:
        connections: Where its connection comes from, and how it is closed.
    """

    def __init__(self, connections: Connections) -> None:
        self._connections = connections
        self._conn: sqlite3.Connection | None = None
        self._running: trio.Event | None = None
        """Set while a checkpoint thread runs; set (the event) when it has finished."""
        self._since = 0
        self.checkpoints = 0
        """Checkpoints finished."""

    @property
    def running(self) -> bool:
        """A checkpoint thread is running."""
        return self._running is not None

    @property
    def connected(self) -> bool:
        """The checkpoint connection is open."""
        return self._conn is not None

    def committed(self) -> None:
        """Count one commit; start a checkpoint when one is due and none runs."""
        self._since += 1
        if self._since >= CHECKPOINT_EVERY and self._running is None:
            self._since = 0
            self._start()

    def _checkpoint(self) -> None:
        """Copy the WAL back into the database file (worker thread, never two at once)."""
        if self._conn is None:
            self._conn = self._connections.connect()
        self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def _start(self) -> None:
        done = self._running = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def finished(ok: bool) -> None:
            self._running = None
            self.checkpoints += ok
            done.set()

        def deliver(result: outcome.Outcome[None]) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(finished, isinstance(result, outcome.Value))

        trio.lowlevel.start_thread_soon(self._checkpoint, deliver)

    async def aclose(self) -> None:
        """Wait for a running checkpoint, then close the connection (reopened when due again)."""
        if self._running is not None:
            await self._running.wait()
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._connections.hop(conn.close)
