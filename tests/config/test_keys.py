"""Key names (``config/_keys.py``): camelCase for the plugin block, snake_case elsewhere."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import yaml

from dsh_agent_loop._errors import ConfigError
from dsh_agent_loop.config import load_config
from dsh_agent_loop.config._agents import AgentEntry, LoopConfig, SettingsLayer, TurnBudget
from dsh_agent_loop.config._document import RuntimeConfig
from dsh_agent_loop.config._keys import allowed_keys, camel, closest_key, key_names, snake
from dsh_agent_loop.config._providers import PROVIDER_CLASSES, PROVIDER_KEYS

from .helpers import P0, config_with, error_of


def test_plugin_block_records_use_camel_case_keys():
    loop = key_names(LoopConfig)
    assert loop["max_parallel_tool_calls"] == "maxParallelToolCalls"
    assert loop["turn_budget"] == "turnBudget"
    assert loop["agents"] == "agents"
    entry = key_names(AgentEntry)
    assert entry["resume_session_id"] == "resumeSessionId"
    assert entry["persona_file"] == "personaFile"
    assert key_names(TurnBudget)["max_total_tokens"] == "maxTotalTokens"
    assert key_names(SettingsLayer)["max_parallel_tool_calls"] == "maxParallelToolCalls"


def test_every_attribute_has_a_key():
    for cl in (LoopConfig, AgentEntry, TurnBudget, SettingsLayer, RuntimeConfig):
        assert list(key_names(cl)) == [a.name for a in attrs.fields(cl)]


def test_other_records_keep_their_snake_case_names():
    for cl in (RuntimeConfig, *PROVIDER_CLASSES.values()):
        names = key_names(cl)
        assert all(name == key for name, key in names.items())
    assert key_names(PROVIDER_CLASSES["openai"])["api_key_env"] == "api_key_env"


def test_allowed_keys_lists_every_provider_key_for_any_provider_record():
    for cl in PROVIDER_CLASSES.values():
        assert tuple(allowed_keys(cl)) == PROVIDER_KEYS
    assert "reasoning_replay" in PROVIDER_KEYS


def test_allowed_keys_of_other_records_are_their_written_keys():
    assert list(allowed_keys(TurnBudget)) == [
        "maxSteps",
        "maxToolCalls",
        "maxTotalTokens",
        "maxSeconds",
    ]


# --- either spelling, one per key -----------------------------------------------------------------


def test_camel_and_snake_spellings_convert_both_ways():
    assert (camel("api_key_env"), snake("apiKeyEnv")) == ("apiKeyEnv", "api_key_env")
    assert (camel("maxTokens"), snake("max_tokens"), snake("kind")) == (
        "maxTokens",
        "max_tokens",
        "kind",
    )


def test_closest_key_answers_in_the_record_s_own_spelling():
    assert closest_key("maxToken", ["maxTokens", "id"]) == "maxTokens"
    assert closest_key("max_token", ["maxTokens", "id"]) == "maxTokens"
    assert closest_key("baseURL", ["kind", "base_url"]) == "base_url"
    assert closest_key("zzz", ["kind", "base_url"]) is None


def test_the_plugin_block_reads_snake_case_keys_as_its_camel_case_ones(tmp_path: Path):
    snake_case = config_with(
        {"id": "a", "reasoning_effort": "low", "max_tokens": 5, "session_id": "s"},
        max_parallel_tool_calls=3,
        turn_budget={"max_steps": 2, "max_total_tokens": 9},
    )
    camel_case = config_with(
        {"id": "a", "reasoningEffort": "low", "maxTokens": 5, "sessionId": "s"},
        maxParallelToolCalls=3,
        turnBudget={"maxSteps": 2, "maxTotalTokens": 9},
    )
    loaded = load_config(snake_case)
    assert loaded == load_config(camel_case)
    assert (loaded.plugin.max_parallel_tool_calls, loaded.agents[0].max_tokens) == (3, 5)
    assert loaded.plugin.turn_budget is not None
    assert loaded.plugin.turn_budget.max_total_tokens == 9


def test_providers_read_the_seed_s_camel_case_keys():
    camel_case = {
        "ds": {
            "kind": "openai",
            "baseUrl": "http://127.0.0.1:9/v1",
            "apiKeyEnv": "DS_KEY",
            "streamUsage": False,
            "contextWindow": 1000,
            "reasoningReplay": "tool-turns",
            "models": {"m": {"maxTokens": 7, "reasoningEffort": "high"}},
        },
        "demo": {"kind": "scripted", "latencyMs": 5, "replies": [{"toolCalls": [{"name": "t"}]}]},
    }
    snake_case = {
        "ds": {
            "kind": "openai",
            "base_url": "http://127.0.0.1:9/v1",
            "api_key_env": "DS_KEY",
            "stream_usage": False,
            "context_window": 1000,
            "reasoning_replay": "tool-turns",
            "models": {"m": {"max_tokens": 7, "reasoning_effort": "high"}},
        },
        "demo": {"kind": "scripted", "latency_ms": 5, "replies": [{"tool_calls": [{"name": "t"}]}]},
    }
    loaded = load_config({"providers": camel_case})
    assert loaded == load_config({"providers": snake_case})
    ds = loaded.providers["ds"]
    assert (ds.base_url, ds.api_key_env, ds.models["m"].max_tokens) == (
        "http://127.0.0.1:9/v1",
        "DS_KEY",
        7,
    )


def test_a_fault_names_the_key_as_written():
    raw = {"providers": {"p": {"kind": "openai", "contextWindow": 0}}}
    assert error_of(raw) == "<config>: providers.p.contextWindow: must be a positive integer"
    raw = config_with({"id": "a", "max_tokens": 0})
    assert error_of(raw) == f"<config>: {P0}.agents[0].max_tokens: must be a positive integer"


def test_cross_field_rules_see_either_spelling():
    raw = config_with({"id": "a", "session_id": "s", "resume_session_id": "t"})
    assert error_of(raw) == (
        f"<config>: {P0}.agents[0].resume_session_id: cannot be combined with sessionId"
    )
    raw = {"providers": {"p": {"kind": "anthropic", "streamUsage": False}}}
    assert error_of(raw) == "<config>: providers.p.streamUsage: only valid for kind 'openai'"


def test_both_spellings_of_one_key_in_a_yaml_file_are_refused(tmp_path: Path):
    path = tmp_path / "c.yaml"
    raw = {"providers": {"ds": {"kind": "openai", "api_key_env": "A", "apiKeyEnv": "B"}}}
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: providers.ds.apiKeyEnv: same key as 'api_key_env': write one spelling of it"
    )


def test_one_spelling_per_mapping_lets_different_mappings_differ():
    raw = config_with({"id": "a", "maxTokens": 1}, {"id": "b", "max_tokens": 2})
    assert [a.max_tokens for a in load_config(raw).agents] == [1, 2]


def test_an_unknown_key_suggests_the_closest_known_one():
    error = error_of({"providers": {"p": {"kind": "openai", "api_key": "sk-x"}}})
    assert error.startswith(
        "<config>: providers.p.api_key: unknown key (did you mean 'api_key_env'?"
    )
    assert "sk-x" not in error
