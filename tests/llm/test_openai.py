"""The openai adapter against a loopback server replaying recorded transcripts."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_agent_loop._compose import adapter_from_config
from dsh_agent_loop._errors import ConfigError
from dsh_agent_loop._frozen import FrozenDict, freeze
from dsh_agent_loop.config import OpenAIProviderConfig, load_config
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
from dsh_agent_loop.llm._openai import OpenAIAdapter, OpenAIStreamDecoder, openai_messages
from dsh_agent_loop.llm._scripted import ScriptedModel
from dsh_agent_loop.llm._sse import SSEParser

from .server import (
    LoopbackServer,
    Reply,
    assemble,
    closing,
    collect,
    collect_prepared,
    open_loopback_server,
    transcript,
)


@pytest.fixture
async def server() -> AsyncIterator[LoopbackServer]:
    async with open_loopback_server() as srv:
        yield srv


def cfg(model: str = "gpt-4o", **extra: object) -> dict[str, object]:
    return {"provider": "p", "model": model, **extra}


async def test_text_transcript(server: LoopbackServer) -> None:
    server.push(Reply.sse(transcript("openai_text")))
    async with closing(OpenAIAdapter("p", base_url=server.url)) as adapter:
        chunks = await collect(adapter, cfg())
    words = ["Hello", "!", " How", " can", " I", " help", " today", "?"]
    assert chunks == [
        BlockStart(0, "text"),
        *[TextDelta(0, w) for w in words],
        BlockEnd(0),
        UsageChunk(Usage(19, 9, cache_read_tokens=0, reasoning_tokens=0)),
        Finish("stop", stop_reason="stop"),
    ]


async def test_parallel_tool_calls_split_at_every_byte(server: LoopbackServer) -> None:
    server.push(Reply.sse(transcript("openai_parallel_tools"), piece=1))
    async with closing(OpenAIAdapter("p", base_url=server.url)) as adapter:
        chunks = await collect(adapter, cfg("gpt-4.1"))
    first = ['{"', "city", '":"', "Paris", '","', "unit", '":"', "c", '"}']
    second = ['{"', "tz", '":"', "Europe/Paris", '"}']
    assert chunks == [
        BlockStart(0, "tool-call", "call_Wx3kP0aQ", "get_weather"),
        *[ToolCallDelta(0, a) for a in first],
        BlockStart(1, "tool-call", "call_Yb7mN2cR", "get_time"),
        *[ToolCallDelta(1, a) for a in second],
        BlockEnd(0),
        BlockEnd(1),
        UsageChunk(Usage(112, 46, cache_read_tokens=64, reasoning_tokens=0)),
        Finish("tool-calls", stop_reason="tool_calls"),
    ]
    assert assemble(chunks) == (
        FrozenDict(
            type="tool-call",
            call_id="call_Wx3kP0aQ",
            name="get_weather",
            arguments='{"city":"Paris","unit":"c"}',
        ),
        FrozenDict(
            type="tool-call",
            call_id="call_Yb7mN2cR",
            name="get_time",
            arguments='{"tz":"Europe/Paris"}',
        ),
    )


async def test_deepseek_reasoning_text_and_tool_call(server: LoopbackServer) -> None:
    server.push(Reply.sse(transcript("deepseek_reasoner_tools"), piece=100))
    adapter = OpenAIAdapter("ds", base_url=server.url, api_key_env="TEST_DS_KEY")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TEST_DS_KEY", "sk-test")
        async with closing(adapter):
            chunks = await collect(adapter, cfg("deepseek-reasoner"))
    reasoning = "The user wants the weather in Oslo. I should call the tool."
    content = assemble(chunks)
    assert content == (
        FrozenDict(type="reasoning", text=reasoning),
        FrozenDict(type="text", text="Let me check Oslo."),
        FrozenDict(
            type="tool-call",
            call_id="call_00_kT3xQw9Lm",
            name="get_weather",
            arguments='{"city": "Oslo"}',
        ),
    )
    assert [type(c).__name__ for c in chunks if not isinstance(c, ReasoningDelta | TextDelta)] == [
        "BlockStart", "BlockEnd", "BlockStart", "BlockEnd", "BlockStart",
        "ToolCallDelta", "ToolCallDelta", "ToolCallDelta", "BlockEnd", "UsageChunk", "Finish",
    ]  # fmt: skip
    assert chunks[-2:] == [
        UsageChunk(Usage(236, 61, cache_read_tokens=192, reasoning_tokens=38)),
        Finish("tool-calls", stop_reason="tool_calls"),
    ]
    assert server.requests[0].headers["authorization"] == "Bearer sk-test"


async def test_length_drops_the_call_whose_arguments_were_cut(server: LoopbackServer) -> None:
    server.push(Reply.sse(transcript("openai_length_tool")))
    async with closing(OpenAIAdapter("p", base_url=server.url)) as adapter:
        chunks = await collect(adapter, cfg("gpt-4o-mini"))
    ends = [c for c in chunks if isinstance(c, BlockEnd)]
    assert ends == [BlockEnd(0)]
    assert chunks[-1] == Finish("max-tokens", stop_reason="length")
    assert assemble(chunks) == (
        FrozenDict(
            type="tool-call",
            call_id="call_Aa1",
            name="write_file",
            arguments='{"path":"a.txt","text":"hi"}',
        ),
    )


async def test_content_filter_without_usage_streaming(server: LoopbackServer) -> None:
    server.push(Reply.sse(transcript("deepseek_content_filter")))
    adapter = OpenAIAdapter("p", base_url=server.url, stream_usage=False)
    async with closing(adapter):
        chunks = await collect(adapter, cfg("deepseek-chat"))
    assert chunks[-1] == Finish("stop", stop_reason="content_filter")
    assert not any(isinstance(c, UsageChunk) for c in chunks)
    assert assemble(chunks) == (FrozenDict(type="text", text="I cannot help with that."),)
    assert "stream_options" not in server.requests[0].json()


async def test_ollama_whole_call_with_crlf_and_stop_reason(server: LoopbackServer) -> None:
    server.push(Reply.sse(transcript("ollama_tool_crlf"), piece=5))
    async with closing(OpenAIAdapter("p", base_url=server.url + "/v1/")) as adapter:
        chunks = await collect(adapter, cfg("qwen2.5:7b"))
    assert chunks == [
        BlockStart(0, "tool-call", "call_k2m9x1", "list_dir"),
        ToolCallDelta(0, '{"path":"."}'),
        BlockEnd(0),
        Finish("tool-calls", stop_reason="stop"),
    ]
    assert server.requests[0].target == "/v1/chat/completions"


async def test_request_body_from_derived_messages(server: LoopbackServer) -> None:
    server.push(Reply.sse(transcript("openai_text")))
    messages = freeze(
        [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "id": "m-1", "content": [{"type": "text", "text": "weather?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "reasoning", "text": "think", "metadata": {"signature": "s"}},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool-call", "call_id": "c1", "name": "w", "arguments": '{"a":1}'},
                ],
            },
            {
                "role": "tool",
                "call_id": "c1",
                "name": "w",
                "content": [
                    {
                        "type": "tool-result",
                        "call_id": "c1",
                        "name": "w",
                        "text": "sunny",
                        "is_error": False,
                    }
                ],
            },
            {"role": "system", "content": []},
            {"role": "system", "content": [{"type": "text", "text": "Now be verbose."}]},
            {
                "role": "user",
                "id": "m-2",
                "source": "runtime-context",
                "content": [{"type": "text", "text": "cwd: /"}],
            },
        ]
    )
    tools = (freeze({"name": "w", "description": "weather", "parameters": {"type": "object"}}),)
    async with closing(OpenAIAdapter("p", base_url=server.url)) as adapter:
        await collect(adapter, cfg("deepseek-chat", reasoning_effort="high"), messages, tools)
    body = server.requests[0].json()
    assert body == {
        "model": "deepseek-chat",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "w", "arguments": '{"a":1}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "system", "content": "Now be verbose."},
            {"role": "user", "content": "cwd: /"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "w",
                    "description": "weather",
                    "parameters": {"type": "object"},
                },
            }
        ],
        "max_tokens": 8192,
    }
    assert "reasoning_content" not in json.dumps(body)


def test_assistant_with_only_tool_calls_has_null_content() -> None:
    message = freeze(
        {
            "role": "assistant",
            "content": [{"type": "tool-call", "call_id": "x", "name": "n", "arguments": "{}"}],
        }
    )
    assert openai_messages([message]) == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "x", "type": "function", "function": {"name": "n", "arguments": "{}"}}
            ],
        }
    ]


async def test_reasoning_model_gets_effort_and_max_completion_tokens(
    server: LoopbackServer,
) -> None:
    server.push(Reply.sse(transcript("openai_text")))
    async with closing(OpenAIAdapter("p", base_url=server.url)) as adapter:
        await collect(adapter, cfg("o4-mini", reasoning_effort="low", max_tokens=500))
    body = server.requests[0].json()
    assert body["reasoning_effort"] == "low"
    assert body["max_completion_tokens"] == 500
    assert "max_tokens" not in body


async def test_unknown_model_passes_effort_through(server: LoopbackServer) -> None:
    server.push(Reply.sse(transcript("openai_text")))
    async with closing(OpenAIAdapter("p", base_url=server.url)) as adapter:
        await collect(adapter, cfg("gpt-oss-20b", reasoning_effort="medium"))
    body = server.requests[0].json()
    assert body["reasoning_effort"] == "medium"
    assert "max_tokens" not in body


async def test_prepare_call_defaults_and_declarations() -> None:
    adapter = OpenAIAdapter("p", context_window=9000, models={"gpt-4o": {"max_tokens": 1000}})
    prepared = await adapter.prepare_call(cfg("gpt-4o"))
    assert prepared.adapter_defaults == {"max_tokens": 1000}
    assert prepared.config == {"provider": "p", "model": "gpt-4o", "max_tokens": 1000}
    assert prepared.context_window == 9000
    assert prepared.system_prompt_update is None
    explicit = await adapter.prepare_call(cfg("gpt-4o", max_tokens=5))
    assert explicit.adapter_defaults == {}
    assert explicit.config["max_tokens"] == 5
    deepseek = await adapter.prepare_call(cfg("deepseek-chat"))
    assert deepseek.system_prompt_update == "in-history"
    assert deepseek.adapter_defaults == {"max_tokens": 8192}
    per_model = OpenAIAdapter(
        "p", context_window=9000, models={"m": {"context_window": 123, "reasoning_effort": "high"}}
    )
    prepared = await per_model.prepare_call(cfg("m"))
    assert prepared.context_window == 123
    assert prepared.adapter_defaults == {"reasoning_effort": "high"}
    await adapter.aclose()
    await per_model.aclose()


async def test_system_prompt_update_override() -> None:
    head = OpenAIAdapter("p", system_prompt_update="head")
    assert (await head.prepare_call(cfg("deepseek-chat"))).system_prompt_update is None
    in_history = OpenAIAdapter("p", system_prompt_update="in-history")
    assert (await in_history.prepare_call(cfg("llama3"))).system_prompt_update == "in-history"
    with pytest.raises(ValueError, match="system_prompt_update"):
        OpenAIAdapter("p", system_prompt_update="sometimes")


async def test_missing_key_fails_prepare_call_with_the_var_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TEST_NO_SUCH_KEY", raising=False)
    adapter = OpenAIAdapter("p", api_key_env="TEST_NO_SUCH_KEY")
    with pytest.raises(ModelError) as info:
        await adapter.prepare_call(cfg())
    assert info.value.failure.code == "AUTH"
    assert "TEST_NO_SUCH_KEY" in info.value.failure.message


async def test_key_is_read_again_at_each_attempt(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_ROTATING_KEY", "one")
    server.default = Reply.sse(transcript("openai_text"))
    async with closing(
        OpenAIAdapter("p", base_url=server.url, api_key_env="TEST_ROTATING_KEY")
    ) as adapter:
        prepared = await adapter.prepare_call(cfg())
        await collect(adapter, cfg())
        monkeypatch.setenv("TEST_ROTATING_KEY", "two")
        await collect(adapter, cfg())
        monkeypatch.delenv("TEST_ROTATING_KEY")
        chunks = await collect_prepared(prepared)
    assert [r.headers["authorization"] for r in server.requests] == ["Bearer one", "Bearer two"]
    assert len(chunks) == 1
    assert chunks[0].failure.code == "AUTH"
    assert "TEST_ROTATING_KEY" in chunks[0].failure.message


async def test_no_key_env_sends_no_auth_header_and_custom_headers(server: LoopbackServer) -> None:
    server.push(Reply.sse(transcript("openai_text")))
    adapter = OpenAIAdapter("p", base_url=server.url, headers={"X-Trace": "abc"})
    async with closing(adapter):
        await collect(adapter, cfg())
    headers = server.requests[0].headers
    assert "authorization" not in headers
    assert headers["x-trace"] == "abc"
    assert headers["accept"] == "text/event-stream"


async def test_100_sequential_requests_reuse_connections(server: LoopbackServer) -> None:
    server.default = Reply.sse(transcript("openai_parallel_tools"), piece=512)
    async with closing(OpenAIAdapter("p", base_url=server.url)) as adapter:
        for _ in range(100):
            chunks = await collect(adapter, cfg())
            assert chunks[-1] == Finish("tool-calls", stop_reason="tool_calls")
    assert len(server.requests) == 100
    assert server.connections <= 2


async def test_closed_adapter_reopens_lazily(server: LoopbackServer) -> None:
    server.default = Reply.sse(transcript("openai_text"))
    adapter = OpenAIAdapter("p", base_url=server.url)
    await collect(adapter, cfg())
    await adapter.aclose()
    chunks = await collect(adapter, cfg())
    await adapter.aclose()
    assert chunks[-1] == Finish("stop", stop_reason="stop")
    assert server.connections == 2


async def test_adapter_from_config(server: LoopbackServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_CFG_KEY", "k")
    server.push(Reply.sse(transcript("openai_text")))
    section = {
        "kind": "openai",
        "base_url": server.url + "//",
        "api_key_env": "TEST_CFG_KEY",
        "headers": {"x-a": "b"},
        "timeout": {"connect": 5, "read": 30},
        "stream_usage": False,
        "system_prompt_update": "head",
        "context_window": 4096,
        "models": {"deepseek-chat": {"max_tokens": 100}},
    }
    record = load_config({"providers": {"deepseek": section}}).providers["deepseek"]
    assert isinstance(record, OpenAIProviderConfig)
    adapter = adapter_from_config("deepseek", record)
    assert isinstance(adapter, OpenAIAdapter)
    async with closing(adapter):
        prepared = await adapter.prepare_call(cfg("deepseek-chat"))
        assert prepared.system_prompt_update is None
        assert prepared.context_window == 4096
        assert prepared.adapter_defaults == {"max_tokens": 100}
        await collect(adapter, cfg("deepseek-chat"))
    request = server.requests[0]
    assert request.target == "/chat/completions"
    assert request.headers["x-a"] == "b"
    assert "stream_options" not in request.json()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"kind": "openai", "bogus": 1}, "providers.x.bogus: unknown key"),
        (
            {"kind": "openai", "timeout": {"connect": 1, "write": 2}},
            "providers.x.timeout.write: unknown key",
        ),
        (
            {"kind": "openai", "timeout": {"read": -1}},
            "providers.x.timeout.read: must be a positive",
        ),
        ({"kind": "openai", "base_url": "ftp://x"}, "providers.x.base_url: must be an http"),
        (
            {"kind": "openai", "stream_usage": "yes"},
            "providers.x.stream_usage: expected a boolean",
        ),
        ({"kind": "openai", "context_window": 0}, "providers.x.context_window: must be a positive"),
        ({"kind": "openai", "models": {"m": {"foo": 1}}}, "providers.x.models.m.foo: unknown key"),
        ({"kind": "openai", "system_prompt_update": "x"}, "providers.x.system_prompt_update"),
        (
            {"kind": "anthropic", "stream_usage": True},
            "providers.x.stream_usage: only valid for kind 'openai'",
        ),
        (
            {"kind": "anthropic", "system_prompt_update": "in-history"},
            "providers.x.system_prompt_update: anthropic takes one system prompt",
        ),
        (
            {"kind": "openai", "headers": {"a": 1}},
            "providers.x.headers.a: expected a string, got integer",
        ),
    ],
)
def test_provider_sections_are_rejected_at_load(config: dict[str, object], message: str) -> None:
    """Adapters are built only from validated records: a bad section fails at load."""
    with pytest.raises(ConfigError) as info:
        load_config({"providers": {"x": config}})
    assert str(info.value).startswith(f"<config>: {message}")


def test_adapter_from_config_takes_only_a_validated_record() -> None:
    with pytest.raises(TypeError, match="expected a validated provider record, not a mapping"):
        adapter_from_config("x", {"kind": "openai"})  # type: ignore[arg-type]
    record = load_config({"providers": {"x": {"kind": "scripted"}}}).providers["x"]
    assert isinstance(adapter_from_config("x", record), ScriptedModel)


TRANSCRIPTS = [
    "openai_text",
    "openai_parallel_tools",
    "deepseek_reasoner_tools",
    "openai_length_tool",
    "deepseek_content_filter",
    "ollama_tool_crlf",
]


def _decode_all(raw: bytes, cuts: list[int]) -> list[object]:
    parser = SSEParser()
    decoder = OpenAIStreamDecoder()
    out: list[object] = []
    for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True):
        for event in parser.feed(raw[a:b]):
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


@pytest.mark.parametrize("url", ["api.openai.com/v1", "ftp://host/v1", "http://"])
def test_bad_base_url_is_rejected_up_front(url: str) -> None:
    with pytest.raises(ValueError, match="base_url"):
        OpenAIAdapter("p", base_url=url)
