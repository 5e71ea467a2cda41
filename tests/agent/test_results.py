"""``_agent/results.py``: a ``TurnResult`` read back from a turn's events (sans-I/O)."""

from __future__ import annotations

from typing import Any

import pytest

from dsh_agent_loop import (
    FrozenDict,
    TurnAbortedError,
    TurnBlockedError,
    TurnFailedError,
    Usage,
)
from dsh_agent_loop._agent.results import build_result, turn_error
from dsh_agent_loop._frozen import freeze
from dsh_agent_loop.events import Event, make_event


def events(*items: tuple[str, dict[str, Any]]) -> list[Event]:
    return [make_event(t, seq, 0.0, freeze(data)) for seq, (t, data) in enumerate(items)]


def answer(*blocks: dict[str, Any], usage: dict[str, int] | None = None) -> tuple[str, dict]:
    data: dict[str, Any] = {
        "turn": 1,
        "step": 1,
        "message": {"role": "assistant", "content": blocks},
    }
    if usage is not None:
        data["usage"] = usage
    return ("assistant/message", data)


START = ("turn/start", {"turn": 1})
USER = ("user/message", {"message": {"role": "user", "id": "m-1", "content": ()}})


def end(**reason: Any) -> tuple[str, dict]:
    return ("turn/end", {"turn": 1, "reason": reason})


def test_text_and_reasoning_come_from_the_last_assistant_message_only():
    turn = events(
        START,
        USER,
        answer({"type": "text", "text": "first"}),
        answer(
            {"type": "reasoning", "text": "think "},
            {"type": "text", "text": "a"},
            {"type": "reasoning", "text": "more"},
            {"type": "text", "text": "b"},
        ),
        end(kind="completed"),
    )
    result = build_result(turn, message_id="m-1")
    assert result.text == "ab"
    assert result.reasoning == "think more"
    assert result.kind == "completed"
    assert len(result.messages) == 3


def test_usage_sums_known_counts_and_keeps_unknown_ones_none():
    turn = events(
        START,
        ("assistant/attempt", {"turn": 1, "step": 1, "stream": {"attempt": 1}}),
        answer(usage={"input_tokens": 5, "output_tokens": 1}),
        answer(usage={"input_tokens": 7, "output_tokens": 2, "cache_read_tokens": 3}),
        answer(),  # an interrupted anchor has no usage
        end(kind="completed"),
    )
    assert build_result(turn).usage == Usage(12, 3, 3, None, requests=4)


def test_a_turn_without_a_model_call_has_empty_text_and_zero_requests():
    result = build_result(events(START, end(kind="blocked")))
    assert (result.text, result.reasoning, result.usage.requests) == ("", "", 0)
    assert result.messages == ()


def test_tool_calls_pair_calls_with_results_in_call_order():
    def call(call_id: str, arguments: str) -> tuple[str, dict]:
        data = {"turn": 1, "step": 1, "call_id": call_id, "name": "t", "arguments": arguments}
        return ("tool/call", data)

    def result(call_id: str, text: str, code: str | None = None) -> tuple[str, dict]:
        message = {
            "role": "tool",
            "call_id": call_id,
            "name": "t",
            "content": ({"type": "tool-result", "call_id": call_id, "text": text},),
        }
        data: dict[str, Any] = {"turn": 1, "step": 1, "message": message}
        if code is not None:
            data["error"] = {"name": "E", "code": code}
        return ("tool/result", data)

    turn = events(
        START,
        call("b", '{"x": [1, 2]}'),
        call("a", "[1]"),
        call("c", ""),
        result("a", "Error: no", "INVALID_ARGUMENTS"),
        result("b", "ok"),
        end(kind="completed"),
    )
    records = build_result(turn).tool_calls
    assert [r.call_id for r in records] == ["b", "a", "c"]
    assert records[0].arguments == {"x": (1, 2)}
    assert isinstance(records[0].arguments, FrozenDict)
    assert (records[0].content, records[0].error) == ("ok", None)
    assert records[1].arguments == "[1]"  # not an object: kept raw
    assert (records[1].content, records[1].error) == ("Error: no", "INVALID_ARGUMENTS")
    assert records[2].arguments == {}
    assert records[2].content is None  # no result logged


@pytest.mark.parametrize(
    ("reason", "error_type", "code"),
    [
        (
            {"kind": "error", "error": {"code": "HTTP_5XX", "message": "bad"}},
            TurnFailedError,
            "HTTP_5XX",
        ),
        ({"kind": "blocked"}, TurnBlockedError, "TURN_BLOCKED"),
        (
            {"kind": "aborted", "cause": "hook", "message": "budget"},
            TurnAbortedError,
            "TURN_ABORTED",
        ),
    ],
)
def test_turn_error_maps_the_reason(reason, error_type, code):
    result = build_result(events(START, end(**reason)))
    error = turn_error(result)
    assert type(error) is error_type
    assert error.code == code
    assert error.result is result


@pytest.mark.parametrize("kind", ["completed", "max-tokens", "awaiting-approval"])
def test_turn_error_is_none_for_turns_that_ended_well(kind):
    assert turn_error(build_result(events(START, end(kind=kind)))) is None
