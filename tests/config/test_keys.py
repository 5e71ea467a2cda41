"""Key names (``config/_keys.py``): camelCase for the plugin block, snake_case elsewhere."""

from __future__ import annotations

import attrs

from dsh_agent_loop.config._keys import allowed_keys, key_names
from dsh_agent_loop.config.agents import AgentEntry, LoopConfig, SettingsLayer, TurnBudget
from dsh_agent_loop.config.document import RuntimeConfig
from dsh_agent_loop.config.providers import PROVIDER_CLASSES, PROVIDER_KEYS


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
