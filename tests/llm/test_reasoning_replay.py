"""Reasoning replay (docs/design.md#reasoning-replay): which assistant messages carry
``reasoning_content`` back.

The policy is per model (``never | tool-turns | always``, from the model table, overridable per
provider and per model). The tool loops run against loopback servers that behave like the two
kinds of API that made it necessary: DeepSeek's thinking mode answers HTTP 400 when an assistant
turn with tool calls comes back without its ``reasoning_content`` (an empty one included), and
``deepseek-reasoner`` (like many OpenAI-compatible servers) answers 400 when the field is there.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from dsh_agent_loop import AgentOptions, ConfigError, MemoryStore, load_config, open_runtime, tool
from dsh_agent_loop._compose import adapter_from_config
from dsh_agent_loop._frozen import freeze
from dsh_agent_loop.llm._models import lookup_model, resolve_model
from dsh_agent_loop.llm._openai import OpenAIAdapter, openai_messages

from .agent_helpers import (
    DONE,
    KEY_ENV,
    TURN_TIMEOUT,
    LiveAgent,
    live_agent,
    oai,
    oai_call,
    oai_text,
    oai_usage,
    plain,
    turn_ends,
)
from .server import LoopbackServer, Recorded, Reply, open_loopback_server


@pytest.fixture(autouse=True)
def _keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-replay-test")


@tool
async def lookup(city: str) -> str:
    """Look up the weather."""
    return f"sunny in {city}"


# --- the two kinds of server ------------------------------------------------------------------


def _refuse(message: str) -> Reply:
    error = {"message": message, "type": "invalid_request_error", "code": "invalid_request_error"}
    return Reply.error(400, {"error": error})


def wants_reasoning(request: Recorded) -> Reply | None:
    """DeepSeek thinking mode: every assistant turn with tool calls must carry the field."""
    for message in request.json()["messages"]:
        tool_turn = message["role"] == "assistant" and message.get("tool_calls")
        if tool_turn and not isinstance(message.get("reasoning_content"), str):
            return _refuse("Missing `reasoning_content` field in the assistant message")
    return None


def rejects_reasoning(request: Recorded) -> Reply | None:
    """``deepseek-reasoner`` and strict servers: the field must never be sent."""
    for message in request.json()["messages"]:
        if "reasoning_content" in message:
            return _refuse("reasoning_content is not allowed in input messages")
    return None


def tool_step(reasoning: str | None) -> Reply:
    """A thinking step that calls ``lookup`` (reasoning streamed first when given)."""
    pieces = []
    if reasoning is not None:
        pieces.append(oai({"role": "assistant", "content": None, "reasoning_content": reasoning}))
    pieces += [
        oai_call(0, "call_oslo", "lookup", '{"city": "Oslo"}'),
        oai({}, "tool_calls"),
        oai_usage(),
        DONE,
    ]
    return Reply(pieces=pieces)


ANSWER = Reply(
    pieces=[
        oai({"role": "assistant", "content": None, "reasoning_content": "It is sunny."}),
        *oai_text("Sunny", " in Oslo."),
    ]
)


def assistant_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "assistant"]


async def run_tool_loop(h: LiveAgent, reasoning: str | None) -> list[Any]:
    """Serve a tool step then the answer; the turn must complete in two requests."""
    h.server.push(tool_step(reasoning), ANSWER)
    await h.run("weather in Oslo?")
    (end,) = turn_ends(h.events)
    assert end == {"kind": "completed"}, end
    assert len(h.server.requests) == 2
    return h.bodies()


# --- the tool loop against the servers ----------------------------------------------------------


@pytest.mark.parametrize("model", ["deepseek-v4-flash", "deepseek-v4-pro"])
@pytest.mark.parametrize(
    ("reasoning", "replayed"),
    [("I should look it up.", "I should look it up."), ("", ""), (None, "")],
    ids=["reasoning", "empty-reasoning", "no-reasoning"],
)
async def test_thinking_model_replays_reasoning_on_tool_turns(
    model: str, reasoning: str | None, replayed: str
) -> None:
    async with live_agent("openai", model=model, tools=[lookup]) as h:
        h.server.gate = wants_reasoning
        bodies = await run_tool_loop(h, reasoning)
    first, second = bodies
    assert assistant_messages(first) == []
    (tool_turn,) = assistant_messages(second)
    assert tool_turn["tool_calls"][0]["id"] == "call_oslo"
    assert tool_turn["reasoning_content"] == replayed  # "" when there was none: never omitted


async def test_thinking_model_never_replays_on_turns_without_tool_calls() -> None:
    async with live_agent("openai", model="deepseek-v4-flash", tools=[lookup]) as h:
        h.server.gate = wants_reasoning
        await run_tool_loop(h, "I should look it up.")
        h.server.push(Reply(pieces=oai_text("Bye.")))
        await h.run("thanks")
        assert turn_ends(h.events)[-1] == {"kind": "completed"}
        third = h.bodies()[-1]
    tool_turn, answer = assistant_messages(third)
    assert tool_turn["reasoning_content"] == "I should look it up."
    assert answer == {"role": "assistant", "content": "Sunny in Oslo."}


@pytest.mark.parametrize(
    ("model", "adapter_kwargs"),
    [
        ("deepseek-reasoner", {}),  # the table says never
        ("local-model", {}),  # unknown models never replay
        ("deepseek-v4-flash", {"reasoning_replay": "never"}),  # the provider overrides the table
        (
            "deepseek-v4-flash",
            {
                "reasoning_replay": "always",
                "models": {"deepseek-v4-flash": {"reasoning_replay": "never"}},
            },
        ),  # the model entry overrides the provider
    ],
    ids=["reasoner", "unknown", "provider-never", "model-never"],
)
async def test_never_sends_the_field_to_a_server_that_rejects_it(
    model: str, adapter_kwargs: dict[str, Any]
) -> None:
    async with live_agent(
        "openai", model=model, tools=[lookup], adapter_kwargs=adapter_kwargs
    ) as h:
        h.server.gate = rejects_reasoning
        bodies = await run_tool_loop(h, "I should look it up.")
    assert "reasoning_content" not in json.dumps(bodies)


async def test_the_wrong_policy_fails_against_each_server() -> None:
    # The servers really refuse: without the right policy the turn ends with the 400.
    async with live_agent(
        "openai",
        model="deepseek-v4-flash",
        tools=[lookup],
        adapter_kwargs={"reasoning_replay": "never"},
    ) as h:
        h.server.gate = wants_reasoning
        h.server.push(tool_step("I should look it up."))
        await h.run("weather in Oslo?")
        (end,) = turn_ends(h.events)
    assert end["kind"] == "error"
    assert end["error"]["code"] == "HTTP_4XX"
    assert "reasoning_content" in end["error"]["message"]
    async with live_agent("openai", model="deepseek-v4-flash", tools=[lookup]) as h:
        h.server.gate = rejects_reasoning
        h.server.push(tool_step("I should look it up."))
        await h.run("weather in Oslo?")
        (end,) = turn_ends(h.events)
    assert end["kind"] == "error"
    assert end["error"]["code"] == "HTTP_4XX"


# --- from the config file -----------------------------------------------------------------------


@asynccontextmanager
async def config_agent(
    provider: Mapping[str, Any], model: str
) -> AsyncIterator[tuple[LoopbackServer, Any]]:
    """A runtime built from a config mapping whose provider ``ds`` posts to a loopback server."""
    async with open_loopback_server() as server:
        config = {"providers": {"ds": {"kind": "openai", "base_url": server.url, **provider}}}
        async with open_runtime(config, store=MemoryStore(), tools=[lookup], seed=0) as rt:
            handle = await rt.agents.create(
                options=AgentOptions(id="main", provider="ds", model=model)
            )
            yield server, handle.agent


async def run_config_loop(server: LoopbackServer, agent: Any) -> list[Any]:
    server.push(tool_step(""), ANSWER)
    agent.followup("weather in Oslo?")
    with trio.fail_after(TURN_TIMEOUT):
        await agent.wait_idle()
    assert turn_ends(agent.session.events) == [{"kind": "completed"}]
    return [r.json() for r in server.requests]


@pytest.mark.parametrize(
    "provider",
    [
        {"reasoning_replay": "tool-turns"},
        {"models": {"local-thinker": {"reasoning_replay": "tool-turns"}}},
        {"reasoning_replay": "never", "models": {"local-thinker": {"reasoning_replay": "always"}}},
    ],
    ids=["provider", "model", "model-over-provider"],
)
async def test_config_policy_reaches_the_adapter(provider: dict[str, Any]) -> None:
    async with config_agent(provider, "local-thinker") as (server, agent):
        server.gate = wants_reasoning
        bodies = await run_config_loop(server, agent)
    (tool_turn,) = assistant_messages(bodies[1])
    assert tool_turn["reasoning_content"] == ""


async def test_config_never_overrides_the_table() -> None:
    async with config_agent({"reasoning_replay": "never"}, "deepseek-v4-pro") as (server, agent):
        server.gate = rejects_reasoning
        bodies = await run_config_loop(server, agent)
    assert "reasoning_content" not in json.dumps(bodies)


def test_config_accepts_the_policies() -> None:
    config = load_config(
        {
            "providers": {
                "ds": {
                    "kind": "openai",
                    "reasoning_replay": "tool-turns",
                    "models": {"m": {"reasoning_replay": "always"}},
                }
            }
        }
    )
    provider = config.providers["ds"]
    assert provider.reasoning_replay == "tool-turns"
    assert provider.models["m"].reasoning_replay == "always"
    assert (
        load_config({"providers": {"ds": {"kind": "openai"}}}).providers["ds"].reasoning_replay
        is None
    )


ONE_OF = "must be one of 'never', 'tool-turns', 'always'"


@pytest.mark.parametrize(
    ("provider", "error"),
    [
        (
            {"kind": "openai", "reasoning_replay": "sometimes"},
            f"providers.ds.reasoning_replay: {ONE_OF}, got 'sometimes'",
        ),
        (
            {"kind": "openai", "reasoning_replay": True},
            f"providers.ds.reasoning_replay: {ONE_OF}, got boolean",
        ),
        (
            {"kind": "openai", "models": {"m": {"reasoning_replay": "tool_turns"}}},
            f"providers.ds.models.m.reasoning_replay: {ONE_OF}, got 'tool_turns'",
        ),
        (
            {"kind": "anthropic", "reasoning_replay": "never"},
            "providers.ds.reasoning_replay: only valid for kind 'openai'",
        ),
        (
            {"kind": "anthropic", "models": {"m": {"reasoning_replay": "never"}}},
            "providers.ds.models.m.reasoning_replay: only valid for kind 'openai'",
        ),
        (
            {"kind": "scripted", "reasoning_replay": "never"},
            "providers.ds.reasoning_replay: not valid for kind 'scripted'",
        ),
    ],
)
def test_config_rejects_a_bad_policy_naming_the_key(provider: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"providers": {"ds": provider}})
    assert str(info.value) == f"<config>: {error}"


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            {"kind": "openai", "reasoning_replay": "sometimes"},
            f"providers.x.reasoning_replay: {ONE_OF}, got 'sometimes'",
        ),
        (
            {"kind": "openai", "models": {"m": {"reasoning_replay": 1}}},
            f"providers.x.models.m.reasoning_replay: {ONE_OF}, got integer",
        ),
        (
            {"kind": "anthropic", "reasoning_replay": "never"},
            "providers.x.reasoning_replay: only valid for kind 'openai'",
        ),
        (
            {"kind": "anthropic", "models": {"m": {"reasoning_replay": "never"}}},
            "providers.x.models.m.reasoning_replay: only valid for kind 'openai'",
        ),
    ],
)
def test_a_bad_policy_never_reaches_an_adapter(section: dict[str, Any], message: str) -> None:
    """The section is validated once, at load; adapters take only the validated record."""
    with pytest.raises(ConfigError) as info:
        load_config({"providers": {"x": section}})
    assert str(info.value) == f"<config>: {message}"
    with pytest.raises(TypeError, match="expected a validated provider record"):
        adapter_from_config("x", section)  # type: ignore[arg-type]


def test_adapter_rejects_a_bad_policy() -> None:
    with pytest.raises(ValueError, match="reasoning_replay must be one of"):
        OpenAIAdapter("p", reasoning_replay="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"models\.m\.reasoning_replay must be one of"):
        OpenAIAdapter("p", models={"m": {"reasoning_replay": "yes"}})


# --- the table and the request body -------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "policy"),
    [
        ("deepseek-v4-pro", "tool-turns"),
        ("deepseek-v4-flash", "tool-turns"),
        ("deepseek-v4-flash-0801", "tool-turns"),
        ("deepseek-reasoner", "never"),
        ("deepseek-chat", "never"),
        ("gpt-4o", "never"),
        ("claude-sonnet-4-20250514", "never"),
        ("some-local-model", "never"),
    ],
)
def test_table_defaults(model: str, policy: str) -> None:
    assert resolve_model(model).reasoning_replay == policy


def test_overrides_resolve_most_specific_first() -> None:
    table = lookup_model("deepseek-v4-pro")
    assert table is not None
    assert table.reasoning_replay == "tool-turns"
    models = {"deepseek-v4-pro": {"reasoning_replay": "always"}}
    assert resolve_model("deepseek-v4-pro", reasoning_replay="never").reasoning_replay == "never"
    assert (
        resolve_model("deepseek-v4-pro", models=models, reasoning_replay="never").reasoning_replay
        == "always"
    )
    assert (
        resolve_model("other", models=models, reasoning_replay="never").reasoning_replay == "never"
    )


HISTORY = freeze(
    [
        {"role": "user", "id": "m-1", "content": [{"type": "text", "text": "weather?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "reasoning", "text": "Look it up."},
                {"type": "tool-call", "call_id": "c1", "name": "w", "arguments": "{}"},
            ],
        },
        {
            "role": "tool",
            "call_id": "c1",
            "content": [
                {"type": "tool-result", "call_id": "c1", "text": "sunny", "is_error": False}
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool-call", "call_id": "c2", "name": "w", "arguments": "{}"}],
        },
        {
            "role": "tool",
            "call_id": "c2",
            "content": [
                {"type": "tool-result", "call_id": "c2", "text": "sunny", "is_error": False}
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "reasoning", "text": "Done."},
                {"type": "text", "text": "Sunny."},
            ],
        },
    ]
)


@pytest.mark.parametrize(
    ("policy", "replayed"),
    [
        ("never", [None, None, None]),
        ("tool-turns", ["Look it up.", "", None]),
        ("always", ["Look it up.", "", "Done."]),
    ],
)
def test_request_messages_per_policy(policy: Any, replayed: list[str | None]) -> None:
    messages = openai_messages(HISTORY, reasoning_replay=policy)
    assistants = [m for m in messages if m["role"] == "assistant"]
    assert [m.get("reasoning_content") for m in assistants] == replayed
    for message, expected in zip(assistants, replayed, strict=True):
        assert ("reasoning_content" in message) is (expected is not None)
    assert plain(assistants[2]["content"]) == "Sunny."
    assert openai_messages(HISTORY) == openai_messages(HISTORY, reasoning_replay="never")
