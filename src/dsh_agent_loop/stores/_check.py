"""Shared handle rules for backends: read ranges, and validate a batch against what is stored.

A retried batch must be neither lost nor duplicated: the leading events that are already
stored with identical content are skipped; a different event at a stored seq, or a gap,
is a ``SequenceConflictError``. Write handles stage appends in memory until ``flush``; the
helpers here read across the stored prefix and the staged events, and stage a batch.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import trio

from .._errors import SequenceConflictError
from ..events import Event

__all__ = ["check_range", "new_suffix", "read_stored_and_staged", "stage"]

#: Stands for "not stored at this seq" when comparing a retried batch.
_MISSING: Final = Event(type="", seq=-1, time=0.0, data={})


def new_suffix(
    session_id: str, next_seq: int, events: Sequence[Event], stored_at: Callable[[int], Event]
) -> Sequence[Event]:
    """Return the part of ``events`` that is not stored yet.

    Args:
        session_id: For error messages.
        next_seq: The next seq the store expects (stored plus staged).
        events: The batch, with dense increasing seqs.
        stored_at: Returns the stored (or staged) event at a seq below ``next_seq``.

    Raises:
        SequenceConflictError: a gap, non-dense seqs, or different content at a stored seq.
    """
    if not events:
        return events
    first = events[0].seq
    if first == next_seq and len(events) == 1:  # the common case: one new event, in place
        return events
    if first is None or first > next_seq:
        raise SequenceConflictError(
            f"session {session_id!r}: append at seq {first} leaves a gap (next is {next_seq})"
        )
    for i, event in enumerate(events):
        if event.seq != first + i:
            raise SequenceConflictError(f"session {session_id!r}: batch seqs are not dense")
    skip = 0
    for event in events:
        assert event.seq is not None
        if event.seq >= next_seq:
            break
        if stored_at(event.seq) != event:
            raise SequenceConflictError(
                f"session {session_id!r}: different content already stored at seq {event.seq}"
            )
        skip += 1
    return events[skip:]


def check_range(offset: int, length: int | None) -> int | None:
    """The stop index of ``read(offset, length)`` (None: to the end).

    Raises:
        ValueError: a negative offset or length.
    """
    if offset < 0 or (length is not None and length < 0):
        raise ValueError("offset and length must not be negative")
    return None if length is None else offset + length


Fetch = Callable[[int, int], Awaitable[list[Event]]]
"""Reads stored events ``start .. stop`` (exclusive) of one session."""


async def read_stored_and_staged(
    offset: int, length: int | None, stored: int, staged: Sequence[Event], fetch: Fetch
) -> list[Event]:
    """A write handle's ``read``: the stored prefix (via ``fetch``) then its staged events."""
    stop = check_range(offset, length)
    staged = list(staged)
    total = stored + len(staged)
    stop = total if stop is None else min(stop, total)
    out: list[Event] = []
    if offset < stored:
        out = await fetch(offset, min(stop, stored))
    else:
        await trio.lowlevel.checkpoint()
    out.extend(staged[max(offset - stored, 0) : max(stop - stored, 0)])
    return out


async def stage(
    session_id: str, stored: int, staged: list[Event], events: Sequence[Event], fetch: Fetch
) -> None:
    """A write handle's ``append``: compare the part already stored, stage the new suffix.

    Staging without overlap does not yield (the flush that follows does), which saves the
    session writer a scheduler pass per commit.

    Raises:
        SequenceConflictError: see ``new_suffix``.
    """
    first = events[0].seq if events else None
    by_seq: dict[int | None, Event] = {}
    if first is not None and 0 <= first < stored:
        overlap = await fetch(first, min(first + len(events), stored))
        by_seq = {e.seq: e for e in overlap}

    def stored_at(seq: int) -> Event:
        return by_seq.get(seq, _MISSING) if seq < stored else staged[seq - stored]

    staged.extend(new_suffix(session_id, stored + len(staged), events, stored_at))
