"""``stores/_rows.py``: the stored JSON is exactly ``event_to_json``'s, hashes and turn ends."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_agent_loop.events import Event, event_from_json, event_to_json
from dsh_agent_loop.stores._rows import event_json, event_sha256, last_turn_end

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(
    type_=st.sampled_from(["user/message", "tool/result", "x/ignorable"]),
    seq=st.integers(0, 2**40),
    time=st.floats(allow_nan=False, allow_infinity=False),
    data=st.dictionaries(st.text(), json_values, max_size=5),
    ignorable=st.booleans(),
    cites=st.none() | st.lists(st.integers(0, 100), max_size=3).map(tuple),
)
def test_event_json_is_event_to_json(
    type_: str,
    seq: int,
    time: float,
    data: dict[str, object],
    ignorable: bool,
    cites: tuple[int, ...] | None,
) -> None:
    event = Event(type_, seq, time, data, ignorable=ignorable, source_event_seqs=cites)
    text = event_json(event)
    assert text == event_to_json(event)
    assert event_from_json(text) == event


@pytest.mark.parametrize("surface_op", ["append", {"op": "replace", "start_seq": 1, "end_seq": 3}])
def test_event_json_with_a_surface_op(surface_op: object) -> None:
    event = Event(
        "assistant/message",
        7,
        1.5,
        {"message": {"role": "assistant", "content": [{"type": "text", "text": "héllo ✓"}]}},
        surface_op=surface_op,
    )
    assert event_json(event) == event_to_json(event)
    assert "héllo ✓" in event_json(event)  # not \u-escaped


def test_sha256_and_last_turn_end() -> None:
    assert event_sha256("abc") == hashlib.sha256(b"abc").digest()
    events = [
        Event("turn/end", 0, 0.0, {"turn": 1, "reason": {"kind": "completed"}}),
        Event("turn/start", 1, 0.0, {"turn": 2}),
        Event("turn/end", 2, 0.0, {"turn": 2, "reason": {"kind": "aborted", "cause": "user"}}),
        Event("user/message", 3, 0.0, {"message": {}}),
    ]
    assert json.loads(last_turn_end(events) or "") == {"kind": "aborted", "cause": "user"}
    assert last_turn_end(events[1:2]) is None
    assert last_turn_end([]) is None
