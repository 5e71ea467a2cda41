"""``SqliteStore``'s ownership claims: those that queue while one runs share a transaction.

Taking ownership is one small ``BEGIN IMMEDIATE`` transaction and one worker-thread hop, about
as dear as the rest of creating an agent put together. Claims made concurrently (creates and
write opens of many agents at once) queue while a transaction runs, and the next one carries up to
``CLAIM_BATCH`` of them (``_group_commit.Batches``); alone, a claim costs what it did before.

Each claim keeps its own outcome: one refused (the session exists, a live writer owns it) or
failing for a reason of its own is rolled back to its savepoint and fails alone
(``_sync.acquire_many``); a database error fails every claim of its transaction, after the
writer's usual retries.

Cancellation. A claim cancelled while queued leaves the queue and takes nothing. Cancelled
while the transaction that carries it runs (the worker cannot be stopped), it waits for that
transaction, shielded, for at most ``CLAIM_GRACE`` seconds, and gives back the ownership it
took; should the transaction outlast that wait, the task that ran it gives the ownership back
when it ends. Either way no session stays owned with no handle to release it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final, final

import attrs
import trio

from ..._errors import StoreError
from .._group_commit import Batches
from .._handles import RELEASE_GRACE
from . import _sync as sql
from ._connections import Connections

__all__ = ["CLAIM_BATCH", "CLAIM_GRACE", "Claims"]

#: Most claims one transaction carries.
CLAIM_BATCH: Final = 256
#: Seconds a claim cancelled while its transaction runs waits for it (shielded).
CLAIM_GRACE: Final = 1.0


@final
@attrs.define(eq=False)
class _Claim:
    """One queued claim and what its transaction made of it."""

    claim: sql.Claim
    taken: bool = False
    """A transaction carrying it is running (or ran)."""
    result: tuple[int, str] | Exception | None = None
    """(event count, header JSON), or why the claim failed; None until settled."""
    settled: trio.Event = attrs.Factory(trio.Event)
    """Set when a transaction that took it ended, run or not."""
    abandoned: bool = False
    """Its task was cancelled and stopped waiting: the transaction's task gives it back."""


@final
class Claims:
    """The ownership claims of one store, many per transaction.

    Args:
        connections: The store's connections (claims run on the writer).
        whoami: This process as an owner.
        limit: At most this many claims per transaction.
    """

    def __init__(
        self,
        connections: Connections,
        whoami: Callable[[], Awaitable[sql.Owner]],
        *,
        limit: int = CLAIM_BATCH,
    ) -> None:
        self._connections = connections
        self._whoami = whoami
        self._batches = Batches[_Claim](self._run, limit=limit)

    async def claim(
        self, sid: str, token: str, header: Mapping[str, Any] | None
    ) -> tuple[int, str]:
        """Take ownership of ``sid`` with ``token`` (create it when ``header`` is given).

        Returns:
            The stored event count and the header's stored JSON.

        Raises:
            SessionAlreadyExistsError, SessionAlreadyOwnedError, SessionNotFoundError: as
                ``_sync.acquire``. StoreError: the claim's transaction failed.
        """
        pending = _Claim((sid, token, header))
        try:
            await self._batches.submit(pending)
        except BaseException:
            await self._abandon(pending)
            raise
        result = pending.result
        assert result is not None
        if isinstance(result, Exception):
            raise result
        return result

    async def _abandon(self, pending: _Claim) -> None:
        """Cancelled: give back what the claim took, or leave that to its transaction's task."""
        if pending.taken:
            settled = pending.settled
            with trio.CancelScope(shield=True), trio.move_on_after(CLAIM_GRACE):
                await settled.wait()
            if not settled.is_set():
                pending.abandoned = True  # (no checkpoint since the check: no race)
                return
        if isinstance(pending.result, tuple):
            await self._give_back([pending])

    async def _run(self, batch: list[_Claim]) -> None:
        """Run one transaction of claims; raise only if it did not run (cancelled before)."""
        for pending in batch:
            pending.taken = True
        claims = [p.claim for p in batch]
        results: Sequence[tuple[int, str] | Exception]
        try:
            work = partial(sql.acquire_many, me=await self._whoami(), claims=claims)
            results = await self._connections.on_writer(work)
        except StoreError as exc:  # the transaction failed: every claim of it did
            results = [exc] * len(batch)
        except BaseException:  # it did not run: wake whoever waits, reset for a next one
            for pending in batch:
                pending.taken = False
                pending.settled.set()
                pending.settled = trio.Event()
            raise
        for pending, result in zip(batch, results, strict=True):
            pending.result = self._error(result, pending.claim[0])
            pending.settled.set()
        abandoned = [p for p in batch if p.abandoned and isinstance(p.result, tuple)]
        if abandoned:
            await self._give_back(abandoned)

    def _error(self, result: tuple[int, str] | Exception, sid: str) -> tuple[int, str] | Exception:
        if isinstance(result, StoreError | tuple):
            return result
        return self._connections.error(result, sid)

    async def _give_back(self, claims: Sequence[_Claim]) -> None:
        """Release claims nobody will hold (best effort, shielded, bounded)."""
        releases = [(c.claim[0], c.claim[1], True) for c in claims]
        with (  # what failed here is nobody's to report: the claim's task was cancelled
            trio.CancelScope(shield=True),
            trio.move_on_after(RELEASE_GRACE),
            contextlib.suppress(StoreError),
        ):
            await self._connections.on_writer(partial(sql.release_many, releases=releases))
