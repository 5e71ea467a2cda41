"""The config document (``config/_document.py``): ``RuntimeConfig`` and the file shape."""

from __future__ import annotations

import attrs
import pytest

from dsh_agent_loop._frozen import FrozenDict
from dsh_agent_loop.config._agents import AgentEntry, LoopConfig
from dsh_agent_loop.config._document import FileShape, PluginEntry, RuntimeConfig


def test_runtime_config_defaults():
    config = RuntimeConfig()
    assert config.plugin == LoopConfig()
    assert config.store is None
    assert config.providers == {}
    assert type(config.providers) is FrozenDict
    assert config.source == "<config>"
    assert config.agents == ()


def test_agents_are_the_plugin_block_agents():
    agents = (AgentEntry(id="a"), AgentEntry(id="b"))
    config = RuntimeConfig(plugin=LoopConfig(agents=list(agents)), source="x.yaml")
    assert config.agents == agents
    assert config.source == "x.yaml"


def test_providers_are_frozen_into_a_read_only_mapping():
    config = RuntimeConfig(providers={"p": object()})
    assert type(config.providers) is FrozenDict
    with pytest.raises(TypeError):
        config.providers["q"] = 1  # type: ignore[index]
    shape = FileShape(providers={"p": 1})
    assert type(shape.providers) is FrozenDict


def test_records_are_frozen_values():
    assert RuntimeConfig() == RuntimeConfig()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        RuntimeConfig().store = "memory"  # type: ignore[misc]
    entry = PluginEntry(name="dsh-agent-loop")
    assert entry.config == LoopConfig()
    assert FileShape().plugins == ()
    assert FileShape().store is None
