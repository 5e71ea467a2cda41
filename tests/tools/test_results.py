"""Checking what a tool hands back (``_tools/results.py``): valid results, escapes, errors."""

from __future__ import annotations

import enum
from typing import Any

import attrs
import pytest

from dsh_agent_loop import ToolResult
from dsh_agent_loop._frozen import FrozenDict
from dsh_agent_loop._tools.base import MAX_ECHO
from dsh_agent_loop._tools.results import (
    INVALID_RESULT,
    MAX_META_DEPTH,
    checked_result,
    escape_surrogates,
    exception_text,
    invalid_result,
)


class _Color(enum.IntEnum):
    RED = 1


class _Name(enum.StrEnum):
    A = "a"


def test_valid_results_pass_unchanged_and_json_subclasses_become_plain_values():
    result = ToolResult("plain", meta={"a": [1, 2]})
    checked, invalid = checked_result(result)
    assert invalid is None
    assert checked == ToolResult("plain", meta=FrozenDict(a=(1, 2)))  # meta frozen
    assert checked_result("ascii") == ("ascii", None)
    text = "naïve ☃"
    assert checked_result(text)[0] is text  # valid non-ASCII text is not copied
    kept = ToolResult("ok")
    assert checked_result(kept)[0] is kept  # nothing to change: the same object
    checked, invalid = checked_result(ToolResult("ok", meta={"c": _Color.RED, "t": (1,)}))
    assert invalid is None
    assert isinstance(checked, ToolResult)
    assert checked.meta == {"c": 1, "t": (1,)}
    assert checked.meta is not None
    assert type(checked.meta["c"]) is int


def test_escape_surrogates_keeps_valid_text_and_escapes_each_surrogate():
    assert escape_surrogates("abc") == "abc"
    assert escape_surrogates("é☃😀") == "é☃😀"
    assert escape_surrogates("\ud83d\ude00") == "\\ud83d\\ude00"  # a pair in a str is two
    assert escape_surrogates("x\ud800y") == "x\\ud800y"
    escaped = escape_surrogates("\udfff")
    assert escaped.encode("utf-8") == b"\\udfff"

    class Text(str):
        def __str__(self) -> str:
            raise AssertionError("never called")

    plain_text = escape_surrogates(Text("sub"))
    assert type(plain_text) is str
    assert plain_text == "sub"


def test_a_str_subclass_result_becomes_its_plain_value():
    value, invalid = checked_result(_Name.A)
    assert invalid is None
    assert type(value) is str
    assert value == "a"


def test_surrogates_are_escaped_in_every_text_field():
    value, invalid = checked_result(
        ToolResult(
            "c\ud800",
            error="E\udfff",
            additional_contexts=("x\ud801", "ok"),
            meta={"k\ud802": ["v\udc00", _Name.A, 1.5, None, True]},
        )
    )
    assert invalid is None
    assert value == ToolResult(
        "c\\ud800",
        error="E\\udfff",
        additional_contexts=("x\\ud801", "ok"),
        meta=FrozenDict({"k\\ud802": ("v\\udc00", "a", 1.5, None, True)}),
    )
    assert checked_result("s\ud800") == ("s\\ud800", None)


def _cycle() -> dict[str, Any]:
    meta: dict[str, Any] = {"a": [1]}
    meta["a"].append(meta)
    return meta


def _deep(levels: int) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for _ in range(levels):
        meta = {"d": meta}
    return meta


def _bypass(**fields: Any) -> ToolResult:
    """A ``ToolResult`` whose fields skip the converter (what a careless tool could build)."""
    result = ToolResult("ok")
    for name, value in fields.items():
        object.__setattr__(result, name, value)
    return result


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (b"bytes", "the tool returned bytes, not a str or a ToolResult"),
        (None, "the tool returned NoneType"),
        (42, "the tool returned int"),
        (_bypass(content=None), "content is NoneType, not a str"),
        (_bypass(error=3), "error is int, not a str"),
        (_bypass(concludes_turn=1), "concludes_turn is int, not a bool"),
        (_bypass(additional_contexts=["x"]), "additional_contexts is list, not a tuple of str"),
        (_bypass(additional_contexts=("x", 2)), "additional_contexts[1] is int, not a str"),
        (ToolResult("ok", meta=[1]), "meta is list, not a mapping"),
        (ToolResult("ok", meta={"s": {1}}), "meta['s'] holds a set, which is not JSON"),
        (ToolResult("ok", meta={"f": float("nan")}), "meta['f'] is nan, not a finite number"),
        (ToolResult("ok", meta={"f": [float("inf")]}), "meta['f'][0] is inf"),
        (ToolResult("ok", meta={1: "x"}), "meta has a int key, not a str"),
        (ToolResult("ok", meta={"a\ud800": 1, "a\\ud800": 2}), "meta has two keys that read"),
        (ToolResult("ok", meta=_cycle()), "contains itself (a cycle)"),
        (ToolResult("ok", meta=_deep(MAX_META_DEPTH)), "nested more than 100 levels deep"),
    ],
)
def test_invalid_values_become_a_tool_error_naming_the_problem(value, problem):
    result, invalid = checked_result(value)
    assert invalid == INVALID_RESULT == "InvalidToolResult"
    assert isinstance(result, ToolResult)
    assert result.error == "TOOL_ERROR"
    assert result.content.startswith("Error: InvalidToolResult: ")
    assert problem in result.content


def test_meta_just_inside_the_depth_limit_is_accepted():
    result, invalid = checked_result(ToolResult("ok", meta=_deep(MAX_META_DEPTH - 1)))
    assert invalid is None
    assert isinstance(result, ToolResult)


def test_a_meta_whose_reading_raises_is_a_tool_error():
    class Exploding(dict):
        def items(self):
            raise RuntimeError("no items")

    result, invalid = checked_result(ToolResult("ok", meta=Exploding(a=1)))
    assert invalid == INVALID_RESULT
    assert result.content == "Error: InvalidToolResult: reading it raised RuntimeError: no items"


def test_invalid_result_text_is_bounded_and_escaped():
    short = invalid_result("bad \ud800")
    assert short == ToolResult("Error: InvalidToolResult: bad \\ud800", error="TOOL_ERROR")
    long = invalid_result("x" * (MAX_ECHO * 2))
    assert len(long.content) == MAX_ECHO + 1
    assert long.content.endswith("…")


def test_exception_text_reads_type_and_message_even_when_str_fails():
    assert exception_text(ValueError("bad")) == "ValueError: bad"
    assert exception_text(KeyError("k")) == "KeyError: 'k'"
    assert exception_text(RuntimeError("a\ud800")) == "RuntimeError: a\\ud800"

    class Broken(Exception):
        def __str__(self) -> str:
            raise OSError("nope")

    assert exception_text(Broken()) == "Broken (its message could not be read: OSError)"

    class NotText(Exception):
        def __str__(self) -> Any:
            return 5

    assert exception_text(NotText()) == "NotText (its message could not be read: TypeError)"


def test_a_frozen_meta_comes_back_equal_and_an_escaped_content_is_a_changed_copy():
    with_meta = ToolResult("ok", meta=FrozenDict(a=(1, {"b": None})))
    checked, invalid = checked_result(with_meta)
    assert invalid is None
    assert checked == with_meta
    original = ToolResult("c\ud800", additional_contexts=("x",))
    escaped, _ = checked_result(original)
    assert attrs.asdict(escaped) == {**attrs.asdict(original), "content": "c\\ud800"}
    assert original.content == "c\ud800"  # the original is untouched
