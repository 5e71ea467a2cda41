"""The anthropic adapter against a loopback server replaying recorded transcripts."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_agent_loop import AgentOptions, MemoryStore, open_runtime
from dsh_agent_loop._compose import adapter_from_config
from dsh_agent_loop._frozen import FrozenDict, freeze
from dsh_agent_loop.config import AnthropicProviderConfig, load_config
from dsh_agent_loop.llm._anthropic import (
    AnthropicAdapter,
    AnthropicStreamDecoder,
    anthropic_messages,
)
from dsh_agent_loop.llm._base import (
    BlockEnd,
    BlockStart,
    Finish,
    ModelError,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)
from dsh_agent_loop.llm._sse import SSEParser

from .server import (
    LoopbackServer,
    Reply,
    assemble,
    closing,
    collect,
    open_loopback_server,
    transcript,
)

SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxDOJ1cwP0dVt3qpkoiMLHT5w=="


@pytest.fixture
async def server() -> AsyncIterator[LoopbackServer]:
    async with open_loopback_server() as srv:
        yield srv


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")


def cfg(model: str = "claude-sonnet-4-20250514", **extra: object) -> dict[str, object]:
    return {"provider": "claude", "model": model, **extra}


def adapter_for(server: LoopbackServer, **kwargs: object) -> AnthropicAdapter:
    return AnthropicAdapter("claude", base_url=server.url + "/", **kwargs)  # type: ignore[arg-type]


async def test_thinking_text_and_two_tool_uses(server: LoopbackServer) -> None:
    server.push(Reply.sse(transcript("anthropic_thinking_tools"), piece=64))
    async with closing(adapter_for(server)) as adapter:
        chunks = await collect(adapter, cfg(reasoning_effort="medium"))
    assert chunks == [
        BlockStart(0, "reasoning"),
        ReasoningDelta(0, "I need the weather"),
        ReasoningDelta(0, " for both cities,"),
        ReasoningDelta(0, " so two tool calls."),
        BlockEnd(0, {"signature": SIGNATURE}),
        BlockStart(1, "text"),
        TextDelta(1, "Checking "),
        TextDelta(1, "both cities."),
        BlockEnd(1),
        BlockStart(2, "tool-call", "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "get_weather"),
        ToolCallDelta(2, '{"city": "'),
        ToolCallDelta(2, "San Francisco"),
        ToolCallDelta(2, '", "unit": "f"}'),
        BlockEnd(2),
        BlockStart(3, "tool-call", "toolu_01Vb8pQ2rL9wXyZaBcDeFgHi", "get_weather"),
        ToolCallDelta(3, '{"city"'),
        ToolCallDelta(3, ': "New York"}'),
        BlockEnd(3),
        UsageChunk(Usage(input_tokens=1504, output_tokens=172, cache_read_tokens=1024)),
        Finish("tool-calls", stop_reason="tool_use"),
    ]
    content = assemble(chunks)
    assert content[0] == FrozenDict(
        type="reasoning",
        text="I need the weather for both cities, so two tool calls.",
        metadata=FrozenDict(signature=SIGNATURE),
    )
    assert [b["type"] for b in content] == ["reasoning", "text", "tool-call", "tool-call"]
    request = server.requests[0]
    assert request.target == "/v1/messages"
    assert request.headers["x-api-key"] == "sk-ant-test"
    assert request.headers["anthropic-version"] == "2023-06-01"
    body = request.json()
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    assert body["max_tokens"] == 4096 + 8192


async def test_plain_text_end_turn(server: LoopbackServer) -> None:
    server.push(Reply.sse(transcript("anthropic_text"), piece=1))
    async with closing(adapter_for(server)) as adapter:
        chunks = await collect(adapter, cfg("claude-3-5-haiku-20241022"))
    assert chunks == [
        BlockStart(0, "text"),
        TextDelta(0, "Hello"),
        TextDelta(0, "! How can I"),
        TextDelta(0, " help?"),
        BlockEnd(0),
        UsageChunk(Usage(input_tokens=25, output_tokens=12)),
        Finish("stop", stop_reason="end_turn"),
    ]
    body = server.requests[0].json()
    assert "thinking" not in body
    assert body["max_tokens"] == 8192


async def test_redacted_thinking_and_max_tokens_inside_tool_use(server: LoopbackServer) -> None:
    server.push(Reply.sse(transcript("anthropic_redacted_max_tokens")))
    async with closing(adapter_for(server)) as adapter:
        chunks = await collect(adapter, cfg("claude-3-7-sonnet-20250219"))
    redacted = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"
    assert chunks == [
        BlockStart(0, "reasoning"),
        BlockEnd(0, {"redacted": redacted}),
        BlockStart(1, "tool-call", "toolu_01Zz", "write_file"),
        ToolCallDelta(1, '{"path": "notes.md", '),
        ToolCallDelta(1, '"text": "# Notes\\n\\nThe first'),
        UsageChunk(Usage(input_tokens=350, output_tokens=64, cache_read_tokens=0)),
        Finish("max-tokens", stop_reason="max_tokens"),
    ]
    assert assemble(chunks) == (
        FrozenDict(type="reasoning", text="", metadata=FrozenDict(redacted=redacted)),
    )


def _tool_result(call_id: str, text: str, *, is_error: bool = False) -> object:
    return {
        "role": "tool",
        "call_id": call_id,
        "name": "w",
        "content": [
            {
                "type": "tool-result",
                "call_id": call_id,
                "name": "w",
                "text": text,
                "is_error": is_error,
            }
        ],
    }


def _user(text: str, **extra: object) -> object:
    return {"role": "user", "id": "m", "content": [{"type": "text", "text": text}], **extra}


def test_request_messages_merge_tool_results_and_keep_loop_thinking() -> None:
    thinking_old = {"type": "reasoning", "text": "old", "metadata": {"signature": "s-old"}}
    thinking_new = {"type": "reasoning", "text": "new", "metadata": {"signature": "s-new"}}
    unsigned = {"type": "reasoning", "text": "from another provider"}
    redacted = {"type": "reasoning", "text": "", "metadata": {"redacted": "opaque"}}
    messages = freeze(
        [
            {"role": "system", "content": [{"type": "text", "text": "first"}]},
            _user("q1"),
            {"role": "assistant", "content": [thinking_old, {"type": "text", "text": "a1"}]},
            {"role": "system", "content": [{"type": "text", "text": "second"}]},
            {"role": "system", "content": []},
            _user("q2"),
            {
                "role": "assistant",
                "content": [
                    thinking_new,
                    redacted,
                    unsigned,
                    {"type": "tool-call", "call_id": "t1", "name": "w", "arguments": '{"x": 1}'},
                    {"type": "tool-call", "call_id": "t2", "name": "w", "arguments": "{}"},
                ],
            },
            _tool_result("t1", "ok"),
            _tool_result("t2", "boom", is_error=True),
            _user("cwd: /tmp", source="runtime-context"),
            _user("also this"),
        ]
    )
    system, wire = anthropic_messages(messages)
    assert system == "second"
    assert wire == [
        {"role": "user", "content": [{"type": "text", "text": "q1"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "a1"}]},
        {"role": "user", "content": [{"type": "text", "text": "q2"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "new", "signature": "s-new"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "tool_use", "id": "t1", "name": "w", "input": {"x": 1}},
                {"type": "tool_use", "id": "t2", "name": "w", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "is_error": False, "content": "ok"},
                {"type": "tool_result", "tool_use_id": "t2", "is_error": True, "content": "boom"},
                {"type": "text", "text": "cwd: /tmp"},
                {"type": "text", "text": "also this"},
            ],
        },
    ]


def test_empty_assistant_turn_is_dropped_and_users_merge() -> None:
    messages = freeze([_user("a"), {"role": "assistant", "content": []}, _user("b")])
    assert anthropic_messages(messages) == (
        "",
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ],
    )


async def test_request_body_tools_and_system(server: LoopbackServer) -> None:
    server.push(Reply.sse(transcript("anthropic_text")))
    messages = freeze(
        [{"role": "system", "content": [{"type": "text", "text": "Be kind."}]}, _user("hi")]
    )
    tools = (
        freeze(
            {"name": "w", "description": "d", "parameters": {"type": "object", "properties": {}}}
        ),
    )
    async with closing(adapter_for(server)) as adapter:
        await collect(adapter, cfg("claude-3-5-haiku-latest", max_tokens=300), messages, tools)
    assert server.requests[0].json() == {
        "model": "claude-3-5-haiku-latest",
        "max_tokens": 300,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "stream": True,
        "system": "Be kind.",
        "tools": [
            {"name": "w", "description": "d", "input_schema": {"type": "object", "properties": {}}}
        ],
    }


@pytest.mark.parametrize(
    ("extra", "defaults"),
    [
        ({"reasoning_effort": "low"}, {"thinking_budget": 1024, "max_tokens": 1024 + 8192}),
        ({"reasoning_effort": "medium"}, {"thinking_budget": 4096, "max_tokens": 4096 + 8192}),
        ({"reasoning_effort": "high"}, {"thinking_budget": 16384, "max_tokens": 16384 + 8192}),
        ({"reasoning_effort": "high", "max_tokens": 10000}, {"thinking_budget": 9999}),
        ({"reasoning_effort": "medium", "max_tokens": 1000}, {}),
        ({"reasoning_effort": "none"}, {"max_tokens": 8192}),
        ({}, {"max_tokens": 8192}),
        ({"max_tokens": 77}, {}),
        ({"thinking_budget": 2000}, {"max_tokens": 2000 + 8192}),
    ],
)
async def test_effort_maps_to_thinking_budget(
    extra: dict[str, object], defaults: dict[str, object]
) -> None:
    adapter = AnthropicAdapter("claude")
    prepared = await adapter.prepare_call(cfg(**extra))
    assert prepared.adapter_defaults == defaults
    assert prepared.config == {**cfg(**extra), **defaults}
    assert prepared.system_prompt_update is None
    assert prepared.context_window == 200_000


async def test_model_without_thinking_ignores_effort() -> None:
    prepared = await AnthropicAdapter("claude").prepare_call(
        cfg("claude-3-5-sonnet-latest", reasoning_effort="high")
    )
    assert prepared.adapter_defaults == {"max_tokens": 8192}


async def test_unknown_effort_is_an_invalid_option() -> None:
    with pytest.raises(ModelError) as info:
        await AnthropicAdapter("claude").prepare_call(cfg(reasoning_effort="extreme"))
    assert info.value.failure.code == "INVALID_OPTION"


async def test_missing_key_names_the_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with pytest.raises(ModelError) as info:
        await AnthropicAdapter("claude").prepare_call(cfg())
    assert info.value.failure.code == "AUTH"
    assert "ANTHROPIC_API_KEY" in info.value.failure.message


async def test_overrides_from_config(server: LoopbackServer) -> None:
    server.push(Reply.sse(transcript("anthropic_text")))
    section = {
        "kind": "anthropic",
        "base_url": server.url,
        "api_key_env": None,
        "headers": {"anthropic-beta": "x"},
        "models": {
            "my-claude": {"context_window": 1000, "max_tokens": 500, "reasoning_effort": "low"}
        },
    }
    record = load_config({"providers": {"claude": section}}).providers["claude"]
    assert isinstance(record, AnthropicProviderConfig)
    adapter = adapter_from_config("claude", record)
    assert isinstance(adapter, AnthropicAdapter)
    async with closing(adapter):
        prepared = await adapter.prepare_call(cfg("my-claude"))
        assert prepared.context_window == 1000
        # The per-model cap is below the smallest budget: no thinking, the cap is the default.
        assert prepared.adapter_defaults == {"reasoning_effort": "low", "max_tokens": 500}
        await collect(adapter, cfg("my-claude"))
    assert "x-api-key" not in server.requests[0].headers
    assert server.requests[0].headers["anthropic-beta"] == "x"


@pytest.mark.parametrize(
    "key", [{"api_key_env": None}, {"api_key_env": ""}, {}], ids=["null", "empty", "absent"]
)
async def test_config_without_a_key_env_sends_no_key(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch, key: dict[str, object]
) -> None:
    # A keyless proxy: the turn runs with no key anywhere and no x-api-key header is sent.
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    server.push(Reply.sse(transcript("anthropic_text")))
    config = {"providers": {"proxy": {"kind": "anthropic", "base_url": server.url, **key}}}
    async with open_runtime(config, store=MemoryStore(), seed=0) as rt:
        handle = await rt.agents.create(
            options=AgentOptions(id="main", provider="proxy", model="claude-3-5-haiku-20241022")
        )
        handle.agent.followup("hi")
        with trio.fail_after(20):
            await handle.agent.wait_idle()
        ends = [e.data["reason"] for e in handle.agent.session.events if e.type == "turn/end"]
    assert ends == [{"kind": "completed"}]
    assert len(server.requests) == 1
    assert "x-api-key" not in server.requests[0].headers


async def test_empty_key_env_sends_no_key(server: LoopbackServer) -> None:
    server.push(Reply.sse(transcript("anthropic_text")))
    async with closing(adapter_for(server, api_key_env="")) as adapter:
        chunks = await collect(adapter, cfg())
    assert chunks[-1] == Finish("stop", stop_reason="end_turn")
    assert "x-api-key" not in server.requests[0].headers


async def test_connection_reuse(server: LoopbackServer) -> None:
    server.default = Reply.sse(transcript("anthropic_thinking_tools"), piece=300)
    async with closing(adapter_for(server)) as adapter:
        for _ in range(100):
            chunks = await collect(adapter, cfg())
            assert chunks[-1] == Finish("tool-calls", stop_reason="tool_use")
    assert server.connections <= 2


TRANSCRIPTS = [
    "anthropic_text",
    "anthropic_thinking_tools",
    "anthropic_redacted_max_tokens",
    "anthropic_overloaded",
]


def _decode_all(raw: bytes, cuts: list[int]) -> list[object]:
    parser = SSEParser()
    decoder = AnthropicStreamDecoder()
    out: list[object] = []
    for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True):
        for event in parser.feed(raw[a:b]):
            if not decoder.done:
                out += decoder.feed(event)
    assert parser.close() is False
    return out


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(TRANSCRIPTS), st.data())
def test_decoding_is_independent_of_splitting(name: str, data: st.DataObject) -> None:
    raw = transcript(name)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=30)))
    chunks = _decode_all(raw, cuts)
    assert chunks == _decode_all(raw, [])
    assert isinstance(chunks[-1], Finish)
