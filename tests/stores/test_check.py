"""Shared handle rules (``stores/_check.py``): retried batches, gaps, ranges and staging."""

from __future__ import annotations

import pytest

from dsh_agent_loop._errors import SequenceConflictError
from dsh_agent_loop.events import Event
from dsh_agent_loop.stores._check import check_range, new_suffix, read_stored_and_staged, stage


def ev(seq: int, text: str = "x") -> Event:
    return Event("turn/start", seq, float(seq), {"t": text})


STORED = [ev(0), ev(1), ev(2)]


def stored_at(seq: int) -> Event:
    return STORED[seq]


def test_a_new_batch_after_the_stored_events_is_all_new():
    batch = [ev(3), ev(4)]
    assert list(new_suffix("s", 3, batch, stored_at)) == batch
    assert list(new_suffix("s", 3, [], stored_at)) == []


def test_a_retried_batch_skips_what_is_already_stored():
    batch = [ev(1), ev(2), ev(3)]
    assert list(new_suffix("s", 3, batch, stored_at)) == [ev(3)]
    assert list(new_suffix("s", 3, [ev(0), ev(1)], stored_at)) == []


def test_a_single_event_is_new_only_at_the_next_seq():
    def unread(seq: int) -> Event:
        raise AssertionError("nothing stored needs reading")

    batch = [ev(3)]
    assert new_suffix("s", 3, batch, unread) is batch  # (the common case: no copy, no read)
    assert list(new_suffix("s", 3, [ev(2)], stored_at)) == []  # a retry of a stored event
    with pytest.raises(SequenceConflictError, match="different content already stored at seq 2"):
        new_suffix("s", 3, [ev(2, "other")], stored_at)
    with pytest.raises(SequenceConflictError, match="leaves a gap"):
        new_suffix("s", 3, [ev(4)], unread)


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ([ev(4)], "append at seq 4 leaves a gap \\(next is 3\\)"),
        ([Event("turn/start", None, 0.0, {})], "append at seq None leaves a gap"),
        ([ev(3), ev(5)], "batch seqs are not dense"),
        ([ev(2), ev(2)], "batch seqs are not dense"),
        ([ev(1, "other"), ev(2)], "different content already stored at seq 1"),
    ],
)
def test_gaps_non_dense_batches_and_different_content_conflict(batch, message):
    with pytest.raises(SequenceConflictError, match=message) as info:
        new_suffix("s", 3, batch, stored_at)
    assert "'s'" in str(info.value)
    assert info.value.code == "SEQUENCE_CONFLICT"


@pytest.mark.parametrize(
    ("offset", "length", "stop"), [(0, None, None), (2, 3, 5), (5, 0, 5), (0, 0, 0)]
)
def test_check_range_returns_the_stop_index(offset, length, stop):
    assert check_range(offset, length) == stop


@pytest.mark.parametrize(("offset", "length"), [(-1, None), (0, -1), (-2, -2)])
def test_check_range_refuses_negatives(offset, length):
    with pytest.raises(ValueError, match="must not be negative"):
        check_range(offset, length)


class Fetcher:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    async def __call__(self, start: int, stop: int) -> list[Event]:
        self.calls.append((start, stop))
        return STORED[start:stop]


@pytest.mark.parametrize(
    ("offset", "length", "seqs", "fetched"),
    [
        (0, None, [0, 1, 2, 3, 4], [(0, 3)]),
        (1, 3, [1, 2, 3], [(1, 3)]),
        (3, None, [3, 4], []),
        (4, 10, [4], []),
        (2, 1, [2], [(2, 3)]),
        (9, None, [], []),
    ],
)
async def test_read_stored_and_staged_spans_both(offset, length, seqs, fetched):
    fetch = Fetcher()
    out = await read_stored_and_staged(offset, length, 3, [ev(3), ev(4)], fetch)
    assert [e.seq for e in out] == seqs
    assert fetch.calls == fetched


async def test_stage_appends_the_new_suffix_and_compares_only_the_overlap():
    fetch = Fetcher()
    staged: list[Event] = []
    await stage("s", 3, staged, [ev(3), ev(4)], fetch)
    assert staged == [ev(3), ev(4)]
    assert fetch.calls == []  # no overlap: nothing read back
    await stage("s", 3, staged, [ev(2), ev(3), ev(4), ev(5)], fetch)
    assert staged == [ev(3), ev(4), ev(5)]
    assert fetch.calls == [(2, 3)]


async def test_stage_refuses_a_conflict_and_stages_nothing():
    staged: list[Event] = [ev(3)]
    with pytest.raises(SequenceConflictError, match="different content already stored at seq 0"):
        await stage("s", 3, staged, [ev(0, "changed"), ev(1)], Fetcher())
    with pytest.raises(SequenceConflictError, match="different content already stored at seq 3"):
        await stage("s", 3, staged, [ev(3, "changed")], Fetcher())
    with pytest.raises(SequenceConflictError, match="leaves a gap"):
        await stage("s", 3, staged, [ev(6)], Fetcher())
    assert staged == [ev(3)]
