"""``McpServer`` and ``mcpServers`` entries: server names and tool prefixes are checked."""

from __future__ import annotations

import pytest

from dsh_agent_loop import ConfigError, load_config
from dsh_agent_loop.mcp import McpServer


@pytest.mark.parametrize("name", ["", "a b", "x" * 65, "ünï", "a\n"])
def test_a_bad_server_name_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="name is 1 to 64 letters"):
        McpServer.stdio(name, "true")


@pytest.mark.parametrize("prefix", ["a.b_", "x" * 64, "sp ace", "new\n"])
def test_a_bad_prefix_is_refused(prefix: str) -> None:
    assert McpServer.stdio("s-1_x", "true", prefix="").tool_prefix == ""
    assert McpServer.http("s", "http://h/mcp", prefix="x" * 63).tool_prefix == "x" * 63
    with pytest.raises(ValueError, match="prefix is at most 63 letters"):
        McpServer.stdio("s", "true", prefix=prefix)


def test_a_bad_prefix_in_the_config_names_its_key() -> None:
    with pytest.raises(ConfigError, match=r"mcpServers\.s\.prefix: a prefix is at most 63"):
        load_config({"mcpServers": {"s": {"command": "x", "prefix": "web.tools_"}}})
