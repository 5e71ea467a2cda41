"""``stores/_rows.py``: the stored JSON is exactly ``event_to_json``'s, decoding is exactly
``event_from_json``'s, hashes and turn ends."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_agent_loop._errors import StoreCorruptError, StoreError
from dsh_agent_loop._frozen import FrozenDict, freeze, shape
from dsh_agent_loop.events import Event, event_from_json, event_to_json, make_event
from dsh_agent_loop.stores._rows import (
    decode_event,
    decode_rows,
    escape_surrogates,
    event_json,
    event_sha256,
    last_turn_end,
    load_header,
    not_dense,
)

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


@pytest.mark.parametrize(
    "value",
    [
        1e16,
        9999999999999998.0,
        1e-4,
        9.999999999999999e-05,
        1e-05,
        -0.0,
        0.0,
        float("inf"),
        float("-inf"),
        float("nan"),
        2**70,
        "lone \ud800 surrogate",
        "\u2028\x00\x1f\x7f é",
        [1, {"a": 1.5}],  # not frozen (built without the converter): the json way
    ],
)
def test_event_json_spells_every_value_as_event_to_json(value: object) -> None:
    data = FrozenDict(v=value, nested=FrozenDict(items=(value, 1)))
    event = Event("tool/result", 3, 1796320063.4377122, {})
    event = make_event(event.type, event.seq, event.time, data)
    text = event_json(event)
    assert text == escape_surrogates(event_to_json(event))  # (the stored form of a surrogate)
    assert decode_event(text.encode()) == event_from_json(event_to_json(event))


@pytest.mark.parametrize("time", [1e16, 1e-05, 0.0, 12])
def test_event_json_spells_the_time_as_event_to_json(time: float) -> None:
    event = make_event("step/end", 1, time, FrozenDict(turn=1))
    assert event_json(event) == event_to_json(event)


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


def _same(a: object, b: object) -> bool:
    """Equal, and of the same types all the way down (``1 == 1.0`` and ``() == ()`` are not)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, FrozenDict):
        assert isinstance(b, FrozenDict)
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        assert isinstance(b, tuple)
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Event):
        return all(_same(getattr(a, f), getattr(b, f)) for f in a.__struct_fields__)
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


def _decodes_like_event_from_json(text: str | bytes) -> None:
    wanted: Event | ValueError
    try:
        wanted = event_from_json(text)
    except ValueError as exc:
        wanted = exc
    if isinstance(wanted, Event):
        assert _same(decode_event(text), wanted)
        return
    with pytest.raises(type(wanted)) as caught:
        decode_event(text)
    assert str(caught.value) == str(wanted)


@given(
    type_=st.sampled_from(["user/message", "tool/result", "x/ignorable"]),
    seq=st.integers(0, 2**70),
    time=st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**60), 2**60),
    data=st.dictionaries(st.text(), json_values, max_size=5),
    ignorable=st.booleans(),
    cites=st.none() | st.lists(st.integers(0, 100), max_size=3).map(tuple),
    surface_op=st.none() | st.just("append") | json_values,
)
def test_decode_event_is_event_from_json(
    type_: str,
    seq: int,
    time: float,
    data: dict[str, object],
    ignorable: bool,
    cites: tuple[int, ...] | None,
    surface_op: object,
) -> None:
    event = Event(
        type_,
        seq,
        time,
        data,
        ignorable=ignorable,
        surface_op=surface_op,
        source_event_seqs=cites,
    )
    text = event_json(event)
    _decodes_like_event_from_json(text)
    assert _same(decode_event(text), event_from_json(text))


@pytest.mark.parametrize(
    "text",
    [
        # what msgspec refuses and json takes: NaN, infinities, escaped lone surrogates
        '{"type":"t","seq":0,"time":NaN,"data":{"x":Infinity,"y":-Infinity}}',
        '{"type":"t","seq":0,"time":1e400,"data":{}}',
        '{"type":"t","seq":0,"time":0,"data":{"s":"\\ud800","pair":"\\udc00\\ud800"}}',
        '{"type":"t","seq":0,"time":0,"data":{"s":"\ud800"}}',  # a raw lone surrogate
        # not plain events: each decodes, or fails, as event_from_json has it
        '{"type":"t","seq":0,"time":0}',
        '{"type":5,"seq":0,"time":0,"data":{}}',
        '{"seq":0,"time":0,"data":{}}',
        '{"type":"t","seq":0,"time":"1.5","data":{}}',
        '{"type":"t","seq":0,"time":"soon","data":{}}',
        '{"type":"t","seq":0,"time":[],"data":{}}',
        '{"type":"t","seq":0,"time":0,"data":[1]}',
        '{"type":"t","seq":0,"time":0,"data":{},"source_event_seqs":3}',
        '{"type":"t","seq":0,"time":0,"data":{},"source_event_seqs":"ab"}',
        '{"type":"t","seq":"x","time":0,"data":{},"ignorable":1,"surface_op":"append"}',
        '{"type":"t","seq":0,"time":0,"data":{},"surface_op":{"op":"replace","end_seq":[2]}}',
        '{"type":"t","seq":0,"time":0,"data":{"a":1,"a":{"b":[]}}}',  # duplicate keys
        "[1, 2]",
        '"event"',
        '{"type":"t","seq":0,"time":0,"data":{}} trailing',
        '{"type":"t",',
        "",
    ],
)
def test_decode_event_edge_cases(text: str) -> None:
    _decodes_like_event_from_json(text)


@pytest.mark.parametrize(
    "line",
    [
        '{"type":"t","seq":0,"time":0,"data":{"s":"héllo ✓"}}'.encode(),
        '{"type":"t","seq":0,"time":0,"data":{"s":"héllo"}}'.encode("utf-16"),
        b'{"type":"t","seq":0,"time":0,"data":{"s":"\xff"}}',  # not UTF-8
        b'{"type":"t","seq":0,"time":0,"data":{"s":"\xed\xa0\x80"}}',  # an encoded surrogate
    ],
)
def test_decode_event_takes_bytes_as_event_from_json_does(line: bytes) -> None:
    _decodes_like_event_from_json(line)


def test_decoded_mappings_share_their_shapes() -> None:
    text = '{"type":"t","seq":0,"time":0,"data":{"message":{"role":"user","content":[{"a":1}]}}}'
    data = decode_event(text).data
    assert data._k is shape(("message",))
    assert data["message"]._k is shape(("role", "content"))
    assert type(data["message"]["content"]) is tuple


def test_plain_events_do_not_take_the_reference_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    text = event_json(Event("tool/result", 3, 2.5, {"r": [1, {"k": None}]}, source_event_seqs=[2]))
    wanted = event_from_json(text)

    def refuse(text: str) -> Event:
        raise AssertionError("took the slow path")

    monkeypatch.setattr("dsh_agent_loop.stores._rows.event_from_json", refuse)
    assert _same(decode_event(text), wanted)


@pytest.mark.parametrize(
    "text",
    [
        '{"session_id": "s", "options": {"model": "m", "tags": ["a", {"b": 1.5}]}}',
        '{"session_id": "s", "limit": NaN, "big": 123456789012345678901234567890}',
        '{"session_id": "lone \\ud800"}',
        '{"a": 1, "a": 2}',
    ],
)
def test_load_header_is_json_loads_frozen(text: str) -> None:
    assert load_header(text, "s") == freeze(json.loads(text))


@pytest.mark.parametrize("text", ["[1, 2]", '"s"', "{bad", ""])
def test_load_header_refuses_what_is_not_a_json_object(text: str) -> None:
    with pytest.raises(StoreError) as info:
        load_header(text, "s")
    assert info.value.code == "STORE_CORRUPT"


@pytest.mark.parametrize(
    ("seqs", "start", "says"),
    [
        ([0, 1, 3], 0, "seq 2 is missing (the next stored seq is 3)"),
        ([0, 1, 2, 1000], 0, "seq 3 is missing (the next stored seq is 1000)"),
        ([0, 1, 9, 3, 4], 0, "seq 9 is stored where seq 2 belongs"),  # the right one follows
        ([-1, 0, 1], 0, "seq -1 is stored where seq 0 belongs"),
        ([0, 1.5], 0, "seq 1.5 is stored where seq 1 belongs"),
        ([5, 7], 5, "seq 6 is missing (the next stored seq is 7)"),
        ([0, 1], 0, "seq 2 is missing (no stored event follows it)"),  # a count said more
    ],
)
def test_not_dense_names_the_session_and_the_first_seq_out_of_place(
    seqs: list[float], start: int, says: str
) -> None:
    error = not_dense("s1", seqs, start)
    assert isinstance(error, StoreCorruptError)
    assert error.code == "STORE_CORRUPT"
    assert str(error) == f"session 's1': the stored seqs are not dense: {says}"


def test_decode_rows_checks_that_the_events_count_up_from_the_offset() -> None:
    rows = [(event_to_json(make_event("user/message", seq, 0.0, {})),) for seq in (2, 3, 4)]
    assert [e.seq for e in decode_rows("s1", 2, rows)] == [2, 3, 4]
    assert decode_rows("s1", 0, []) == []
    with pytest.raises(StoreCorruptError, match="seq 3 is missing"):
        decode_rows("s1", 2, [rows[0], rows[2]])
    with pytest.raises(StoreCorruptError, match="seq 1 is missing"):
        decode_rows("s1", 1, rows)
    none = event_to_json(make_event("user/message", 0, 0.0, {})).replace('"seq":0', '"seq":null')
    with pytest.raises(StoreCorruptError, match="seq None is stored where seq 2 belongs"):
        decode_rows("s1", 2, [(none,)])
    with pytest.raises(StoreCorruptError, match="stored event does not decode") as info:
        decode_rows("s1", 2, [("not json",)])
    assert isinstance(info.value.__cause__, ValueError)
