"""Tests for dsh_agent_loop.config._mcp: the ``mcpServers`` section."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dsh_agent_loop._frozen import FrozenDict
from dsh_agent_loop.config import RuntimeConfig, converter, load_config
from dsh_agent_loop.config._mcp import McpServerConfig, McpToolConfig

from .helpers import error_of

YAML = """\
mcpServers:
  files:
    command: npx
    args: ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]
    env: {DEBUG: "1"}
    cwd: /tmp
    tools:
      read_file: {execution_mode: parallel}
  search:
    url: https://example.com/mcp
    headers: {Authorization: Bearer x}
    prefix: web_
"""


def test_mcp_servers_load_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(YAML)
    config = load_config(str(path))
    files = config.mcp_servers["files"]
    assert files == McpServerConfig(
        command="npx",
        args=("-y", "@modelcontextprotocol/server-filesystem", "/tmp"),
        env=FrozenDict(DEBUG="1"),
        cwd="/tmp",
        tools=FrozenDict(read_file=McpToolConfig("parallel")),
    )
    assert config.mcp_servers["search"].headers == {"Authorization": "Bearer x"}
    assert config.mcp_servers["search"].prefix == "web_"


def test_mcp_servers_round_trip_through_the_converter() -> None:
    config = load_config({"mcpServers": {"a": {"command": "x", "args": ["1"]}}})
    raw = converter.unstructure(config, RuntimeConfig)
    assert load_config(raw) == config


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ({"a": {"command": "x", "url": "http://h"}}, "mcpServers.a.url: give either 'command'"),
        ({"a": {"args": ["x"]}}, "mcpServers.a: required key missing: 'command' (stdio) or"),
        ({"a": {"url": "http://h", "env": {}}}, "mcpServers.a.env: only valid with 'command'"),
        ({"a": {"command": "x", "headers": {}}}, "mcpServers.a.headers: only valid with 'url'"),
        ({"a": {"command": "x", "args": [1]}}, "mcpServers.a.args[0]: expected a string"),
        ({"a": {"command": ""}}, "mcpServers.a.command: must be a non-empty string"),
        ({"a b": {"command": "x"}}, "a server name is 1 to 64 letters"),
        ({"a": {"command": "x", "comand": "y"}}, "mcpServers.a.comand"),
        (
            {"a": {"command": "x", "tools": {"t": {"execution_mode": "sometimes"}}}},
            "mcpServers.a.tools.t.execution_mode: must be one of 'parallel', 'exclusive'",
        ),
        ([1], "mcpServers: expected a mapping"),
    ],
)
def test_mcp_server_faults_name_their_key_path(section: Any, expected: str) -> None:
    assert expected in error_of({"mcpServers": section})
