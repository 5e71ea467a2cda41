"""The ``Tool`` record, the ``@tool`` decorator and argument parsing (``_tools/base.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import attrs
import pytest

from dsh_agent_loop import Tool, ToolContext, ToolResult, tool
from dsh_agent_loop._frozen import FrozenDict
from dsh_agent_loop._tools.base import (
    MAX_ECHO,
    ArgumentsError,
    InvalidToolResult,
    make_context,
    parse_arguments,
)

from ..llm.agent_helpers import plain

CONTEXT = make_context("a", "s", "c-1", None, 1, 2)


def test_tool_decorator_derives_name_description_and_schema():
    @tool(execution_mode="exclusive")
    async def set_note(text: str, count: int = 2) -> str:
        """Store a note.

        Longer description that is not used.
        """
        return text

    assert set_note.name == "set_note"
    assert set_note.description == "Store a note."
    assert set_note.execution_mode == "exclusive"
    assert plain(set_note.parameters) == {
        "type": "object",
        "properties": {"text": {"type": "string"}, "count": {"type": "integer", "default": 2}},
        "required": ["text"],
        "additionalProperties": False,
    }
    with pytest.raises(TypeError):

        @tool
        def not_async(x: int) -> str:  # pragma: no cover - rejected at decoration
            return ""

    with pytest.raises(ValueError, match="execution_mode"):
        Tool(name="t", description="", parameters={}, handler=None, execution_mode="sometimes")


def test_schema_from_richer_type_hints():
    @tool
    async def rich(
        a: Annotated[str, "what a is"],
        b: Literal["x", "y"],
        c: int | None,
        d: list[int],
        e: Sequence[str],
        f: dict[str, Any],
        g: Mapping[str, int],
        h: float = 0.5,
        i: bool = False,
        j: Any = None,
    ) -> str:
        return ""

    assert plain(rich.parameters["properties"]) == {
        "a": {"type": "string", "description": "what a is"},
        "b": {"enum": ["x", "y"]},
        "c": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "d": {"type": "array", "items": {"type": "integer"}},
        "e": {"type": "array", "items": {"type": "string"}},
        "f": {"type": "object"},
        "g": {"type": "object"},
        "h": {"type": "number", "default": 0.5},
        "i": {"type": "boolean", "default": False},
        "j": {"default": None},
    }
    assert list(rich.parameters["required"]) == ["a", "b", "c", "d", "e", "f", "g"]
    assert rich.description == ""


def test_a_function_with_no_required_parameter_has_no_required_list():
    @tool
    async def nothing() -> str:
        return ""

    assert plain(nothing.parameters) == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }


def test_underivable_hints_and_star_parameters_are_refused():
    with pytest.raises(TypeError, match="cannot derive a JSON schema"):

        @tool
        async def bad(x: bytes) -> str:  # pragma: no cover
            return ""

    with pytest.raises(TypeError, match=r"cannot take \*args or \*\*kwargs"):

        @tool
        async def star(*xs: int) -> str:  # pragma: no cover
            return ""


def test_explicit_name_description_and_parameters_win():
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}

    @tool(name="search", description="Find things.", parameters=schema)
    async def whatever(q: int) -> str:
        """Ignored."""
        return ""

    assert whatever.name == "search"
    assert whatever.description == "Find things."
    assert type(whatever.parameters) is FrozenDict
    assert plain(whatever.parameters) == schema
    assert plain(whatever.schema) == {
        "name": "search",
        "description": "Find things.",
        "parameters": schema,
    }
    assert whatever.schema is whatever.schema  # built once


async def test_the_handler_passes_context_and_encodes_non_string_returns():
    seen: list[ToolContext] = []

    @tool
    async def echo(x: int, ctx: ToolContext) -> Any:
        seen.append(ctx)
        return {"x": x, "text": "é"}

    assert "ctx" not in echo.parameters["properties"]
    assert await echo.handler({"x": 3}, CONTEXT) == '{"x": 3, "text": "é"}'
    assert seen == [CONTEXT]

    @tool
    async def result() -> ToolResult:
        return ToolResult("done", concludes_turn=True)

    assert await result.handler({}, CONTEXT) == ToolResult("done", concludes_turn=True)


@pytest.mark.parametrize("value", [b"bytes", {1, 2}, float("nan"), object()])
async def test_a_return_value_json_cannot_hold_is_an_invalid_tool_result(value):
    @tool
    async def odd() -> Any:
        return value

    with pytest.raises(InvalidToolResult, match="which is not JSON"):
        await odd.handler({}, CONTEXT)


def test_make_context_fills_every_field():
    ctx = make_context("agent", "sess", "call", "/tmp", 3, 4)
    assert ctx == ToolContext(
        agent_id="agent", session_id="sess", call_id="call", cwd="/tmp", turn=3, step=4
    )


def test_tool_result_defaults_and_additional_contexts_become_a_tuple():
    r = ToolResult("c", additional_contexts=["a", "b"])
    assert r.additional_contexts == ("a", "b")
    assert (r.error, r.concludes_turn, r.meta) == (None, False, None)


def _schema_tool() -> Tool:
    @tool
    async def t(n: int, s: str = "x") -> str:
        return ""

    return t


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("", {}),
        ("   ", {}),
        ('{"n": 1}', {"n": 1, "s": "x"}),  # schema defaults are filled in
        (' \n{"n": 1, "s": "y"} \t', {"n": 1, "s": "y"}),
    ],
)
def test_parse_arguments_accepts_valid_objects_and_empty_text(raw, expected):
    t = _schema_tool()
    if expected == {}:
        with pytest.raises(ArgumentsError):  # "n" is required
            parse_arguments(t, raw)
        free = Tool(name="f", description="", parameters={"type": "object"}, handler=None)
        assert parse_arguments(free, raw) == {}
    else:
        assert parse_arguments(t, raw) == expected


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"n": 1', "arguments are not valid JSON"),
        ('{"n": 1} extra', "arguments are not valid JSON \\(Extra data"),
        ("nope", "arguments are not valid JSON \\(Expecting value"),
        ("[1, 2]", "arguments must be a JSON object, got list"),
        ('"text"', "arguments must be a JSON object, got str"),
        ('{"n": "one"}', "must be integer"),
        ('{"n": 1, "other": 2}', "must not contain"),
        ('{"n": ' + "1" * 5000 + "}", "arguments are not valid JSON \\(Exceeds the limit"),
    ],
)
def test_parse_arguments_rejects_with_a_message_for_the_model(raw, message):
    with pytest.raises(ArgumentsError, match=message):
        parse_arguments(_schema_tool(), raw)


def test_bad_json_echo_is_bounded():
    raw = "x" * (MAX_ECHO * 3)
    with pytest.raises(ArgumentsError) as info:
        parse_arguments(_schema_tool(), raw)
    text = str(info.value)
    assert text.endswith("x" * MAX_ECHO + "…")
    assert len(text) < MAX_ECHO + 200


def test_deeply_nested_json_is_an_arguments_error_not_a_crash():
    raw = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ArgumentsError, match="not valid JSON"):
        parse_arguments(_schema_tool(), raw)


def test_a_tool_with_its_own_validator_never_compiles_its_schema(monkeypatch):
    import fastjsonschema

    def refuse(*args, **kwargs):
        raise AssertionError("an untrusted schema reached fastjsonschema")

    monkeypatch.setattr(fastjsonschema, "compile", refuse)
    seen = []

    def validator(arguments):
        seen.append(arguments)
        if arguments.get("n") != 1:
            raise ArgumentsError("n must be 1")

    async def handler(arguments, context):
        return "ok"

    remote = {"type": "object", "properties": {"n": {"$ref": "http://127.0.0.1:9/s.json"}}}
    t = Tool("t", "", remote, handler, validator=validator)
    assert parse_arguments(t, '{"n": 1}') == {"n": 1}
    with pytest.raises(ArgumentsError, match="n must be 1"):
        parse_arguments(t, '{"n": 2}')
    # a copy (a wrapped handler, as a test harness makes) keeps the check
    copy = attrs.evolve(t, handler=handler)
    with pytest.raises(ArgumentsError, match="n must be 1"):
        copy.validate({"n": 3})
    assert seen == [{"n": 1}, {"n": 2}, {"n": 3}]
