"""Tests for dsh_agent_loop.config._providers: the providers section, one union over kind."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from dsh_agent_loop import _compose, open_runtime
from dsh_agent_loop._frozen import FrozenDict
from dsh_agent_loop.config import (
    AnthropicProviderConfig,
    ModelConfig,
    OpenAIProviderConfig,
    ScriptedProviderConfig,
    ScriptedToolCallConfig,
    TimeoutConfig,
    converter,
    load_config,
)
from dsh_agent_loop.config._providers import StreamLimitsConfig
from dsh_agent_loop.llm._scripted import ScriptedModel

from .helpers import error_of


def test_provider_keys(tmp_path: Path) -> None:
    raw = {
        "kind": "anthropic",
        "base_url": "https://example.test",
        "headers": {"X-Team": "a"},
        "timeout": {"connect": 2},
        "system_prompt_update": "head",
        "context_window": 1000,
        "models": {"claude-x": {"context_window": 9, "max_tokens": 8, "reasoning_effort": "low"}},
    }
    provider = load_config({"providers": {"a": raw}}).providers["a"]
    assert provider.timeout == TimeoutConfig(connect=2.0, read=300.0)
    assert provider.headers == {"X-Team": "a"}
    assert provider.models["claude-x"] == ModelConfig(
        context_window=9, max_tokens=8, reasoning_effort="low"
    )
    assert provider.system_prompt_update == "head"
    assert isinstance(provider, AnthropicProviderConfig)
    openai = load_config({"providers": {"o": {"kind": "openai", "stream_usage": False}}})
    assert openai.providers["o"] == OpenAIProviderConfig(stream_usage=False)
    scripted = {
        "kind": "scripted",
        "replies": [
            {"reasoning": "hm", "tool_calls": [{"name": "t", "arguments": {"x": [1, {"y": 2}]}}]}
        ],
    }
    reply = load_config({"providers": {"s": scripted}}).providers["s"].replies[0]
    assert reply.tool_calls == (ScriptedToolCallConfig(name="t", arguments={"x": [1, {"y": 2}]}),)
    assert isinstance(reply.tool_calls[0].arguments, FrozenDict)


def test_reply_tool_call_arguments_default_to_empty() -> None:
    source = {
        "providers": {"s": {"kind": "scripted", "replies": [{"tool_calls": [{"name": "t"}]}]}}
    }
    reply = load_config(source).providers["s"].replies[0]
    assert reply.tool_calls[0].arguments == {}
    bad = {
        "providers": {
            "s": {"kind": "scripted", "replies": [{"tool_calls": [{"name": "t", "arguments": 1}]}]}
        }
    }
    assert error_of(bad) == (
        "<config>: providers.s.replies[0].tool_calls[0].arguments: expected a mapping, got integer"
    )


REJECTIONS: list[tuple[str, dict[str, Any], str]] = [
    (
        "unknown provider key, with the closest known key",
        {"providers": {"p": {"kind": "openai", "base_uri": "http://h"}}},
        "providers.p.base_uri: unknown key (did you mean 'base_url'? allowed: kind, base_url, "
        "api_key_env, headers, "
        "timeout, stream_limits, stream_usage, system_prompt_update, context_window, "
        "reasoning_replay, models, replies, latency_ms, loop)",
    ),
    (
        "both spellings of one provider key",
        {"providers": {"p": {"kind": "openai", "base_url": "http://h", "baseUrl": "http://h"}}},
        "providers.p.baseUrl: same key as 'base_url': write one spelling of it",
    ),
    (
        "camelCase base_url that is not http, named as written",
        {"providers": {"p": {"kind": "openai", "baseUrl": "file:///etc"}}},
        "providers.p.baseUrl: must be an http:// or https:// URL",
    ),
    (
        "a camelCase key of another kind",
        {"providers": {"p": {"kind": "scripted", "apiKeyEnv": "K"}}},
        "providers.p.apiKeyEnv: not valid for kind 'scripted'",
    ),
    (
        "provider base_url that is not http",
        {"providers": {"p": {"kind": "openai", "base_url": "file:///etc"}}},
        "providers.p.base_url: must be an http:// or https:// URL",
    ),
    (
        "anthropic base_url without a host",
        {"providers": {"p": {"kind": "anthropic", "base_url": "https://"}}},
        "providers.p.base_url: must be an http:// or https:// URL",
    ),
    (
        "unknown provider kind",
        {"providers": {"g": {"kind": "gemini"}}},
        "providers.g.kind: unknown provider kind 'gemini' (expected openai, anthropic or scripted)",
    ),
    (
        "provider without kind",
        {"providers": {"g": {"base_url": "x"}}},
        "providers.g.kind: required key missing",
    ),
    (
        "scripted keys on an HTTP provider",
        {"providers": {"p": {"kind": "openai", "loop": True}}},
        "providers.p.loop: only valid for kind 'scripted'",
    ),
    (
        "HTTP keys on a scripted provider",
        {"providers": {"p": {"kind": "scripted", "api_key_env": "K"}}},
        "providers.p.api_key_env: not valid for kind 'scripted'",
    ),
    (
        "stream_usage on an anthropic provider",
        {"providers": {"p": {"kind": "anthropic", "stream_usage": False}}},
        "providers.p.stream_usage: only valid for kind 'openai'",
    ),
    (
        "in-history on an anthropic provider",
        {"providers": {"p": {"kind": "anthropic", "system_prompt_update": "in-history"}}},
        "providers.p.system_prompt_update: anthropic takes one system prompt: 'head'",
    ),
    (
        "negative latency",
        {"providers": {"s": {"kind": "scripted", "latency_ms": -1}}},
        "providers.s.latency_ms: must be a non-negative number",
    ),
    (
        "bad system_prompt_update",
        {"providers": {"s": {"kind": "scripted", "system_prompt_update": "tail"}}},
        "providers.s.system_prompt_update: must be one of 'in-history', 'head', got 'tail'",
    ),
    (
        "header value not a string",
        {"providers": {"p": {"kind": "openai", "headers": {"X-N": 1}}}},
        "providers.p.headers.X-N: expected a string, got integer",
    ),
    (
        "a base_url with a password, never quoted",
        {"providers": {"p": {"kind": "openai", "base_url": "https://me:hunter2@api.test/v1"}}},
        "providers.p.base_url: must not carry a user name or password (user:pass@); "
        "use api_key_env",
    ),
    (
        "a header value with a line break, never quoted",
        {"providers": {"p": {"kind": "anthropic", "headers": {"x-token": "tok-1\r\nx: y"}}}},
        "providers.p.headers.x-token: must be printable ASCII text "
        "(no control characters or line breaks)",
    ),
    (
        "a header name that is not a token",
        {"providers": {"p": {"kind": "openai", "headers": {"x token": "v"}}}},
        "providers.p.headers['x token']: is not a valid HTTP header name",
    ),
    (
        "a stream limit that is not positive",
        {"providers": {"p": {"kind": "openai", "stream_limits": {"max_line_bytes": 0}}}},
        "providers.p.stream_limits.max_line_bytes: must be a positive integer",
    ),
    (
        "an idle timeout that is not a number",
        {"providers": {"p": {"kind": "anthropic", "stream_limits": {"idle_timeout": "5"}}}},
        "providers.p.stream_limits.idle_timeout: must be a positive number, got string",
    ),
    (
        "an unknown stream limit",
        {"providers": {"p": {"kind": "openai", "stream_limits": {"max_line": 5}}}},
        "providers.p.stream_limits.max_line: unknown key (did you mean 'max_line_bytes'? "
        "allowed: max_line_bytes, max_event_bytes, max_output_chars, idle_timeout)",
    ),
    (
        "stream limits on a scripted provider",
        {"providers": {"s": {"kind": "scripted", "stream_limits": {}}}},
        "providers.s.stream_limits: not valid for kind 'scripted'",
    ),
    (
        "provider name with a dot is quoted in the path",
        {"providers": {"a.b": {"kind": "x"}}},
        "providers['a.b'].kind: unknown provider kind 'x' (expected openai, anthropic or scripted)",
    ),
]


@pytest.mark.parametrize(
    ("source", "expected"),
    [pytest.param(src, exp, id=name) for name, src, exp in REJECTIONS],
)
def test_provider_rejection_rules(source: dict[str, Any], expected: str) -> None:
    before = copy.deepcopy(source)
    assert error_of(source) == f"<config>: {expected}"
    assert source == before


def test_stream_limits_are_read_in_either_spelling() -> None:
    raw = {
        "o": {"kind": "openai", "stream_limits": {"max_line_bytes": 1000, "idle_timeout": 30}},
        "a": {"kind": "anthropic", "streamLimits": {"maxOutputChars": 5, "maxEventBytes": 9}},
    }
    providers = load_config({"providers": raw}).providers
    assert providers["o"].stream_limits == StreamLimitsConfig(max_line_bytes=1000, idle_timeout=30)
    assert providers["a"].stream_limits == StreamLimitsConfig(max_output_chars=5, max_event_bytes=9)
    assert converter.unstructure(providers["o"]) == {
        "kind": "openai",
        "stream_limits": {"max_line_bytes": 1000, "idle_timeout": 30.0},
    }


def test_a_header_value_is_never_quoted_in_an_error() -> None:
    raw = {"kind": "openai", "headers": {"x-token": "tok-secret\n", "x-ok": "v"}}
    message = error_of({"providers": {"p": raw}})
    assert "tok-secret" not in message
    assert "x-token" in message


# --- validated once ---------------------------------------------------------------------------


def test_each_kind_has_its_own_record() -> None:
    config = load_config(
        {
            "providers": {
                "o": {"kind": "openai", "reasoning_replay": "always"},
                "a": {"kind": "anthropic", "api_key_env": "K"},
                "s": {"kind": "scripted", "loop": True},
            }
        }
    )
    assert config.providers["o"] == OpenAIProviderConfig(reasoning_replay="always")
    assert config.providers["a"] == AnthropicProviderConfig(api_key_env="K")
    assert config.providers["s"] == ScriptedProviderConfig(loop=True)
    assert converter.unstructure(config)["providers"] == {
        "o": {"kind": "openai", "reasoning_replay": "always"},
        "a": {"kind": "anthropic", "api_key_env": "K"},
        "s": {"kind": "scripted", "loop": True},
    }


async def test_adapters_are_built_from_the_validated_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The runtime builds each adapter from the very record ``load_config`` made: no round
    trip through a mapping, so nothing downstream validates the section again."""
    seen: list[tuple[str, object]] = []
    real = _compose.adapter_from_config

    def spy(name: str, record: Any, **kwargs: Any) -> Any:
        adapter = real(name, record, **kwargs)
        seen.append((type(adapter).__name__, record))
        return adapter

    monkeypatch.setattr(_compose, "adapter_from_config", spy)
    config = load_config(
        {
            "providers": {
                "o": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"},
                "a": {"kind": "anthropic"},
                "s": {"kind": "scripted", "replies": [{"text": "hi"}]},
            }
        }
    )
    async with open_runtime(config) as rt:
        assert rt.config is config
    assert [kind for kind, _ in seen] == ["OpenAIAdapter", "AnthropicAdapter", "ScriptedModel"]
    for (_, record), name in zip(seen, ("o", "a", "s"), strict=True):
        assert record is config.providers[name]


def test_adapter_from_config_refuses_a_raw_section() -> None:
    with pytest.raises(TypeError, match="expected a validated provider record"):
        _compose.adapter_from_config("s", {"kind": "scripted"})  # type: ignore[arg-type]
    record = load_config({"providers": {"s": {"kind": "scripted", "latency_ms": 5}}})
    model = _compose.adapter_from_config("s", record.providers["s"])
    assert isinstance(model, ScriptedModel)
    assert model.latency == 0.005
