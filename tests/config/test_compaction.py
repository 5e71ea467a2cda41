"""The ``compaction`` key of the plugin block and of ``agents[]`` (config/_compaction.py)."""

from __future__ import annotations

from typing import Any

import pytest

from dsh_agent_loop import CompactionPolicy, ConfigError, ScriptedModel, load_config, open_runtime
from dsh_agent_loop.config._compaction import CompactionConfig
from dsh_agent_loop.testing import actor_of

PLUGIN = "@deepseek-ai/dsh-agent-loop"


def doc(config: dict[str, Any]) -> dict[str, Any]:
    return {"plugins": [{"name": PLUGIN, "config": config}]}


def test_both_spellings_load_into_a_policy() -> None:
    loaded = load_config(
        doc(
            {
                "compaction": {"triggerRatio": 0.5, "keep_recent_turns": 0},
                "agents": [{"id": "a", "compaction": {"instructions": "keep names"}}],
            }
        )
    )
    assert loaded.plugin.compaction == CompactionConfig(trigger_ratio=0.5, keep_recent_turns=0)
    assert loaded.plugin.agents[0].compaction == CompactionConfig(instructions="keep names")


@pytest.mark.parametrize(
    ("compaction", "message"),
    [
        ({"triggerRatio": 0}, "compaction.triggerRatio: must be a number in (0, 1]"),
        ({"triggerRatio": 1.01}, "compaction.triggerRatio: must be a number in (0, 1]"),
        ({"triggerRatio": "high"}, "compaction.triggerRatio: must be a number in (0, 1]"),
        ({"keepRecentTurns": -1}, "compaction.keepRecentTurns: must be a non-negative integer"),
        ({"keepRecentTurns": 1.5}, "compaction.keepRecentTurns: must be a non-negative integer"),
        ({"summarizer": "mod:fn"}, "compaction.summarizer: unknown key"),
        ({"instructions": 3}, "compaction.instructions: expected a string"),
    ],
)
def test_bad_values_name_their_key_path(compaction: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(doc({"compaction": compaction}))
    assert f"plugins[0].config.{message}" in str(caught.value)


async def test_the_config_policy_reaches_the_agents_and_an_agent_entry_wins() -> None:
    config = doc(
        {
            "compaction": {"triggerRatio": 0.5},
            "agents": [
                {"id": "plain", "provider": "scripted", "model": "m"},
                {
                    "id": "own",
                    "provider": "scripted",
                    "model": "m",
                    "compaction": {"keepRecentTurns": 5},
                },
            ],
        }
    )
    async with open_runtime(config, providers={"scripted": ScriptedModel([])}) as rt:
        plain, own = rt.agents.get("plain"), rt.agents.get("own")
        assert plain is not None
        assert own is not None
        assert actor_of(plain).compaction == CompactionPolicy(trigger_ratio=0.5)
        assert actor_of(own).compaction == CompactionPolicy(keep_recent_turns=5)
    explicit = CompactionPolicy(trigger_ratio=0.9)
    async with open_runtime(
        config, providers={"scripted": ScriptedModel([])}, compaction=explicit
    ) as rt:
        plain = rt.agents.get("plain")
        assert plain is not None
        assert actor_of(plain).compaction is explicit
