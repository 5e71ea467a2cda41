"""Tests for dsh_agent_loop.config._converter: the library's one converter."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dsh_agent_loop import events
from dsh_agent_loop._frozen import FrozenDict, freeze
from dsh_agent_loop.config import converter
from dsh_agent_loop.events import Event, event_from_json, event_to_json, make_event


def test_there_is_one_converter() -> None:
    assert not hasattr(events, "converter")
    assert not hasattr(events, "_make_converter")


@given(
    seq=st.none() | st.integers(min_value=0),
    data=st.dictionaries(st.text(max_size=4), st.lists(st.integers(), max_size=3), max_size=3),
    sources=st.none() | st.tuples(st.integers(min_value=0)),
    ignorable=st.booleans(),
)
def test_events_round_trip_through_the_converter_and_json(
    seq: int | None, data: dict[str, list[int]], sources: tuple[int] | None, ignorable: bool
) -> None:
    event = make_event(
        "user/message", seq, 1.5, freeze(data), source_event_seqs=sources, ignorable=ignorable
    )
    raw = converter.unstructure(event, Event)
    assert raw == events.event_to_dict(event)
    assert converter.structure(raw, Event) == event
    assert event_from_json(event_to_json(event)) == event


def test_frozen_dicts_structure_deep_frozen() -> None:
    value = converter.structure({"a": [1, {"b": 2}]}, FrozenDict)
    assert value == {"a": (1, {"b": 2})}
    assert type(value["a"][1]) is FrozenDict
