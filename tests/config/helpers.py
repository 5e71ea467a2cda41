"""Shared fixtures of the config tests: the full example config, config builders, strategies."""

from __future__ import annotations

import string
from typing import Any

import pytest
from hypothesis import strategies as st

import dsh_agent_loop
from dsh_agent_loop._errors import ConfigError
from dsh_agent_loop._tools.builtin import BUILTIN_TOOLS
from dsh_agent_loop.config import (
    PLUGIN_NAME,
    AgentEntry,
    AnthropicProviderConfig,
    LoopConfig,
    ModelConfig,
    OpenAIProviderConfig,
    RuntimeConfig,
    ScriptedProviderConfig,
    ScriptedReplyConfig,
    ScriptedToolCallConfig,
    SettingsLayer,
    TimeoutConfig,
    TurnBudget,
)
from dsh_agent_loop.config._providers import StreamLimitsConfig

SEED_EXAMPLE = """\
plugins:
  - name: '@deepseek-ai/dsh-agent-loop'
    config:
      maxParallelToolCalls: 10
      persona: You are a careful assistant.        # runtime persona (optional)
      agents:
        - {id: main, provider: deepseek, model: deepseek-chat, reasoningEffort: high, cwd: .}
store: sqlite:///sessions.db          # "memory:" | jsonl:///dir | postgresql://…
providers:
  deepseek: {kind: openai, base_url: https://api.deepseek.com, api_key_env: DEEPSEEK_API_KEY}
  demo: {kind: scripted, replies: [{text: "Hello!"}], latency_ms: 20, loop: true}
"""

P0 = "plugins[0].config"


def config_with(
    *agents: dict[str, Any], providers: dict[str, Any] | None = None, **loop: Any
) -> dict[str, Any]:
    """A config mapping with the plugin block ``loop`` and ``agents``."""
    block: dict[str, Any] = dict(loop)
    if agents:
        block["agents"] = list(agents)
    out: dict[str, Any] = {"plugins": [{"name": PLUGIN_NAME, "config": block}]}
    out["providers"] = {"ds": {"kind": "openai"}} if providers is None else providers
    return out


def error_of(source: Any, **kwargs: Any) -> str:
    """The one-line fault of loading ``source`` the way users do (tool lists checked too)."""
    with pytest.raises(ConfigError) as info:
        dsh_agent_loop.load_config(source, **kwargs)
    assert info.value.code == "CONFIG_INVALID"
    message = str(info.value)
    assert "\n" not in message
    return message


_builtin_names = st.sampled_from(sorted(BUILTIN_TOOLS))
_names = st.text(string.ascii_letters + string.digits + "-_", min_size=1, max_size=8)
# PyYAML folds Unicode line breaks (NEL, LS, PS) and control characters, so texts that must
# survive a YAML round trip avoid them.
_texts = st.text(st.characters(exclude_categories=("Cs", "Cc", "Zl", "Zp")), max_size=12)
_non_empty = _texts.filter(lambda s: bool(s.strip()))
pos_ints = st.integers(min_value=1, max_value=2**40)
_pos_floats = st.floats(min_value=1e-3, max_value=1e9, allow_nan=False, allow_infinity=False)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | _pos_floats | _texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_texts, inner, max_size=3),
    max_leaves=8,
)
_budgets = st.builds(
    TurnBudget,
    max_steps=st.none() | pos_ints,
    max_tool_calls=st.none() | pos_ints,
    max_total_tokens=st.none() | pos_ints,
    max_seconds=st.none() | _pos_floats,
)
_replies = st.builds(
    ScriptedReplyConfig,
    text=st.none() | _texts,
    reasoning=st.none() | _texts,
    tool_calls=st.lists(
        st.builds(
            ScriptedToolCallConfig,
            name=_non_empty,
            arguments=st.dictionaries(_texts, _json, max_size=3),
        ),
        max_size=2,
    ),
)
_scripted = st.builds(
    ScriptedProviderConfig,
    replies=st.lists(_replies, max_size=3),
    latency_ms=st.floats(min_value=0, max_value=1e4, allow_nan=False),
    loop=st.booleans(),
    system_prompt_update=st.sampled_from([None, "in-history", "head"]),
    context_window=st.none() | pos_ints,
)
_base_urls = st.none() | st.builds(
    "http://{}:8000/v1".format, st.from_regex(r"[a-z]{1,12}", fullmatch=True)
)
_header_names = st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,11}", fullmatch=True)
_header_values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12)
_headers = st.dictionaries(_header_names, _header_values, max_size=2)
_stream_limits = st.builds(
    StreamLimitsConfig,
    max_line_bytes=st.none() | pos_ints,
    max_event_bytes=st.none() | pos_ints,
    max_output_chars=st.none() | pos_ints,
    idle_timeout=st.none() | _pos_floats,
)
_models = st.dictionaries(
    _non_empty,
    st.builds(
        ModelConfig,
        context_window=st.none() | pos_ints,
        max_tokens=st.none() | pos_ints,
        reasoning_effort=st.none() | _non_empty,
    ),
    max_size=2,
)
_openai = st.builds(
    OpenAIProviderConfig,
    base_url=_base_urls,
    api_key_env=st.none() | _non_empty,
    headers=_headers,
    timeout=st.builds(TimeoutConfig, connect=_pos_floats, read=_pos_floats),
    stream_limits=_stream_limits,
    stream_usage=st.booleans(),
    system_prompt_update=st.sampled_from([None, "in-history", "head"]),
    reasoning_replay=st.sampled_from([None, "never", "tool-turns", "always"]),
    models=_models,
)
_anthropic = st.builds(
    AnthropicProviderConfig,
    base_url=_base_urls,
    api_key_env=st.none() | _non_empty,
    headers=_headers,
    timeout=st.builds(TimeoutConfig, connect=_pos_floats, read=_pos_floats),
    stream_limits=_stream_limits,
    system_prompt_update=st.sampled_from([None, "head"]),
    models=_models,
)


@st.composite
def runtime_configs(draw: st.DrawFn) -> RuntimeConfig:
    providers = draw(st.dictionaries(_names, _scripted | _openai | _anthropic, max_size=3))
    ids = draw(st.lists(_non_empty, unique=True, max_size=4))
    agents = []
    for agent_id in ids:
        session = draw(st.sampled_from(["session_id", "resume_session_id", None]))
        extra = {session: draw(_non_empty)} if session else {}
        agents.append(
            AgentEntry(
                id=agent_id,
                provider=draw(st.none() | st.sampled_from(sorted(providers) or [None])),
                model=draw(st.none() | _non_empty),
                reasoning_effort=draw(st.none() | _non_empty),
                max_tokens=draw(st.none() | pos_ints),
                cwd=draw(st.none() | _non_empty),
                persona=draw(st.none() | _texts),
                tools=draw(
                    st.none() | st.lists(_builtin_names, unique=True, max_size=2).map(tuple)
                ),
                turn_budget=draw(st.none() | _budgets),
                **extra,
            )
        )
    plugin = LoopConfig(
        max_parallel_tool_calls=draw(st.none() | pos_ints),
        persona=draw(st.none() | _texts),
        turn_budget=draw(st.none() | _budgets),
        agents=agents,
    )
    store = draw(st.sampled_from([None, "memory", "memory:", "sqlite:///x.db", "postgres://h"]))
    return RuntimeConfig(plugin=plugin, store=store, providers=providers)


layers = st.builds(
    SettingsLayer,
    max_parallel_tool_calls=st.none() | pos_ints,
    persona=st.none() | _texts,
    turn_budget=st.none() | _budgets,
)
