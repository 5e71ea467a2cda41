"""``run`` and ``chat`` stop before any model call when an MCP server an agent needs fails.

Each test runs ``dsh-agent`` in a subprocess, from a working directory other than the config's
folder, with the config's servers written beside it and named by relative paths.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from .helpers import agent_events, cli, stored_sessions, tool_errors

pytest.importorskip("mcp")

SERVER = Path(__file__).resolve().parents[1] / "mcp" / "server.py"

#: Fails at once: some lines of stderr (one with a terminal escape), then exit 4.
BROKEN = """\
import sys
for n in range(30):
    print(f"loading part {n}", file=sys.stderr)
print("fatal: cannot open the database \\x1b[2J", file=sys.stderr)
sys.exit(4)
"""

CONFIG = """\
plugins:
  - name: '@deepseek-ai/dsh-agent-loop'
    config:
      agents:
        - {agent}
providers:
  demo:
    kind: scripted
    replies:
      - tool_calls:
          - name: good__echo
            arguments: {{text: from the cli}}
      - text: The server answered.
mcpServers:
  good:
    command: {python}
    args: [./server.py, stdio]
    env: {{MARKER_DIR: {markers}}}
  broken:
    command: {python}
    args: [broken.py, --verbose]
    env: {{API_TOKEN: s3cret-token-value}}
"""


def project(tmp_path: Path, agent: str) -> tuple[Path, Path]:
    """The config folder (config, servers) and another folder to run from."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "server.py").write_text(SERVER.read_text())
    (folder / "broken.py").write_text(BROKEN)
    text = CONFIG.format(
        agent=agent, python=json.dumps(sys.executable), markers=json.dumps(str(tmp_path))
    )
    (folder / "agents.yaml").write_text(text)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    return folder, elsewhere


def assert_reported(stderr: str, folder: Path) -> None:
    lines = stderr.splitlines()
    assert lines[0] == (
        "MCP server 'broken' did not start: its process exited with status 4 before it"
        " finished the MCP handshake"
    )
    assert lines[1] == f"  command: {sys.executable} {folder / 'broken.py'} --verbose"
    assert lines[2] == "  env: API_TOKEN (values not shown)"
    assert lines[3] == "  stderr (last 10 of 31 lines):"
    assert lines[4] == "    loading part 21"
    assert lines[13] == "    fatal: cannot open the database ␛[2J"
    assert lines[14] == (
        "agent 'main' failed to start: it needs the tools of MCP server 'broken', which did not"
        " start"
    )
    assert "s3cret-token-value" not in stderr
    assert "\x1b" not in stderr


def test_run_exits_2_before_any_model_call(tmp_path: Path) -> None:
    folder, elsewhere = project(tmp_path, "{id: main, provider: demo, model: m}")
    done = cli(
        "run",
        "--config",
        str(folder / "agents.yaml"),
        "--store",
        "sqlite:///s.db",
        "--prompt",
        "ask the server",
        cwd=elsewhere,
    )
    assert done.returncode == 2, done.stderr
    assert_reported(done.stderr, folder)
    assert "tool call" not in done.stdout
    assert "The server answered." not in done.stdout
    assert stored_sessions(elsewhere / "s.db") == {}  # no session, so no turn and no model call


def test_chat_exits_2_before_any_model_call(tmp_path: Path) -> None:
    folder, elsewhere = project(
        tmp_path, "{id: main, provider: demo, model: m, tools: [broken__*]}"
    )
    done = cli(
        "chat",
        "--config",
        str(folder / "agents.yaml"),
        "--store",
        "sqlite:///s.db",
        cwd=elsewhere,
        stdin="ask the server\n",
    )
    assert done.returncode == 2, done.stderr
    assert_reported(done.stderr, folder)
    assert "The server answered." not in done.stdout
    assert stored_sessions(elsewhere / "s.db") == {}


def test_an_agent_that_names_other_tools_runs_with_exactly_them(tmp_path: Path) -> None:
    folder, elsewhere = project(
        tmp_path, "{id: main, provider: demo, model: m, tools: [good__*, read_file]}"
    )
    done = cli(
        "run",
        "--config",
        str(folder / "agents.yaml"),
        "--store",
        "sqlite:///s.db",
        "--prompt",
        "ask the server",
        cwd=elsewhere,
    )
    # the server it does not need is still reported, and the exit status says so
    assert done.stderr.startswith("MCP server 'broken' did not start")
    assert done.returncode == 2
    assert "echo: from the cli" in done.stdout
    assert "The server answered." in done.stdout
    events = agent_events(elsewhere / "s.db", "main")
    assert tool_errors(events, "good__echo") == [None]


def test_a_tools_list_naming_an_undeclared_server_is_a_config_error(tmp_path: Path) -> None:
    folder, elsewhere = project(
        tmp_path, "{id: main, provider: demo, model: m, tools: [good__echo, files__*]}"
    )
    done = cli("run", "--config", str(folder / "agents.yaml"), "--prompt", "hi", cwd=elsewhere)
    assert done.returncode == 2
    assert done.stderr == (
        f"{folder / 'agents.yaml'}: plugins[0].config.agents[0].tools[1]: unknown MCP server"
        " 'files' in 'files__*' (mcpServers declares: broken, good)\n"
    )
