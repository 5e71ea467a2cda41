"""Shared append rules for backends: validate a batch against what is stored.

A retried batch must be neither lost nor duplicated: the leading events that are already
stored with identical content are skipped; a different event at a stored seq, or a gap,
is a ``SequenceConflictError``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..errors import SequenceConflictError
from ..events import Event

__all__ = ["new_suffix"]


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
