"""One adapter per validated provider kind (``_compose.adapter_from_config``), and the
provider objects (``_providers.py``: ``OpenAIProvider``, ``AnthropicProvider``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from dsh_agent_loop import (
    AgentOptions,
    AnthropicProvider,
    ConfigError,
    JsonlStore,
    OpenAIProvider,
    load_config,
    open_runtime,
)
from dsh_agent_loop._compose import adapter_from_config
from dsh_agent_loop.config._providers import (
    AnthropicProviderConfig,
    OpenAIProviderConfig,
    ScriptedProviderConfig,
    ScriptedReplyConfig,
)
from dsh_agent_loop.llm._anthropic import AnthropicAdapter
from dsh_agent_loop.llm._base import Finish, ModelAdapter
from dsh_agent_loop.llm._openai import OpenAIAdapter
from dsh_agent_loop.llm._scripted import ScriptedModel
from dsh_agent_loop.llm._stream_limits import StreamLimits

from .server import (
    LoopbackServer,
    Reply,
    closing,
    collect,
    open_loopback_server,
    refused_url,
    transcript,
)


def _transport() -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(500))  # pragma: no cover


@pytest.mark.parametrize(
    ("config", "cls"),
    [
        (OpenAIProviderConfig(base_url="http://127.0.0.1:9/v1"), OpenAIAdapter),
        (AnthropicProviderConfig(base_url="http://127.0.0.1:9"), AnthropicAdapter),
        (ScriptedProviderConfig(replies=[ScriptedReplyConfig(text="hi")]), ScriptedModel),
    ],
)
async def test_each_kind_builds_its_adapter(config, cls):
    adapter = adapter_from_config("p", config, transport=_transport())
    try:
        assert type(adapter) is cls
        assert isinstance(adapter, ModelAdapter)
    finally:
        await adapter.aclose()


@pytest.mark.parametrize("raw", [{"kind": "openai"}, {"kind": "scripted", "replies": []}])
def test_a_raw_mapping_is_refused(raw):
    with pytest.raises(TypeError, match=r"providers\.p: expected a validated provider record"):
        adapter_from_config("p", raw)  # type: ignore[arg-type]


# --- provider objects: OpenAIProvider, AnthropicProvider ------------------------------------------

SECRET = "sk-direct-7f3a9c"


@pytest.fixture
async def server() -> AsyncIterator[LoopbackServer]:
    async with open_loopback_server() as srv:
        yield srv


def _stored_text(directory: Path) -> str:
    return "".join(p.read_text(encoding="utf-8") for p in sorted(directory.iterdir()))


async def _one_turn(rt: Any, provider: str, model: str) -> list[Any]:
    handle = await rt.agents.create(options=AgentOptions(id="a", provider=provider, model=model))
    handle.agent.followup("hi")
    with trio.fail_after(10):
        await handle.agent.wait_idle()
    return list(handle.agent.session.events)


def _answer(events: list[Any]) -> list[str]:
    return [
        part["text"]
        for e in events
        if e.type == "assistant/message"
        for part in e.data["message"]["content"]
        if part["type"] == "text"
    ]


async def test_open_runtime_uses_an_openai_provider_object_with_a_direct_key(
    server: LoopbackServer, tmp_path: Path
) -> None:
    server.push(Reply.sse(transcript("openai_text")))
    provider = OpenAIProvider(base_url=f"{server.url}/v1", api_key=SECRET, stream_usage=False)
    logs = tmp_path / "logs"
    async with open_runtime(store=JsonlStore(logs), providers={"local": provider}) as rt:
        events = await _one_turn(rt, "local", "gpt-4o")
    (request,) = server.requests
    assert request.target == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {SECRET}"
    assert "stream_options" not in request.json()  # stream_usage=False reached the adapter
    assert "".join(_answer(events)).startswith("Hello")
    assert SECRET not in _stored_text(logs)  # never in the session log
    assert SECRET not in repr(provider)


async def test_an_openai_provider_reads_its_key_from_api_key_env(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-from-env")
    server.push(Reply.sse(transcript("openai_text")))
    provider = OpenAIProvider(base_url=server.url, api_key_env="TEST_PROVIDER_KEY")
    async with open_runtime(providers={"local": provider}) as rt:
        await _one_turn(rt, "local", "gpt-4o")
    assert server.requests[0].headers["authorization"] == "Bearer sk-from-env"


async def test_a_keyless_openai_provider_sends_no_auth_header(server: LoopbackServer) -> None:
    server.push(Reply.sse(transcript("openai_text")))
    async with open_runtime(providers={"local": OpenAIProvider(base_url=server.url)}) as rt:
        await _one_turn(rt, "local", "llama")
    assert "authorization" not in server.requests[0].headers


async def test_open_runtime_uses_an_anthropic_provider_object(
    server: LoopbackServer, tmp_path: Path
) -> None:
    server.push(Reply.sse(transcript("anthropic_text")))
    provider = AnthropicProvider(base_url=server.url, api_key=SECRET)
    logs = tmp_path / "logs"
    async with open_runtime(store=JsonlStore(logs), providers={"claude": provider}) as rt:
        events = await _one_turn(rt, "claude", "claude-sonnet-4")
    (request,) = server.requests
    assert request.target == "/v1/messages"
    assert request.headers["x-api-key"] == SECRET
    assert _answer(events) != []
    assert SECRET not in _stored_text(logs)
    assert SECRET not in repr(provider)


async def test_a_provider_object_wins_over_a_config_provider_of_the_same_name(
    server: LoopbackServer,
) -> None:
    server.push(Reply.sse(transcript("openai_text")))
    config = {"providers": {"local": {"kind": "openai", "base_url": refused_url()}}}
    provider = OpenAIProvider(base_url=server.url)
    async with open_runtime(config, providers={"local": provider}) as rt:
        await _one_turn(rt, "local", "gpt-4o")
    assert len(server.requests) == 1


def test_a_provider_object_is_checked_by_the_config_rules_when_built() -> None:
    with pytest.raises(ConfigError) as info:
        OpenAIProvider(base_url="ftp://h", context_window=0)
    assert str(info.value) == (
        "OpenAIProvider: base_url: must be an http:// or https:// URL; "
        "OpenAIProvider: context_window: must be a positive integer"
    )
    with pytest.raises(ConfigError, match="anthropic takes one system prompt"):
        AnthropicProvider(system_prompt_update="in-history")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"models\.m\.max_tokens: must be a positive integer"):
        OpenAIProvider(models={"m": {"max_tokens": 0}})


@pytest.mark.parametrize("cls", [OpenAIProvider, AnthropicProvider])
def test_a_key_is_given_one_way(cls: Any) -> None:
    with pytest.raises(ValueError, match="give api_key or api_key_env, not both"):
        cls(api_key=SECRET, api_key_env="K")
    with pytest.raises(ValueError, match="api_key is empty"):
        cls(api_key=" ")
    header = "Authorization" if cls is OpenAIProvider else "X-Api-Key"
    with pytest.raises(ValueError, match=r"give api_key or a .* header, not both") as info:
        cls(api_key=SECRET, headers={header: "other"})
    assert SECRET not in str(info.value)


@pytest.mark.parametrize(
    ("timeout", "expected"),
    [(None, (10.0, 300.0)), (5, (5.0, 5.0)), ((2, 60), (2.0, 60.0)), ({"read": 9}, (10.0, 9.0))],
)
async def test_timeout_forms_reach_the_adapter(timeout: Any, expected: tuple[float, float]) -> None:
    adapter = OpenAIProvider(base_url="http://127.0.0.1:9", timeout=timeout).adapter("p")
    try:
        assert isinstance(adapter, OpenAIAdapter)
        client = adapter._pool.get()
        assert (client.timeout.connect, client.timeout.read) == expected
    finally:
        await adapter.aclose()


# --- stream limits ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, StreamLimits(idle_timeout=300.0)),
        ({"max_line_bytes": 1000}, StreamLimits(max_line_bytes=1000, idle_timeout=300.0)),
        (
            StreamLimits(max_output_chars=7, idle_timeout=3),
            StreamLimits(max_output_chars=7, idle_timeout=3),
        ),
    ],
)
@pytest.mark.parametrize("cls", [OpenAIProvider, AnthropicProvider])
async def test_stream_limits_reach_the_adapter(
    cls: Any, given: Any, expected: StreamLimits
) -> None:
    async with closing(
        cls(base_url="http://127.0.0.1:9", stream_limits=given).adapter("p")
    ) as adapter:
        assert adapter.stream_limits == expected


async def test_the_idle_limit_defaults_to_the_read_timeout() -> None:
    provider = OpenAIProvider(base_url="http://127.0.0.1:9", timeout=(2, 45))
    async with closing(provider.adapter("p")) as adapter:
        assert adapter.stream_limits.idle_timeout == 45.0
    raw = {"kind": "anthropic", "timeout": {"read": 30}, "stream_limits": {"max_event_bytes": 99}}
    config = load_config({"providers": {"a": raw}}).providers["a"]
    async with closing(adapter_from_config("a", config)) as adapter:
        assert adapter.stream_limits == StreamLimits(max_event_bytes=99, idle_timeout=30.0)


def test_bad_stream_limits_are_config_errors() -> None:
    with pytest.raises(ConfigError) as info:
        OpenAIProvider(stream_limits={"max_line_bytes": 0, "idle_timeout": -1})
    assert str(info.value) == (
        "OpenAIProvider: stream_limits.max_line_bytes: must be a positive integer; "
        "OpenAIProvider: stream_limits.idle_timeout: must be a positive number"
    )
    with pytest.raises(
        ValueError, match=r"StreamLimits\.max_event_bytes must be a positive integer"
    ):
        StreamLimits(max_event_bytes=0)
    with pytest.raises(ValueError, match=r"StreamLimits\.idle_timeout must be positive and finite"):
        StreamLimits(idle_timeout=float("inf"))


async def test_a_config_providers_stream_limits_apply_to_its_streams(
    server: LoopbackServer,
) -> None:
    """A config's ``stream_limits`` is what the adapter reads its streams within."""
    frames = b"".join(
        b'data: {"choices": [{"index": 0, "delta": {"content": "' + b"x" * 100 + b'"}}]}\n\n'
        for _ in range(5)
    )
    server.push(Reply.sse(frames))
    raw = {"kind": "openai", "base_url": server.url, "stream_limits": {"max_output_chars": 250}}
    config = load_config({"providers": {"o": raw}}).providers["o"]
    async with closing(adapter_from_config("o", config)) as adapter:
        chunks = await collect(adapter, {"model": "gpt-4o"})
    finish = chunks[-1]
    assert isinstance(finish, Finish)
    assert finish.failure is not None
    assert finish.failure.code == "BAD_STREAM"
    assert "max_output_chars (250)" in finish.failure.message
