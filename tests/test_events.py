"""The event vocabulary (``events.py``): ``Event``, ``make_event`` and the JSON form."""

from __future__ import annotations

import copy
import gc
import json
import pickle

import pytest

from dsh_agent_loop import events
from dsh_agent_loop._frozen import FrozenDict, freeze
from dsh_agent_loop.events import (
    DURABLE_TYPES,
    EVENT_FIELDS,
    SURFACE_TYPES,
    Event,
    event_from_dict,
    event_from_json,
    event_to_dict,
    event_to_json,
    make_event,
)


def test_event_freezes_its_data_surface_op_and_seqs():
    e = Event(
        "tool/result",
        3,
        1.5,
        {"content": ["a", {"b": 1}]},
        surface_op={"op": "replace", "start_seq": 1, "end_seq": 2},
        source_event_seqs=[2],
    )
    assert type(e.data) is FrozenDict
    assert e.data["content"] == ("a", FrozenDict(b=1))
    assert type(e.surface_op) is FrozenDict
    assert e.source_event_seqs == (2,)
    assert Event("user/message", 0, 0.0, {}, surface_op="append").surface_op == "append"
    with pytest.raises(AttributeError):
        e.seq = 4  # type: ignore[misc]


@pytest.mark.parametrize("data", [[1, 2], "text", None, 3])
def test_event_data_must_be_a_mapping(data):
    with pytest.raises(TypeError):
        Event("turn/start", 0, 0.0, data)


def test_events_compare_by_value_and_hash():
    a = Event("turn/start", 0, 1.0, {"x": 1})
    b = Event("turn/start", 0, 1.0, {"x": 1})
    assert a == b
    assert hash(a) == hash(b)
    assert a != Event("turn/start", 1, 1.0, {"x": 1})


def test_make_event_writes_its_slots_without_converting():
    data = freeze({"x": [1]})
    e = make_event("user/message", 2, 3.0, data, "append", (1,), True)
    assert e == Event(
        "user/message",
        2,
        3.0,
        {"x": [1]},
        ignorable=True,
        surface_op="append",
        source_event_seqs=[1],
    )
    assert e.data is data
    bare = make_event("turn/end", None, 0.0, data)
    assert (bare.surface_op, bare.source_event_seqs, bare.ignorable) == (None, None, False)


def test_with_seq_copies_at_a_new_position_and_keeps_the_rest():
    e = Event("tool/call", None, 1.0, {"id": "c"}, source_event_seqs=[0], ignorable=True)
    placed = e.with_seq(7)
    assert (placed.seq, placed.time) == (7, 1.0)
    assert placed.data is e.data
    assert placed.source_event_seqs == (0,)
    assert placed.ignorable
    assert e.seq is None  # the original is unchanged
    assert e.with_seq(8, 9.5).time == 9.5


def test_to_dict_leaves_out_defaults():
    plain = Event("turn/start", 0, 1.0, {"a": 1})
    assert event_to_dict(plain) == {"type": "turn/start", "seq": 0, "time": 1.0, "data": {"a": 1}}
    full = Event(
        "tool/result", 1, 2.0, {}, ignorable=True, surface_op="append", source_event_seqs=[0]
    )
    assert event_to_dict(full) == {
        "type": "tool/result",
        "seq": 1,
        "time": 2.0,
        "data": {},
        "ignorable": True,
        "surface_op": "append",
        "source_event_seqs": [0],
    }


@pytest.mark.parametrize(
    "event",
    [
        Event("turn/start", 0, 0.25, {"turn": 1}),
        Event("user/message", None, 1.0, {"content": "héllo \u2028 ☃"}, surface_op="append"),
        Event(
            "tool/result",
            5,
            2.0,
            {"content": [{"type": "text", "text": "x"}], "n": None, "f": 1.5, "b": False},
            surface_op={"op": "replace", "start_seq": 1, "end_seq": 3},
            source_event_seqs=[4],
        ),
        Event("future/thing", 9, 3.0, {"new": True}, ignorable=True),
    ],
)
def test_json_round_trip(event):
    line = event_to_json(event)
    assert "\n" not in line
    compact = json.dumps(json.loads(line), ensure_ascii=False, separators=(",", ":"))
    assert line == compact
    assert event_from_json(line) == event
    assert event_from_json(line.encode()) == event
    assert event_from_dict(json.loads(line)) == event


def test_json_keeps_non_ascii_text_as_is():
    assert "☃" in event_to_json(Event("user/message", 0, 0.0, {"t": "☃"}))


def test_from_dict_fills_missing_optional_fields():
    e = event_from_dict({"type": "turn/start"})
    assert e == Event("turn/start", None, 0.0, {})
    assert event_from_dict({"type": 5, "time": 2}).type == "5"


def test_unknown_types_are_parsed_and_keep_their_ignorable_flag():
    e = event_from_json('{"type":"x/new","seq":0,"time":0,"data":{},"ignorable":true}')
    assert e.type == "x/new"
    assert e.type not in DURABLE_TYPES
    assert e.ignorable


@pytest.mark.parametrize(
    ("text", "exc", "message"),
    [
        ("[1, 2]", TypeError, "an event must be a JSON object"),
        ('{"seq": 0}', KeyError, "type"),
    ],
)
def test_from_dict_refuses_non_objects_and_a_missing_type(text, exc, message):
    with pytest.raises(exc, match=message):
        event_from_dict(json.loads(text))


@pytest.mark.parametrize(
    "text", ["not json", "[1, 2]", '{"seq": 0}', '{"type": "t", "data": [1]}', ""]
)
def test_from_json_turns_every_bad_input_into_a_value_error(text):
    with pytest.raises(ValueError, match="not a JSON event"):
        event_from_json(text)


def test_type_vocabulary():
    assert SURFACE_TYPES <= DURABLE_TYPES
    assert {"turn/start", "tool/call", "tool/result", "agent/inbox/spliced"} <= DURABLE_TYPES
    assert events.PERMISSIONS_ALLOWED == "permissions/allowed"
    assert events.PERMISSIONS_ALLOWED in DURABLE_TYPES - SURFACE_TYPES
    notifications = {
        events.SESSION_CREATED,
        events.SESSION_EVENT,
        events.AGENT_STATUS,
        events.INBOX_INSERTED,
        events.ASSISTANT_STREAM,
    }
    assert not notifications & DURABLE_TYPES
    assert events.TOOL_CALL not in SURFACE_TYPES


def test_events_and_their_data_are_not_tracked_by_the_garbage_collector():
    e = Event(
        "assistant/message",
        3,
        1.0,
        {"message": {"role": "assistant", "content": [{"type": "text", "text": "x"}]}},
        surface_op={"op": "replace", "start_seq": 1, "end_seq": 2},
        source_event_seqs=[1],
    )
    gc.collect()  # the collector untracks tuples whose items are untracked
    assert not gc.is_tracked(e)
    assert not gc.is_tracked(e.data)
    assert not gc.is_tracked(e.data["message"]["content"])
    assert not gc.is_tracked(e.surface_op)
    assert not gc.is_tracked(make_event("turn/start", 0, 0.0, FrozenDict(turn=1)))
    log = {0: e, 1: e.with_seq(4)}  # a dict of events stays untracked too
    assert not gc.is_tracked(log)


def test_events_construct_by_keyword_pickle_and_copy_by_value():
    e = Event(
        type="tool/result",
        seq=2,
        time=1.5,
        data={"a": [1, {"b": None}]},
        ignorable=True,
        surface_op="append",
        source_event_seqs=(1,),
    )
    assert e == Event("tool/result", 2, 1.5, {"a": [1, {"b": None}]}, True, "append", [1])
    back = pickle.loads(pickle.dumps(e))
    assert back == e
    assert type(back.data) is FrozenDict
    assert copy.copy(e) == e
    assert copy.deepcopy(e) == e
    assert repr(e).startswith("Event(type='tool/result', seq=2, time=1.5, data=FrozenDict(")
    assert isinstance(e, Event)
    assert EVENT_FIELDS == (
        "type",
        "seq",
        "time",
        "data",
        "ignorable",
        "surface_op",
        "source_event_seqs",
    )
    with pytest.raises(TypeError):
        Event("t", 0, 0.0)  # type: ignore[call-arg]  # data is required


def test_make_event_takes_surface_op_and_cites_before_ignorable():
    data = FrozenDict(x=1)
    e = make_event("tool/result", 1, 2.0, data, "append", (0,), True)
    assert (e.surface_op, e.source_event_seqs, e.ignorable) == ("append", (0,), True)
    assert e == Event("tool/result", 1, 2.0, data, True, "append", (0,))
