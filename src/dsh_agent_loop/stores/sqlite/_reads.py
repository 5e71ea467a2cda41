"""``SqliteStore``'s reads: the reads that queue while one runs share the next worker hop.

A read costs a worker-thread hop (about 0.1 ms) besides its SQL and decoding. Reads made
concurrently (many sessions read back at once, a server answering many clients) queue while a
hop runs, and the next hop runs up to ``READ_BATCH`` of them one after another on the reader
connection, under the reader lock (``_group_commit.Batches``). Each read keeps its own
outcome: one that fails fails alone. A read that runs alone costs what it did before (one
hop). Cancelled while queued, a read leaves the queue; a leader cancelled before its hop ran
hands the reads it took back to the queue.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from functools import partial
from typing import Any, Final, Generic, TypeVar, final

import attrs
import outcome
import trio

from .._group_commit import Batches
from .._threads import run_in_worker

__all__ = ["READ_BATCH", "ReadQueue"]

T = TypeVar("T")

#: Most reads one hop runs.
READ_BATCH: Final = 64

Read = Callable[[sqlite3.Connection], T]
"""One read: runs on the reader connection, in the worker thread."""


@final
@attrs.define(eq=False)
class _Queued(Generic[T]):
    read: Read[T]
    result: outcome.Outcome[T] | None = None


@final
class ReadQueue:
    """The reads of one store's reader connection, several per worker hop.

    Args:
        lock: The reader lock (held while a hop runs; closing the store takes it too).
        call: Runs one read on the reader connection (worker thread), settling it on failure.
        limit: At most this many reads per hop.
    """

    def __init__(
        self,
        lock: trio.Lock,
        call: Callable[[Read[Any]], Any],
        *,
        limit: int = READ_BATCH,
    ) -> None:
        self._lock = lock
        self._call = call
        self._batches = Batches[_Queued[Any]](self._hop, limit=limit)

    async def read(self, read: Read[T]) -> T:
        """Run ``read`` in a hop of its own or in a shared one; return or raise its outcome."""
        queued = _Queued(read)
        await self._batches.submit(queued)
        assert queued.result is not None
        return queued.result.unwrap()

    async def _hop(self, batch: list[_Queued[Any]]) -> None:
        async with self._lock:
            results = await run_in_worker(partial(self._run, batch))
        for queued, result in zip(batch, results, strict=True):
            queued.result = result

    def _run(self, batch: list[_Queued[Any]]) -> list[outcome.Outcome[Any]]:
        """Run every read of ``batch`` (worker thread), each to its own outcome."""
        call = self._call
        return [outcome.capture(call, queued.read) for queued in batch]
