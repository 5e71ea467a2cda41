"""``Limits``: defaults, validation, the config's ``limits`` block and its precedence."""

from __future__ import annotations

from typing import Any

import pytest

from dsh_agent_loop import ConfigError, Limits, ScriptedModel, load_config, open_runtime
from dsh_agent_loop._limits import DEFAULT_LIMITS

PLUGIN = "@deepseek-ai/dsh-agent-loop"


def test_the_defaults_stop_a_hostile_peer_early() -> None:
    assert Limits() == DEFAULT_LIMITS
    assert Limits().max_tool_result_bytes == 1 << 20
    assert Limits().mcp_call_timeout == 60.0
    assert Limits().max_delegation_depth == 8
    assert Limits().max_tool_calls_per_reply == 128


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tool_result_bytes", 0),
        ("max_tool_calls_per_reply", -1),
        ("max_delegation_depth", True),
        ("max_subagents", 1.5),
        ("mcp_call_timeout", 0),
        ("mcp_call_timeout", float("inf")),
        ("mcp_max_tools", "5"),
    ],
)
def test_a_bad_value_is_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"Limits.{field}"):
        Limits(**{field: value})


def _config(limits: Any) -> dict[str, Any]:
    return {"plugins": [{"name": PLUGIN, "config": {"limits": limits}}]}


def test_the_config_block_reads_camel_case_keys() -> None:
    config = load_config(_config({"maxToolResultBytes": 4096, "mcpCallTimeout": 5}))
    assert config.plugin.limits == Limits(max_tool_result_bytes=4096, mcp_call_timeout=5)


def test_a_bad_config_value_names_its_key_path() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_config({"maxToolCallsPerReply": 0, "bogus": 1}))
    message = str(info.value)
    assert "limits.maxToolCallsPerReply: must be a positive integer" in message
    assert "limits.bogus: unknown key" in message


async def test_open_runtime_limits_win_over_the_config() -> None:
    providers = {"scripted": ScriptedModel([])}
    config = _config({"maxSubagents": 7})
    async with open_runtime(config, providers=providers) as rt:
        assert rt.limits == Limits(max_subagents=7)
    async with open_runtime(config, providers=providers, limits=Limits(max_subagents=3)) as rt:
        assert rt.limits.max_subagents == 3
    async with open_runtime(providers=providers) as rt:
        assert rt.limits is DEFAULT_LIMITS
