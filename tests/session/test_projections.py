"""Session projections (``_session/projections.py``): the inbox fold and ``PendingList``."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_agent_loop._agent.inbox import user_message
from dsh_agent_loop._frozen import FrozenDict
from dsh_agent_loop._session.log import Session
from dsh_agent_loop._session.projections import InvalidSpliceError, PendingList
from dsh_agent_loop.events import Event


@pytest.mark.parametrize(
    "data",
    [
        {"target": "next-turn", "start": 1, "removed_count": 0, "inserted": ()},
        {"target": "next-turn", "start": 0, "removed_count": 1, "inserted": ()},
        {"target": "next-turn", "start": -1, "removed_count": 0, "inserted": ()},
        {"target": "elsewhere", "start": 0, "removed_count": 0, "inserted": ()},
        {"target": "next-turn", "start": "0", "removed_count": 0, "inserted": ()},
    ],
)
def test_an_invalid_persisted_splice_is_refused(data):
    good = Event(
        "agent/inbox/spliced",
        0,
        0.0,
        {
            "target": "next-step",
            "start": 0,
            "removed_count": 0,
            "inserted": (user_message("m-1", "x"),),
        },
    )
    bad = Event("agent/inbox/spliced", 1, 0.0, data)
    with pytest.raises(InvalidSpliceError, match="invalid persisted inbox splice at session seq 1"):
        Session({"session_id": "s"}, clock=lambda: 0.0, events=[good, bad])


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 60), st.integers(0, 60), st.integers(0, 40)),
        max_size=25,
    ),
    st.integers(-70, 70),
    st.integers(-70, 70),
    st.sampled_from([None, 1, 2, -1, 3, -3]),
)
def test_pending_list_reads_like_a_list(splices_, start, stop, step):
    """``PendingList`` indexes, slices, iterates and compares like the list it stands for."""
    pending = PendingList()
    model: list[Any] = []
    fresh = iter(range(10**6))
    for at, count, n_new in splices_:
        at = min(at, len(model))
        count = min(count, len(model) - at)
        new = [FrozenDict(id=f"p-{next(fresh)}") for _ in range(n_new)]
        assert pending.splice(at, count, new) == model[at : at + count]
        model[at : at + count] = new
        assert list(pending) == model
        assert len(pending) == len(model)
    assert pending[start:stop:step] == model[start:stop:step]
    assert pending == model
    assert pending == tuple(model)
    assert pending != [*model, FrozenDict(id="extra")]
    for index in (start, stop):
        if -len(model) <= index < len(model):
            assert pending[index] == model[index]
        else:
            with pytest.raises(IndexError):
                pending[index]
    assert list(reversed(pending)) == model[::-1]
    assert isinstance(pending, Sequence)
    for message in model[:3]:
        assert message in pending
        assert pending.index(message) == model.index(message)
        assert pending.count(message) == 1
    assert FrozenDict(id="nobody") not in pending
    with pytest.raises(ValueError, match="not pending"):
        pending.index(FrozenDict(id="nobody"))
    assert not gc.is_tracked(pending)
    if not model:
        assert pending._items == ()  # empty again: the shared empty tuple, no list


def test_an_idle_inbox_and_loop_state_are_not_tracked_by_the_collector():
    session = Session({"session_id": "s"}, clock=lambda: 0.0)
    queued = user_message("m-1", "x")
    session.append(
        Event(
            "agent/inbox/spliced",
            None,
            0.0,
            {"target": "next-turn", "start": 0, "removed_count": 0, "inserted": (queued,)},
        )
    )
    lists = session.inbox.lists
    assert len(lists["next-turn"]) == 1
    session.append(
        Event(
            "agent/inbox/spliced",
            None,
            0.0,
            {"target": "next-turn", "start": 0, "removed_count": 1, "inserted": ()},
        )
    )
    assert session.inbox.lists is lists  # the same two lists for the projection's life
    assert len(lists["next-turn"]) == 0
    session.append(
        Event("step/start", None, 0.0, {"turn": 1, "step": 1}),
        Event(
            "assistant/message",
            None,
            0.0,
            {
                "turn": 1,
                "step": 1,
                "message": {
                    "role": "assistant",
                    "content": [{"type": "tool-call", "call_id": "c1", "name": "t"}],
                },
                "usage": {"input_tokens": 3, "output_tokens": 2},
            },
        ),
    )
    assert session.state.call_ids == {"c1": None}
    assert session.state.counters() == (1, 1, 3, 2, 0, 0)
    gc.collect()
    for part in (session.inbox, lists, lists["next-turn"], session.state, session.surface):
        assert not gc.is_tracked(part), part
    assert not gc.is_tracked(session.state.call_ids)
    assert gc.is_tracked(session)  # the session itself is: it references its writer
