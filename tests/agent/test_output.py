"""``_agent/output.py``: structured output through a ``final_result`` tool
(docs/design.md#structured-output)."""

from __future__ import annotations

import dataclasses
import enum
from typing import Annotated, Any, Literal, NotRequired, TypedDict

import attrs
import pytest
import trio

from dsh_agent_loop import Reply, ToolResult, TurnFailedError, tool
from dsh_agent_loop._agent.output import (
    FINAL_RESULT,
    STEER_TEXT,
    OutputRegistry,
    output_schema,
)
from dsh_agent_loop.testing import actor_of

from .conftest import assert_well_formed, harness, plain, turn_ends, user_texts


@attrs.frozen
class City:
    """A city and its population."""

    name: str
    population: int = attrs.field(validator=attrs.validators.ge(0))
    tags: list[str] = attrs.Factory(list)


@dataclasses.dataclass
class Point:
    x: float
    y: float
    label: str | None = None


# The functional form: under ``from __future__ import annotations`` Python 3.11 cannot see a
# ``NotRequired`` written in a class body (the key would count as required).
Movie = TypedDict("Movie", {"title": str, "year": int, "rating": NotRequired[float]})  # noqa: UP013


class MovieClass(TypedDict):
    title: str
    rating: NotRequired[float]


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


async def ask(h: Any, output_type: Any, retries: int = 2, message: str = "go") -> Any:
    """Queue ``message`` as a structured-output turn, run it, and take its value."""
    agent = h.agent
    message_id = agent.inbox.new_id()
    expect(agent, message_id, output_type, retries)
    agent.send(message, wake=False, message_id=message_id)
    actor_of(agent).wake()
    await agent.wait_idle()
    return take(agent, actor_of(agent).log.state.turn)


def expect(agent: Any, message_id: str, output_type: Any, retries: int) -> None:
    """Register ``output_type`` for the pending ``message_id`` (what ``run`` does first)."""
    actor = actor_of(agent)
    if actor.outputs is None:
        actor.outputs = OutputRegistry()
    actor.outputs.expect(message_id, output_type, retries)


def take(agent: Any, turn: int) -> Any:
    """The value turn ``turn`` produced (forgotten now), or None (what ``run`` reads)."""
    outputs = actor_of(agent).outputs
    return None if outputs is None else outputs.take(turn)


def offered(request: Any, name: str = FINAL_RESULT) -> dict[str, Any] | None:
    """The plain schema of tool ``name`` in a model request, or None."""
    found = [plain(dict(t)) for t in request.tools if t["name"] == name]
    assert len(found) <= 1
    return found[0] if found else None


def tool_results(h: Any) -> list[dict[str, Any]]:
    return [plain(dict(e.data)) for e in h.of_type("tool/result")]


def tool_messages(request: Any) -> list[str]:
    """Texts of the tool results the model was shown."""
    return [b["text"] for m in request.messages if m["role"] == "tool" for b in m["content"]]


# --- through real turns -------------------------------------------------------------------------


async def test_attrs_class_one_invalid_call_then_a_valid_one(autojump_clock):
    replies = [
        Reply.tool_calls((FINAL_RESULT, {"name": "Oslo", "population": "many"})),
        Reply.tool_calls((FINAL_RESULT, {"name": "Oslo", "population": 709_000})),
    ]
    async with harness(replies) as h:
        value = await ask(h, City)
        assert value == City("Oslo", 709_000)
        assert turn_ends(h.events) == [{"kind": "completed"}]
        assert len(h.model.requests) == 2  # a valid call ends the turn: no third request
        first, second = tool_results(h)
        assert first["error"]["code"] == "INVALID_ARGUMENTS"
        assert "population" in first["message"]["content"][0]["text"]
        assert second.get("error") is None
        assert second["message"]["content"][0]["text"] == "ok"
        [shown] = tool_messages(h.model.requests[1])
        assert shown.startswith("Error: invalid arguments for final_result")
        assert len(h.of_type("tool/call")) == 2
        assert_well_formed(h.events)


async def test_a_value_the_type_refuses_is_invalid_arguments_with_its_reason(autojump_clock):
    replies = [  # the schema allows -5; City's validator does not
        Reply.tool_calls((FINAL_RESULT, {"name": "Nowhere", "population": -5})),
        Reply.tool_calls((FINAL_RESULT, {"name": "Bergen", "population": 291_000})),
    ]
    async with harness(replies) as h:
        assert await ask(h, City) == City("Bergen", 291_000)
        first = tool_results(h)[0]
        assert first["error"]["code"] == "INVALID_ARGUMENTS"
        assert "'population' must be >= 0: -5" in first["message"]["content"][0]["text"]
        assert_well_formed(h.events)


async def test_dataclass(autojump_clock):
    replies = [Reply.tool_calls((FINAL_RESULT, {"x": 1, "y": 2.5}))]
    async with harness(replies) as h:
        assert await ask(h, Point) == Point(1.0, 2.5)
        schema = offered(h.model.requests[0])
        assert schema is not None
        assert schema["parameters"]["required"] == ["x", "y"]


async def test_typed_dict(autojump_clock):
    replies = [Reply.tool_calls((FINAL_RESULT, {"title": "Heat", "year": 1995}))]
    async with harness(replies) as h:
        assert await ask(h, Movie) == {"title": "Heat", "year": 1995}
        schema = offered(h.model.requests[0])
        assert schema is not None
        assert schema["parameters"]["required"] == ["title", "year"]


@pytest.mark.parametrize(
    ("output_type", "result", "expected"),
    [
        (int, 42, 42),
        (list[str], ["a", "b"], ["a", "b"]),
        (dict[str, int], {"a": 1}, {"a": 1}),
        (City | None, None, None),
        (Color, "blue", Color.BLUE),
        (tuple[int, str], [1, "x"], (1, "x")),
    ],
)
async def test_other_types_are_wrapped_in_result(autojump_clock, output_type, result, expected):
    replies = [Reply.tool_calls((FINAL_RESULT, {"result": result}))]
    async with harness(replies) as h:
        assert await ask(h, output_type) == expected
        schema = offered(h.model.requests[0])
        assert schema is not None
        parameters = schema["parameters"]
        assert parameters["required"] == ["result"]
        assert (
            parameters["properties"]["result"]
            == output_schema(output_type)[0]["properties"]["result"]
        )
        assert turn_ends(h.events) == [{"kind": "completed"}]


async def test_a_wrapped_value_of_the_wrong_type_is_refused(autojump_clock):
    replies = [
        Reply.tool_calls((FINAL_RESULT, {"result": "forty-two"})),
        Reply.tool_calls((FINAL_RESULT, {"value": 42})),
        Reply.tool_calls((FINAL_RESULT, {"result": 42})),
    ]
    async with harness(replies) as h:
        assert await ask(h, int) == 42
        codes = [r.get("error", {}).get("code") for r in tool_results(h)]
        assert codes == ["INVALID_ARGUMENTS", "INVALID_ARGUMENTS", None]


async def test_plain_text_gets_one_steer_then_the_tool(autojump_clock):
    replies = [
        Reply.text("Oslo has about 709,000 people."),
        Reply.tool_calls((FINAL_RESULT, {"name": "Oslo", "population": 709_000})),
    ]
    async with harness(replies) as h:
        assert await ask(h, City, message="How big is Oslo?") == City("Oslo", 709_000)
        steers = [
            e.data["message"] for e in h.of_type("user/message") if e.data["message"].get("source")
        ]
        assert [(m["source"], m["content"][0]["text"]) for m in steers] == [
            ("structured-output", STEER_TEXT)
        ]
        assert user_texts(h.model.requests[1].messages) == ["How big is Oslo?", STEER_TEXT]
        assert turn_ends(h.events) == [{"kind": "completed"}]
        assert [e.data["step"] for e in h.of_type("step/end")] == [1, 2]
        assert_well_formed(h.events)


async def test_retries_used_up_fail_the_turn_no_structured_output(autojump_clock):
    replies = [
        Reply.tool_calls((FINAL_RESULT, {"name": 1})),
        Reply.text("no"),
        Reply.text("still no"),
        Reply.text("never asked"),
    ]
    async with harness(replies) as h:
        assert await ask(h, City, retries=2) is None
        [end] = turn_ends(h.events)
        assert end["kind"] == "error"
        assert end["error"]["code"] == "NO_STRUCTURED_OUTPUT"
        assert "3 tries" in end["error"]["message"]
        assert len(h.model.requests) == 3  # the first try and two retries
        steers = [e for e in h.of_type("user/message") if e.data["message"].get("source")]
        assert len(steers) == 1  # the last plain answer fails the turn: no steer left pending
        assert h.agent.inbox.next_step == ()
        assert_well_formed(h.events)


async def test_zero_retries_fail_at_the_first_plain_answer(autojump_clock):
    async with harness([Reply.text("a"), Reply.text("b")]) as h:
        await ask(h, int, retries=0)
        [end] = turn_ends(h.events)
        assert end["error"]["code"] == "NO_STRUCTURED_OUTPUT"
        assert len(h.model.requests) == 1


async def test_other_tool_calls_are_work_not_tries(autojump_clock):
    @tool
    async def lookup(city: str) -> str:
        return f"{city}: 709000"

    replies = [
        Reply.tool_calls(("lookup", {"city": "Oslo"})),
        Reply.tool_calls(("lookup", {"city": "Oslo"})),
        Reply.tool_calls((FINAL_RESULT, {"name": "Oslo", "population": 709_000})),
    ]
    async with harness(replies, tools=[lookup]) as h:
        assert await ask(h, City, retries=0) == City("Oslo", 709_000)
        assert turn_ends(h.events) == [{"kind": "completed"}]
        assert len(h.model.requests) == 3
        names = [t["name"] for t in h.model.requests[0].tools]
        assert names == ["lookup", FINAL_RESULT]


async def test_the_request_offers_final_result_with_the_schema(autojump_clock):
    replies = [Reply.tool_calls((FINAL_RESULT, {"name": "Oslo", "population": 1}))]
    async with harness(replies) as h:
        await ask(h, City)
        schema = offered(h.model.requests[0])
        assert schema is not None
        assert "A city and its population." in schema["description"]
        assert schema["parameters"] == {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "population": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["name", "population"],
            "additionalProperties": False,
            "description": "A city and its population.",
        }


async def test_turns_without_output_type_offer_no_final_result(autojump_clock):
    replies = [
        Reply.text("plain"),
        Reply.tool_calls((FINAL_RESULT, {"result": 3})),
        Reply.text("plain again"),
    ]
    async with harness(replies) as h:
        await h.run("first")
        assert await ask(h, int) == 3
        await h.run("third")
        first, second, third = h.model.requests
        assert offered(first) is None
        assert offered(second) is not None
        assert offered(third) is None
        assert turn_ends(h.events) == [{"kind": "completed"}] * 3
        assert actor_of(h.agent).outputs.specs == {}
        assert actor_of(h.agent).outputs.values == {}  # taken
        assert_well_formed(h.events)


async def test_final_result_replaces_a_tool_of_that_name_in_structured_turns(autojump_clock):
    @tool
    async def final_result(text: str) -> str:
        return "the user's own"

    replies = [Reply.tool_calls((FINAL_RESULT, {"result": True}))]
    async with harness(replies, tools=[final_result]) as h:
        assert await ask(h, bool) is True
        [request] = h.model.requests
        assert [t["name"] for t in request.tools] == [FINAL_RESULT]
        assert offered(request)["parameters"]["required"] == ["result"]  # type: ignore[index]


async def test_a_registration_whose_message_was_removed_is_forgotten(autojump_clock):
    async with harness([Reply.text("a")]) as h:
        agent = h.agent
        expect(agent, "gone", int, 2)
        agent.send("never runs", wake=False, message_id="gone")
        assert agent.inbox.remove("gone")
        await h.run("plain")
        assert actor_of(agent).outputs.specs == {}
        assert offered(h.model.requests[0]) is None
        assert turn_ends(h.events) == [{"kind": "completed"}]


async def test_take_output_without_registrations_is_none(autojump_clock):
    async with harness([Reply.text("a")]) as h:
        await h.run()
        assert actor_of(h.agent).outputs is None  # nothing registered: nothing made
        assert take(h.agent, 1) is None


# --- registrations and schemas (no turns) -------------------------------------------------------


@attrs.frozen
class Node:
    value: int
    children: list[Node]


@attrs.frozen
class A:
    v: int


@attrs.frozen
class B:
    v: int


@pytest.mark.parametrize("bad", [Node, dict[int, str], object, A | B, bytes])
def test_unsupported_types_are_refused_at_registration(bad):
    registry = OutputRegistry()
    with pytest.raises(TypeError):
        registry.expect("m-1", bad, 2)
    assert registry.specs == {}


def test_negative_retries_are_refused():
    with pytest.raises(ValueError, match="output_retries"):
        OutputRegistry().expect("m-1", int, -1)


def test_one_tool_per_type_per_registry():
    registry = OutputRegistry()
    registry.expect("m-1", City, 2)
    registry.expect("m-2", City, 1)
    assert registry.specs["m-1"].tool is registry.specs["m-2"].tool
    assert registry.specs["m-2"].retries == 1


def test_schema_of_nested_optional_literal_and_annotated_fields():
    @attrs.frozen
    class Report:
        city: City
        kind: Literal["a", "b"]
        note: Annotated[str, "a short note"]
        score: float | None = None
        color: Color = Color.RED

    schema, wrapped = output_schema(Report)
    assert not wrapped
    properties = schema["properties"]
    assert properties["city"]["required"] == ["name", "population"]
    assert properties["kind"] == {"enum": ["a", "b"]}
    assert properties["note"] == {"type": "string", "description": "a short note"}
    assert properties["score"] == {"anyOf": [{"type": "number"}, {"type": "null"}]}
    assert properties["color"] == {"enum": ["red", "blue"]}
    assert schema["required"] == ["city", "kind", "note"]


def test_typed_dict_and_dataclass_schemas():
    movie, _ = output_schema(Movie)
    assert movie["properties"]["rating"] == {"type": "number"}
    assert movie["required"] == ["title", "year"]
    point, _ = output_schema(Point)
    assert "description" not in point  # a dataclass's generated signature is no description
    assert point["properties"]["label"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}


async def test_a_tool_result_concludes_nothing_it_does_not_say(autojump_clock):
    # Guard: an ordinary tool returning a plain ToolResult does not end a structured turn.
    @tool
    async def note(text: str) -> ToolResult:
        return ToolResult("noted")

    replies = [
        Reply.tool_calls(("note", {"text": "x"})),
        Reply.tool_calls((FINAL_RESULT, {"result": "done"})),
    ]
    async with harness(replies, tools=[note]) as h:
        assert await ask(h, str, retries=0) == "done"
        assert len(h.model.requests) == 2


def test_a_typed_dict_whose_not_required_key_python_cannot_see_is_refused():
    if "rating" in MovieClass.__required_keys__:  # Python 3.11 under future annotations
        with pytest.raises(TypeError, match="functional form"):
            OutputRegistry().expect("m-1", MovieClass, 2)
    else:
        OutputRegistry().expect("m-1", MovieClass, 2)
        assert output_schema(MovieClass)[0]["required"] == ["title"]


async def test_a_valid_call_ends_the_turn_even_with_next_step_work_pending(autojump_clock):
    @tool
    async def note(text: str) -> ToolResult:
        return ToolResult("noted", additional_contexts=("read this next",))

    replies = [
        Reply.tool_calls(("note", {"text": "x"}), (FINAL_RESULT, {"result": 7})),
        Reply.text("the next turn"),
    ]
    async with harness(replies, tools=[note]) as h:
        expect(h.agent, "q", int, 2)
        h.agent.send("go", wake=False, message_id="q")
        actor_of(h.agent).wake()
        await h.agent.wait_idle()
        assert take(h.agent, 1) == 7
        assert turn_ends(h.events) == [{"kind": "completed"}] * 2
        turn_of_first_answer = [e.data["turn"] for e in h.of_type("step/end")]
        assert turn_of_first_answer == [1, 2]  # turn 1 made one request; the context waited
        assert user_texts(h.model.requests[1].messages)[-1] == "read this next"
        assert offered(h.model.requests[1]) is None
        assert_well_formed(h.events)


# --- through ``Agent.run`` ----------------------------------------------------------------------


async def test_run_returns_the_structured_output(autojump_clock):
    replies = [
        Reply.tool_calls((FINAL_RESULT, {"name": "Oslo", "population": "many"})),
        Reply.tool_calls((FINAL_RESULT, {"name": "Oslo", "population": 709_000})),
    ]
    async with harness(replies) as h:
        result = await h.agent.run("How big is Oslo?", output_type=City)
        assert result.output == City("Oslo", 709_000)
        assert result.reason == {"kind": "completed"}
        codes = [call.error for call in result.tool_calls]
        assert codes == ["INVALID_ARGUMENTS", None]
        assert actor_of(h.agent).outputs.values == {}  # run() took it


async def test_run_without_output_type_has_no_output(autojump_clock):
    async with harness([Reply.text("hi")]) as h:
        result = await h.agent.run("hello")
        assert result.output is None
        assert offered(h.model.requests[0]) is None


async def test_run_raises_no_structured_output(autojump_clock):
    async with harness([Reply.text("a"), Reply.text("b")]) as h:
        with pytest.raises(TurnFailedError) as caught:
            await h.agent.run("go", output_type=list[str], output_retries=1)
        assert caught.value.code == "NO_STRUCTURED_OUTPUT"
        assert len(h.model.requests) == 2


async def test_concurrent_runs_each_get_their_own_output(autojump_clock):
    def answer(request: Any) -> Reply:
        schema = offered(request)
        assert schema is not None
        kind = schema["parameters"]["properties"]["result"]["type"]
        return Reply.tool_calls((FINAL_RESULT, {"result": 1 if kind == "integer" else ["x"]}))

    async with harness([answer, answer]) as h:
        got: dict[str, Any] = {}

        async def one(key: str, output_type: Any) -> None:
            got[key] = (await h.agent.run(key, output_type=output_type)).output

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "int", int)
            nursery.start_soon(one, "list", list[str])
        assert got == {"int": 1, "list": ["x"]}
        assert turn_ends(h.events) == [{"kind": "completed"}] * 2


async def test_run_with_a_type_without_a_schema_queues_nothing(autojump_clock):
    async with harness([Reply.text("never")]) as h:
        with pytest.raises(TypeError):
            await h.agent.run("go", output_type=bytes)
        await trio.sleep(1)
        assert len(h.agent.inbox) == 0
        assert h.model.requests == []
        assert "agent/inbox/spliced" not in h.types()
