"""``adapter_from_config`` (``llm/providers.py``): one adapter per validated provider kind."""

from __future__ import annotations

import httpx
import pytest

from dsh_agent_loop.config.providers import (
    AnthropicProviderConfig,
    OpenAIProviderConfig,
    ScriptedProviderConfig,
    ScriptedReplyConfig,
)
from dsh_agent_loop.llm.anthropic import AnthropicAdapter
from dsh_agent_loop.llm.base import ModelAdapter
from dsh_agent_loop.llm.openai import OpenAIAdapter
from dsh_agent_loop.llm.providers import HTTP_KINDS, adapter_from_config
from dsh_agent_loop.llm.scripted import ScriptedModel


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


def test_http_kinds():
    assert frozenset({"openai", "anthropic"}) == HTTP_KINDS
    assert "scripted" not in HTTP_KINDS
