"""Whole agent turns against real HTTP: the openai and anthropic adapters talking to the loopback
server, tools running, and the next request built from the log (docs/design.md#turns-and-steps)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import trio

from dsh_agent_loop import AgentOptions, MemoryStore, ToolResult, open_runtime, tool

from .agent_helpers import (
    CLAUDE_KEY_ENV,
    KEY_ENV,
    LiveAgent,
    an_text,
    assert_well_formed,
    oai_text,
    of_type,
    plain,
    sse_events,
    turn_ends,
    types,
)
from .agent_helpers import live_agent as live
from .server import Reply, closing, collect, open_loopback_server, transcript


@pytest.fixture(autouse=True)
def _keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-agent-test")
    monkeypatch.setenv(CLAUDE_KEY_ENV, "sk-ant-agent-test")


SEED = ["session/end-seed", "agent/inbox/spliced"]
TURN_HEAD = ["turn/start", "agent/inbox/spliced", "step/start"]
FIRST_REQUEST = ["system/message", "user/message", "request/header", "request/context"]


# --- DeepSeek: reasoning, a tool call, in-history system prompt updates ---------------------


@tool
async def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


DS_REASONING = "The user wants the weather in Oslo. I should call the tool."
DS_CALL = {
    "type": "tool-call",
    "call_id": "call_00_kT3xQw9Lm",
    "name": "get_weather",
    "arguments": '{"city": "Oslo"}',
}


async def test_deepseek_reasoning_and_tool_call_turn() -> None:
    async with live("openai", model="deepseek-reasoner", tools=[get_weather]) as h:
        h.server.push(
            Reply.sse(transcript("deepseek_reasoner_tools"), piece=100),
            Reply(pieces=oai_text("It is", " sunny.", prompt=300, completion=4)),
            Reply(pieces=oai_text("I do not know.", prompt=320, completion=5)),
        )
        await h.run("Weather in Oslo?")
        events = h.events
        assert types(events) == [
            *SEED,
            *TURN_HEAD,
            *FIRST_REQUEST,
            "assistant/message",
            "tool/call",
            "tool/result",
            "step/end",
            "step/start",
            "assistant/message",
            "step/end",
            "turn/end",
        ]
        assert plain(of_type(events, "request/context")[0].data) == {
            "provider": "live",
            "model": "deepseek-reasoner",
            "context_window": 128_000,
            "system_prompt_update": "in-history",
        }
        first, second = of_type(events, "assistant/message")
        assert plain(first.data["message"]) == {
            "role": "assistant",
            "content": [
                {"type": "reasoning", "text": DS_REASONING},
                {"type": "text", "text": "Let me check Oslo."},
                DS_CALL,
            ],
        }
        assert plain(first.data["stream"]) == {
            "attempt": 1,
            "finish": "tool-calls",
            "stop_reason": "tool_calls",
        }
        assert plain(first.data["usage"]) == {
            "input_tokens": 236,
            "output_tokens": 61,
            "cache_read_tokens": 192,
            "reasoning_tokens": 38,
        }
        assert plain(second.data["message"]["content"]) == [
            {"type": "text", "text": "It is sunny."}
        ]
        assert plain(second.data["usage"]) == {"input_tokens": 300, "output_tokens": 4}
        (call,) = of_type(events, "tool/call")
        (result,) = of_type(events, "tool/result")
        assert result.source_event_seqs == (call.seq,)
        assert plain(result.data["message"]["content"]) == [
            {
                "type": "tool-result",
                "call_id": DS_CALL["call_id"],
                "name": "get_weather",
                "text": "sunny in Oslo",
                "is_error": False,
            }
        ]
        assert turn_ends(events) == [{"kind": "completed"}]

        # the wire: the second request carries the call and its result, never the reasoning
        first_body, second_body = h.bodies()
        assert first_body["messages"] == [{"role": "user", "content": "Weather in Oslo?"}]
        assert second_body["messages"] == [
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": "Let me check Oslo.",
                "tool_calls": [
                    {
                        "id": DS_CALL["call_id"],
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": DS_CALL["call_id"], "content": "sunny in Oslo"},
        ]
        assert "reasoning_content" not in json.dumps(second_body)
        assert second_body["tools"] == [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "The weather in a city.",
                    "parameters": plain(get_weather.parameters),
                },
            }
        ]
        assert all(r.headers["authorization"] == "Bearer sk-agent-test" for r in h.server.requests)

        # in-history: a changed prompt is appended where it changed, the head stays
        h.rt.settings.update_user_layer({"persona": "Answer in Norwegian."})
        await h.run("And tomorrow?")
        turn2 = h.turn(2)
        assert types(turn2) == [
            *TURN_HEAD,
            "system/message",
            "user/message",
            "assistant/message",
            "step/end",
            "turn/end",
        ]
        update = turn2[3]
        assert update.surface_op is None
        assert plain(update.data["message"]["content"]) == [
            {"type": "text", "text": "Answer in Norwegian."}
        ]
        third_body = h.bodies()[2]
        assert third_body["messages"][:3] == second_body["messages"]
        assert third_body["messages"][3:] == [
            {"role": "assistant", "content": "It is sunny."},
            {"role": "system", "content": "Answer in Norwegian."},
            {"role": "user", "content": "And tomorrow?"},
        ]
        assert turn_ends(h.events) == [{"kind": "completed"}, {"kind": "completed"}]
        assert_well_formed(h.events)


async def test_head_mode_replaces_the_head_instead() -> None:
    async with live("openai", model="gpt-4o", options={"persona": "Be brief."}) as h:
        h.server.push(Reply(pieces=oai_text("One.")), Reply(pieces=oai_text("Two.")))
        await h.run("first")
        context = of_type(h.events, "request/context")[0]
        assert "system_prompt_update" not in context.data
        h.rt.settings.update_user_layer({"persona": "Be kind."})
        await h.run("second")
        update = of_type(h.turn(2), "system/message")[0]
        head = of_type(h.events, "system/message")[0]
        assert plain(update.surface_op) == {
            "op": "replace",
            "start_seq": head.seq,
            "end_seq": head.seq,
        }
        assert update.source_event_seqs == (head.seq,)
        first_body, second_body = h.bodies()
        assert first_body["messages"][0] == {"role": "system", "content": "Be brief."}
        assert second_body["messages"] == [
            {"role": "system", "content": "Be kind.\n\nBe brief."},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "One."},
            {"role": "user", "content": "second"},
        ]
        assert_well_formed(h.events)


# --- OpenAI: two parallel tool calls --------------------------------------------------------


async def test_openai_parallel_tool_calls_commit_in_model_order() -> None:
    time_done = trio.Event()
    finished: list[str] = []

    @tool(name="get_weather")
    async def weather(city: str, unit: str) -> str:
        """Weather."""
        await time_done.wait()  # completes after get_time: results still commit in model order
        finished.append("get_weather")
        return f"18 {unit} in {city}"

    @tool
    async def get_time(tz: str) -> str:
        """Local time."""
        finished.append("get_time")
        time_done.set()
        return f"12:00 in {tz}"

    async with live("openai", model="gpt-4.1", tools=[weather, get_time]) as h:
        h.server.push(
            Reply.sse(transcript("openai_parallel_tools"), piece=64),
            Reply(pieces=oai_text("Sunny", " at noon.", prompt=200, completion=5)),
        )
        await h.run("Paris?")
        events = h.events
        assert finished == ["get_time", "get_weather"]
        assert types(events) == [
            *SEED,
            *TURN_HEAD,
            *FIRST_REQUEST,
            "assistant/message",
            "tool/call",
            "tool/call",
            "tool/result",
            "tool/result",
            "step/end",
            "step/start",
            "assistant/message",
            "step/end",
            "turn/end",
        ]
        message = of_type(events, "assistant/message")[0]
        assert plain(message.data["message"]["content"]) == [
            {
                "type": "tool-call",
                "call_id": "call_Wx3kP0aQ",
                "name": "get_weather",
                "arguments": '{"city":"Paris","unit":"c"}',
            },
            {
                "type": "tool-call",
                "call_id": "call_Yb7mN2cR",
                "name": "get_time",
                "arguments": '{"tz":"Europe/Paris"}',
            },
        ]
        assert plain(message.data["usage"]) == {
            "input_tokens": 112,
            "output_tokens": 46,
            "cache_read_tokens": 64,
            "reasoning_tokens": 0,
        }
        calls = of_type(events, "tool/call")
        results = of_type(events, "tool/result")
        assert [c.data["call_id"] for c in calls] == ["call_Wx3kP0aQ", "call_Yb7mN2cR"]
        assert [r.data["message"]["call_id"] for r in results] == [
            "call_Wx3kP0aQ",
            "call_Yb7mN2cR",
        ]
        assert [r.source_event_seqs for r in results] == [(calls[0].seq,), (calls[1].seq,)]
        final = of_type(events, "assistant/message")[1]
        assert plain(final.data["message"]["content"]) == [
            {"type": "text", "text": "Sunny at noon."}
        ]
        assert plain(final.data["usage"]) == {"input_tokens": 200, "output_tokens": 5}

        first_body, second_body = h.bodies()
        assert [t["function"]["name"] for t in first_body["tools"]] == ["get_weather", "get_time"]
        assert second_body["messages"] == [
            {"role": "user", "content": "Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_Wx3kP0aQ",
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": '{"city":"Paris","unit":"c"}',
                        },
                    },
                    {
                        "id": "call_Yb7mN2cR",
                        "type": "function",
                        "function": {"name": "get_time", "arguments": '{"tz":"Europe/Paris"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_Wx3kP0aQ", "content": "18 c in Paris"},
            {"role": "tool", "tool_call_id": "call_Yb7mN2cR", "content": "12:00 in Europe/Paris"},
        ]
        assert turn_ends(events) == [{"kind": "completed"}]
        assert h.server.connections == 1  # the pooled connection was reused
        assert_well_formed(events)


# --- Anthropic: thinking and two tool_use blocks --------------------------------------------

SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxDOJ1cwP0dVt3qpkoiMLHT5w=="


async def test_anthropic_thinking_and_two_tool_uses() -> None:
    @tool(name="get_weather")
    async def weather(city: str, unit: str = "c") -> ToolResult:
        """Weather."""
        if city == "New York":
            raise RuntimeError("station offline")
        return ToolResult(f"61 {unit} in {city}", additional_contexts=("Prefer Celsius.",))

    async with live("anthropic", tools=[weather], options={"reasoning_effort": "high"}) as h:
        h.server.push(
            Reply.sse(transcript("anthropic_thinking_tools"), piece=120),
            Reply(pieces=an_text("SF is mild;", " NY unknown.", input_tokens=700)),
        )
        await h.run("Weather in SF and NY?")
        events = h.events
        assert types(events) == [
            *SEED,
            *TURN_HEAD,
            *FIRST_REQUEST,
            "assistant/message",
            "tool/call",
            "tool/call",
            "tool/result",
            "agent/inbox/spliced",  # the first result's additional context, queued with it
            "tool/result",
            "step/end",
            "agent/inbox/spliced",  # ... and claimed by the next step
            "step/start",
            "user/message",
            "assistant/message",
            "step/end",
            "turn/end",
        ]
        header = of_type(events, "request/header")[0]
        assert plain(header.data["header"]["adapter_defaults"]) == {
            "thinking_budget": 16_384,
            "max_tokens": 16_384 + 8_192,
        }
        message = of_type(events, "assistant/message")[0]
        assert plain(message.data["message"]["content"]) == [
            {
                "type": "reasoning",
                "text": "I need the weather for both cities, so two tool calls.",
                "metadata": {"signature": SIGNATURE},
            },
            {"type": "text", "text": "Checking both cities."},
            {
                "type": "tool-call",
                "call_id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                "name": "get_weather",
                "arguments": '{"city": "San Francisco", "unit": "f"}',
            },
            {
                "type": "tool-call",
                "call_id": "toolu_01Vb8pQ2rL9wXyZaBcDeFgHi",
                "name": "get_weather",
                "arguments": '{"city": "New York"}',
            },
        ]
        assert plain(message.data["stream"]) == {
            "attempt": 1,
            "finish": "tool-calls",
            "stop_reason": "tool_use",
        }
        assert plain(message.data["usage"]) == {
            "input_tokens": 480 + 1024,
            "output_tokens": 172,
            "cache_read_tokens": 1024,
        }
        results = of_type(events, "tool/result")
        assert [plain(r.data.get("error")) for r in results] == [
            None,
            {"name": "RuntimeError", "code": "TOOL_ERROR"},
        ]
        final = of_type(events, "assistant/message")[1]
        assert plain(final.data["message"]["content"]) == [
            {"type": "text", "text": "SF is mild; NY unknown."}
        ]
        assert plain(final.data["usage"]) == {"input_tokens": 700, "output_tokens": 3}

        first_body, second_body = h.bodies()
        assert first_body["thinking"] == {"type": "enabled", "budget_tokens": 16_384}
        assert first_body["max_tokens"] == 16_384 + 8_192
        assert first_body["messages"] == [
            {"role": "user", "content": [{"type": "text", "text": "Weather in SF and NY?"}]}
        ]
        assert second_body["messages"][1] == {
            "role": "assistant",
            "content": [
                {
                    "type": "thinking",
                    "thinking": "I need the weather for both cities, so two tool calls.",
                    "signature": SIGNATURE,
                },
                {"type": "text", "text": "Checking both cities."},
                {
                    "type": "tool_use",
                    "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                    "name": "get_weather",
                    "input": {"city": "San Francisco", "unit": "f"},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_01Vb8pQ2rL9wXyZaBcDeFgHi",
                    "name": "get_weather",
                    "input": {"city": "New York"},
                },
            ],
        }
        merged = second_body["messages"][2]
        assert len(second_body["messages"]) == 3
        assert merged["role"] == "user"
        assert [b["type"] for b in merged["content"]] == ["tool_result", "tool_result", "text"]
        ok, failed, context = merged["content"]
        assert ok == {
            "type": "tool_result",
            "tool_use_id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
            "is_error": False,
            "content": "61 f in San Francisco",
        }
        assert failed["tool_use_id"] == "toolu_01Vb8pQ2rL9wXyZaBcDeFgHi"
        assert failed["is_error"] is True
        assert "station offline" in failed["content"]
        assert context == {"type": "text", "text": "Prefer Celsius."}
        for request in h.server.requests:
            assert request.target == "/v1/messages"
            assert request.headers["x-api-key"] == "sk-ant-agent-test"
            assert request.headers["anthropic-version"] == "2023-06-01"
        assert turn_ends(events) == [{"kind": "completed"}]
        assert_well_formed(events)


# --- a missing API key ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_missing_key_is_an_auth_attempt_failure_and_the_next_turn_runs(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = KEY_ENV if kind == "openai" else CLAUDE_KEY_ENV
    monkeypatch.delenv(env)
    good = oai_text("Hello.") if kind == "openai" else an_text("Hello.")
    offered: list[str] = []

    async def observe(payload: Any, next: Any) -> Any:
        offered.append(payload["failure"].code)
        return await next(payload)

    async with live(kind, default=Reply(pieces=good)) as h:
        h.rt.hooks.waterfall("agent/request-error", observe)
        await h.run("first")
        turn1 = h.turn(1)
        assert types(turn1) == [
            *TURN_HEAD,
            "assistant/attempt",
            "step/end",
            "user/message",  # the session shows what was asked
            "turn/end",
        ]
        attempt = turn1[3]
        assert attempt.data["failure"]["code"] == "AUTH"
        assert env in attempt.data["failure"]["message"]
        assert plain(attempt.data["stream"]) == {"attempt": 1}
        (end,) = turn_ends(h.events)
        assert end["kind"] == "error"
        assert end["error"]["code"] == "AUTH"
        assert env in end["error"]["message"]
        assert offered == ["AUTH"]  # offered once, not retried
        assert h.server.requests == []

        monkeypatch.setenv(env, "sk-now-set")
        await h.run("second")
        turn2 = h.turn(2)
        assert of_type(turn2, "assistant/attempt") == []
        (answer,) = of_type(turn2, "assistant/message")
        assert plain(answer.data["message"]["content"]) == [{"type": "text", "text": "Hello."}]
        assert turn_ends(h.events)[1] == {"kind": "completed"}
        (request,) = h.server.requests
        if kind == "openai":
            assert request.headers["authorization"] == "Bearer sk-now-set"
            assert request.json()["messages"] == [
                {"role": "user", "content": "first"},
                {"role": "user", "content": "second"},
            ]
        else:
            assert request.headers["x-api-key"] == "sk-now-set"
            assert request.json()["messages"] == [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "first"},
                        {"type": "text", "text": "second"},
                    ],
                }
            ]
        assert_well_formed(h.events)


# --- cancelling a turn while a real response streams ----------------------------------------


async def _cancel_when(h: LiveAgent, seen: Callable[[], bool]) -> None:
    """Cancel the agent once ``seen()`` is true (the stream is then blocked reading)."""
    with trio.fail_after(10):
        while not seen():
            await trio.sleep(0.005)
    await trio.sleep(0.05)
    h.agent.cancel(cause="user")
    with trio.fail_after(10):
        await h.agent.wait_idle()


async def test_cancel_mid_stream_keeps_the_delivered_text_and_closes_the_response() -> None:
    chunks: list[object] = []
    async with live("openai", default=Reply(pieces=oai_text("Fine."))) as h:
        h.rt.hooks.on(
            "agent/assistant-stream",
            lambda e: chunks.append(e.data["chunk"]) if e.data["frame"] == "chunk" else None,
        )
        h.server.push(Reply(pieces=oai_text("Hel", "lo", " wor", "ld."), hang_after=3))
        h.agent.followup("go")
        await _cancel_when(h, lambda: len(chunks) >= 4)  # block start + three text deltas
        turn1 = h.turn(1)
        assert types(turn1)[-4:] == ["request/context", "assistant/message", "step/end", "turn/end"]
        (anchor,) = of_type(turn1, "assistant/message")
        assert anchor.data["interrupted"] is True
        assert plain(anchor.data["message"]["content"]) == [{"type": "text", "text": "Hello wor"}]
        assert plain(anchor.data["stream"]) == {"attempt": 1, "finish": "aborted"}
        assert turn_ends(h.events) == [{"kind": "aborted", "cause": "user"}]
        with trio.fail_after(5):  # the adapter closed the response it was reading
            while h.server.hung_up == 0:
                await trio.sleep(0.01)

        await h.run("again")
        assert turn_ends(h.events)[1] == {"kind": "completed"}
        assert h.bodies()[1]["messages"] == [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "Hello wor"},  # what the user saw
            {"role": "user", "content": "again"},
        ]
        assert_well_formed(h.events)


async def test_cancel_before_the_response_head_leaves_an_attempt() -> None:
    async with live("openai", default=Reply(pieces=oai_text("Fine."))) as h:
        h.server.push(Reply(pieces=oai_text("Late."), delay=3.0))
        h.agent.followup("go")
        await _cancel_when(h, lambda: len(h.server.requests) == 1)
        turn1 = h.turn(1)
        assert types(turn1)[-4:] == ["request/context", "assistant/attempt", "step/end", "turn/end"]
        (attempt,) = of_type(turn1, "assistant/attempt")
        assert attempt.data["failure"]["code"] == "ABORTED"
        assert plain(attempt.data["stream"]) == {"attempt": 1}
        assert turn_ends(h.events) == [{"kind": "aborted", "cause": "user"}]
        await h.run("again")
        assert turn_ends(h.events)[1] == {"kind": "completed"}
        assert h.bodies()[1]["messages"] == [
            {"role": "user", "content": "go"},
            {"role": "user", "content": "again"},
        ]
        assert_well_formed(h.events)


async def test_cancel_between_tool_uses_settles_the_complete_call() -> None:
    @tool(name="get_weather")
    async def weather(city: str, unit: str = "c") -> str:
        """Weather."""
        raise AssertionError("never dispatched")

    chunks: list[object] = []
    events = sse_events(transcript("anthropic_thinking_tools"))
    async with live("anthropic", tools=[weather], default=Reply(pieces=an_text("Ok."))) as h:
        h.rt.hooks.on(
            "agent/assistant-stream",
            lambda e: chunks.append(e.data["chunk"]) if e.data["frame"] == "chunk" else None,
        )
        # thinking, text, one complete tool_use, then the second one's first argument piece
        h.server.push(Reply(pieces=events[:20], hang_after=20))
        h.agent.followup("go")
        await _cancel_when(h, lambda: any(getattr(c, "arguments", "") == '{"city"' for c in chunks))
        turn1 = h.turn(1)
        assert types(turn1)[-6:] == [
            "request/context",
            "assistant/message",
            "tool/call",
            "tool/result",
            "step/end",
            "turn/end",
        ]
        (anchor,) = of_type(turn1, "assistant/message")
        assert anchor.data["interrupted"] is True
        assert plain(anchor.data["message"]["content"]) == [
            {
                "type": "reasoning",
                "text": "I need the weather for both cities, so two tool calls.",
                "metadata": {"signature": SIGNATURE},
            },
            {"type": "text", "text": "Checking both cities."},
            {
                "type": "tool-call",
                "call_id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                "name": "get_weather",
                "arguments": '{"city": "San Francisco", "unit": "f"}',
            },
        ]  # the half-streamed second call is dropped
        (result,) = of_type(turn1, "tool/result")
        assert plain(result.data["error"]) == {
            "name": "AbortedBeforeDispatch",
            "code": "ABORTED_BEFORE_DISPATCH",
        }
        assert turn_ends(h.events) == [{"kind": "aborted", "cause": "user"}]

        await h.run("again")
        assert turn_ends(h.events)[1] == {"kind": "completed"}
        messages = h.bodies()[1]["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant", "user"]
        # the tool loop goes on (its results open the next user turn): the signed thinking stays
        assert [b["type"] for b in messages[1]["content"]] == ["thinking", "text", "tool_use"]
        assert messages[2]["content"] == [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                "is_error": True,
                "content": "Error: tool call aborted before dispatch",
            },
            {"type": "text", "text": "again"},
        ]
        assert "toolu_01Vb8pQ2rL9wXyZaBcDeFgHi" not in json.dumps(h.bodies())
        assert_well_formed(h.events)


# --- providers built from configuration, and closed with the runtime -------------------------


async def test_providers_from_config_run_turns_and_close_with_the_runtime() -> None:
    async with open_loopback_server() as server:
        config = {
            "providers": {
                "ds": {
                    "kind": "openai",
                    "base_url": server.url + "/",
                    "api_key_env": KEY_ENV,
                    "headers": {"x-trace": "t1"},
                    "stream_usage": False,
                    "models": {"deepseek-chat": {"max_tokens": 100}},
                },
                "claude": {
                    "kind": "anthropic",
                    "base_url": server.url,
                    "api_key_env": CLAUDE_KEY_ENV,
                },
            }
        }
        server.push(Reply(pieces=oai_text("From DeepSeek.")), Reply(pieces=an_text("From Claude.")))
        async with open_runtime(config, store=MemoryStore()) as rt:
            ds = await rt.agents.create(
                options=AgentOptions(id="ds", provider="ds", model="deepseek-chat")
            )
            claude = await rt.agents.create(
                options=AgentOptions(
                    id="claude", provider="claude", model="claude-3-5-haiku-20241022"
                )
            )
            for handle in (ds, claude):
                handle.agent.followup("hi")
                with trio.fail_after(10):
                    await handle.agent.wait_idle()
                assert turn_ends(handle.agent.session.events) == [{"kind": "completed"}]
                assert_well_formed(handle.agent.session.events)
            adapter = rt.router.get("ds")
            connections = server.connections
        ds_request, claude_request = server.requests
        assert ds_request.target == "/chat/completions"
        assert ds_request.headers["x-trace"] == "t1"
        assert ds_request.json()["max_tokens"] == 100
        assert "stream_options" not in ds_request.json()
        assert claude_request.target == "/v1/messages"
        assert claude_request.headers["x-api-key"] == "sk-ant-agent-test"
        # leaving the runtime closed the pooled client: using the adapter again reconnects
        server.push(Reply(pieces=oai_text("Again.")))
        async with closing(adapter):
            await collect(adapter, {"provider": "ds", "model": "deepseek-chat"})
        assert server.connections == connections + 1
