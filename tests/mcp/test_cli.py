"""``dsh-agent run --config agents.yaml`` with an ``mcpServers:`` entry calls an MCP tool."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..cli.helpers import cli
from .conftest import SERVER, process_gone

CONFIG = """\
plugins:
  - name: '@deepseek-ai/dsh-agent-loop'
    config:
      agents:
        - {{id: main, provider: demo, model: m, tools: ["t__*"]}}
store: "memory:"
providers:
  demo:
    kind: scripted
    replies:
      - tool_calls:
          - name: t__echo
            arguments: {{text: from the cli}}
      - text: The server answered.
mcpServers:
  t:
    command: {python}
    args: [{server}, stdio]
    env: {{MARKER_DIR: {markers}}}
  broken:
    command: {python}
    args: ["-c", "import sys; sys.exit('no such database')"]
"""


def test_run_calls_an_mcp_tool_declared_in_the_config(tmp_path: Path) -> None:
    config = tmp_path / "agents.yaml"
    config.write_text(
        CONFIG.format(
            python=json.dumps(sys.executable),
            server=json.dumps(SERVER),
            markers=json.dumps(str(tmp_path)),
        )
    )
    done = cli("run", "--config", str(config), "--prompt", "ask the server", cwd=tmp_path)
    out = done.stdout
    assert "tool call: t__echo" in out, (out, done.stderr)
    assert "result: t__echo" in out
    assert "echo: from the cli" in out
    assert "The server answered." in out
    # the broken server (which the agent does not need) is reported, and the exit status says so
    assert done.stderr.startswith("MCP server 'broken' did not start")
    assert "no such database" in done.stderr
    assert done.returncode == 2
    assert process_gone(int((tmp_path / "pid").read_text()))
