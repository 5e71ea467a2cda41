"""Generated slot constructors (``_slots``): they fill exactly the fields of their class."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from dsh_agent_loop import FrozenDict
from dsh_agent_loop._slots import slot_constructor
from dsh_agent_loop.events import EVENT_FIELDS, Event, make_event
from dsh_agent_loop.llm._base import (
    BlockStart,
    ModelRequest,
    Usage,
    make_request,
    make_tool_call_start,
    make_usage,
)

# (fast constructor, its arguments, the same instance built through the class). ``Event`` is a
# ``msgspec.Struct`` now (``make_event`` is one C call, not a generated slot constructor), and
# is checked here beside the slot constructors it used to be one of.
CASES: list[tuple[Any, tuple[Any, ...], Any]] = [
    (
        make_event,
        ("tool/result", 3, 1.5, FrozenDict(a=1), None, (2,), True),
        Event("tool/result", 3, 1.5, FrozenDict(a=1), True, None, (2,)),
    ),
    (
        make_event,
        ("turn/start", None, 0.0, FrozenDict()),
        Event("turn/start", None, 0.0, FrozenDict()),
    ),
    (
        make_request,
        (FrozenDict(model="m"), (FrozenDict(role="user"),), (FrozenDict(name="t"),)),
        ModelRequest(FrozenDict(model="m"), (FrozenDict(role="user"),), (FrozenDict(name="t"),)),
    ),
    (make_tool_call_start, (4, "c1", "add"), BlockStart(4, "tool-call", "c1", "add")),
    (make_usage, (10, 3), Usage(10, 3)),
]


@pytest.mark.parametrize(("make", "args", "expected"), CASES)
def test_generated_constructor_matches_the_class(make: Any, args: Any, expected: Any) -> None:
    built = make(*args)
    assert type(built) is type(expected)
    names = (
        EVENT_FIELDS if type(expected) is Event else [f.name for f in attrs.fields(type(expected))]
    )
    for name in names:  # every field is set, to the class's value
        assert getattr(built, name) == getattr(expected, name), name
    assert built == expected


@attrs.frozen(slots=True)
class _Record:
    a: int
    b: str = "x"
    c: tuple[int, ...] = attrs.field(factory=tuple)


def test_a_field_left_unset_is_refused() -> None:
    with pytest.raises(TypeError, match="would be left unset"):
        slot_constructor(_Record, ("a", "b"))  # c has a factory: no constant to write
    make = slot_constructor(_Record, ("a", "b"), fixed={"c": ()})
    assert make(1, "y") == _Record(1, "y", ())
    assert make(1) == _Record(1, "x", ())  # a trailing plain default is optional


def test_unknown_fields_and_unslotted_classes_are_refused() -> None:
    with pytest.raises(TypeError, match="no field"):
        slot_constructor(_Record, ("a", "nope"), fixed={"c": ()})

    @attrs.frozen(slots=False)
    class Loose:
        a: int

    with pytest.raises(TypeError, match="not a slotted"):
        slot_constructor(Loose)
