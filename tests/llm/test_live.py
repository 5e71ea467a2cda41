"""Opt-in live smoke tests against the real providers (skipped unless their API key is set).

    DEEPSEEK_API_KEY=... scripts/test tests/llm/test_live.py
    ANTHROPIC_API_KEY=... scripts/test tests/llm/test_live.py

Each runs a whole agent turn with one tool over real HTTP and checks the log is well formed.
"""

from __future__ import annotations

import os

import pytest

from dsh_agent_loop import AgentOptions, MemoryStore, invariants, open_runtime, tool
from dsh_agent_loop.llm._anthropic import AnthropicAdapter
from dsh_agent_loop.llm._openai import OpenAIAdapter


@tool
async def add(a: int, b: int) -> str:
    """Add two integers and return the sum."""
    return str(a + b)


PROMPT = "Use the add tool to add 20 and 22, then answer with just the number."


async def _turn(adapter, provider: str, model: str) -> list:
    async with open_runtime(store=MemoryStore(), providers={provider: adapter}, tools=[add]) as rt:
        h = await rt.agents.create(options=AgentOptions(id="live", provider=provider, model=model))
        h.agent.followup(PROMPT)
        await h.agent.wait_idle()
        return h.agent.session.events


def _check(events: list) -> None:
    assert invariants.check(events, allow_open_turn=False) == []
    end = [e for e in events if e.type == "turn/end"][-1]
    assert end.data["reason"]["kind"] == "completed", dict(end.data["reason"])
    results = [e for e in events if e.type == "tool/result"]
    assert any("42" in e.data["message"]["content"][0]["text"] for e in results)
    answer = [e for e in events if e.type == "assistant/message"][-1]
    text = "".join(
        b.get("text", "") for b in answer.data["message"]["content"] if b["type"] == "text"
    )
    assert "42" in text


@pytest.mark.skipif(not os.environ.get("DEEPSEEK_API_KEY"), reason="DEEPSEEK_API_KEY is not set")
async def test_deepseek_live_tool_turn():
    adapter = OpenAIAdapter(
        "deepseek", base_url="https://api.deepseek.com", api_key_env="DEEPSEEK_API_KEY"
    )
    _check(await _turn(adapter, "deepseek", "deepseek-chat"))


@pytest.mark.skipif(not os.environ.get("ANTHROPIC_API_KEY"), reason="ANTHROPIC_API_KEY is not set")
async def test_anthropic_live_tool_turn():
    model = os.environ.get("DSH_TEST_ANTHROPIC_MODEL", "claude-sonnet-4-5")
    adapter = AnthropicAdapter("anthropic", api_key_env="ANTHROPIC_API_KEY")
    _check(await _turn(adapter, "anthropic", model))
