"""A server an agent needs that does not start is the agent's start failure, before any turn.

Also: an agent's ``tools`` list names MCP tools (``server__tool``, ``server__*``), checked when
the config loads and expanded when the servers have listed their tools; relative paths in an
``mcpServers`` entry resolve from the config file's folder.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from dsh_agent_loop import (
    ConfigError,
    InvalidOptionError,
    Reply,
    ScriptedModel,
    load_config,
    open_runtime,
)
from dsh_agent_loop.mcp import McpStartError

from .conftest import PROCESS_WAIT, SERVER

#: A server that fails at once: two lines of stderr, one with a terminal escape, then exit 4.
BROKEN = """\
import sys
print("opening /srv/db", file=sys.stderr)
print("fatal: cannot open the database \\x1b[2J", file=sys.stderr)
sys.exit(4)
"""


def config(
    tmp_path: Path, *agents: dict[str, Any], broken_env: dict[str, str] | None = None
) -> dict[str, Any]:
    """A config with the test server ``t`` and a ``broken`` one, and ``agents``."""
    (tmp_path / "broken.py").write_text(BROKEN)
    return {
        "plugins": [
            {"name": "@deepseek-ai/dsh-agent-loop", "config": {"agents": list(agents)}},
        ],
        "mcpServers": {
            "t": {
                "command": sys.executable,
                "args": [SERVER, "stdio"],
                "env": {"MARKER_DIR": str(tmp_path)},
            },
            "broken": {
                "command": sys.executable,
                "args": [str(tmp_path / "broken.py"), "--verbose"],
                "env": broken_env or {},
            },
        },
    }


def agent(agent_id: str, tools: list[str] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": agent_id, "provider": "scripted", "model": "m"}
    if tools is not None:
        entry["tools"] = tools
    return entry


async def test_an_agent_that_needs_a_failed_server_does_not_start(tmp_path: Path) -> None:
    model = ScriptedModel([Reply.text("never")])
    cfg = config(
        tmp_path,
        agent("all"),  # no list: every runtime tool, so every server
        agent("named", ["t__echo", "broken__lookup"]),
        agent("star", ["broken__*"]),
        agent("fine", ["t__*"]),
        broken_env={"API_TOKEN": "s3cret-value"},
    )
    with trio.fail_after(PROCESS_WAIT):
        async with open_runtime(cfg, providers={"scripted": model}) as rt:
            failures = {f.agent_id: f.error for f in rt.start_failures}
            assert list(failures) == ["mcpServers.broken", "all", "named", "star"]
            server_error = failures["mcpServers.broken"]
            assert isinstance(server_error, McpStartError)
            for agent_id in ("all", "named", "star"):
                assert failures[agent_id] is server_error
                assert rt.agents.get(agent_id) is None
            assert [a.id for a in rt.agents.list()] == ["fine"]
            assert rt.statistics().start_failures == 4
    assert model.requests == []  # no model call was made
    assert server_error.server == "broken"
    assert server_error.problem == (
        "its process exited with status 4 before it finished the MCP handshake"
    )
    assert server_error.command == (sys.executable, str(tmp_path / "broken.py"), "--verbose")
    assert server_error.env_names == ("API_TOKEN",)
    assert server_error.stderr_tail.endswith("fatal: cannot open the database \x1b[2J")
    assert "s3cret-value" not in str(server_error)
    assert "s3cret-value" not in repr(vars(server_error))


#: A server that echoes its token to stderr (as a debug print might), then fails.
ECHOES = """\
import os, sys
print("connecting with token " + os.environ["API_TOKEN"], file=sys.stderr)
sys.exit(3)
"""


async def test_a_secret_the_failed_server_echoes_is_hidden(tmp_path: Path) -> None:
    (tmp_path / "echoes.py").write_text(ECHOES)
    secret = "tok-4f9a81c2e7"
    cfg = {
        "plugins": [{"name": "@deepseek-ai/dsh-agent-loop", "config": {"agents": []}}],
        "mcpServers": {
            "echoes": {
                "command": sys.executable,
                "args": [str(tmp_path / "echoes.py"), f"--auth={secret}"],
                "env": {"API_TOKEN": secret},
            }
        },
    }
    with trio.fail_after(PROCESS_WAIT):
        async with open_runtime(cfg) as rt:
            [failure] = rt.start_failures
    error = failure.error
    assert isinstance(error, McpStartError)
    assert error.stderr_tail.strip() == "connecting with token ***"
    assert error.command[-1] == "--auth=***"
    assert secret not in str(error)
    assert secret not in repr(vars(error))


async def test_an_agent_gets_exactly_the_mcp_tools_it_names(tmp_path: Path) -> None:
    model = ScriptedModel([Reply.text("one"), Reply.text("two"), Reply.text("three")])
    cfg = config(
        tmp_path,
        agent("star", ["t__*"]),
        agent("named", ["t__echo", "read_file"]),
        agent("both", ["t__*", "t__echo"]),
    )
    with trio.fail_after(PROCESS_WAIT):
        async with open_runtime(cfg, providers={"scripted": model}) as rt:
            listed = sorted(n for n in rt.tools if n.startswith("t__"))
            assert "t__echo" in listed
            assert [f.agent_id for f in rt.start_failures] == ["mcpServers.broken"]
            for agent_id, prompt in (("star", "a"), ("named", "b"), ("both", "c")):
                live = rt.agents.get(agent_id)
                assert live is not None
                await live.run(prompt)
            both = rt.agents.get("both")
            assert both is not None
            # '*' became the server's tools, in its order; the one also named is listed once
            assert both.options.tools == tuple(n for n in rt.tools if n.startswith("t__"))
    seen = [sorted(t["name"] for t in request.tools) for request in model.requests]
    assert seen == [listed, ["read_file", "t__echo"], listed]


async def test_a_named_tool_the_server_does_not_offer_is_a_start_failure(tmp_path: Path) -> None:
    cfg = config(tmp_path, agent("main", ["t__echo", "t__nope"]))
    with trio.fail_after(PROCESS_WAIT):
        async with open_runtime(cfg, providers={"scripted": ScriptedModel([])}) as rt:
            failures = {f.agent_id: f.error for f in rt.start_failures}
            assert rt.agents.get("main") is None
    error = failures["main"]
    assert isinstance(error, InvalidOptionError)
    assert str(error).startswith("MCP server 't' has no tool 'nope' (it offers: echo, ")


def test_a_tools_list_may_name_the_tools_of_declared_servers_only(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        agent("ok", ["t__echo", "t__*", "broken__*"]),
        agent("bad", ["t__echo", "files__read", "files__*", "x*", "t__a.b"]),
    )
    with pytest.raises(ConfigError) as caught:
        load_config(cfg, known_providers=["scripted"])
    at = "<config>: plugins[0].config.agents[1].tools"
    assert str(caught.value).split("; ") == [
        f"{at}[1]: unknown MCP server 'files' in 'files__read' (mcpServers declares: broken, t)",
        f"{at}[2]: unknown MCP server 'files' in 'files__*' (mcpServers declares: broken, t)",
        f"{at}[3]: 'x*': '*' names every tool of one MCP server (declared: broken, t)",
        f"{at}[4]: 't__a.b' names no tool of MCP server 't': after 't__' comes a tool's name"
        " (letters, digits, '_' and '-', a '.' written '_') or '*'",
    ]


def test_a_server_with_a_prefix_is_named_by_its_prefix(tmp_path: Path) -> None:
    cfg = config(tmp_path, agent("main", ["web_search", "web_*"]))
    cfg["mcpServers"]["t"]["prefix"] = "web_"
    assert load_config(cfg, known_providers=["scripted"]).agents[0].tools == ("web_search", "web_*")
    cfg["plugins"][0]["config"]["agents"] = [agent("main", ["t__search"])]
    with pytest.raises(ConfigError, match=r"tools\[0\]: MCP server 't' has the tool prefix 'web_'"):
        load_config(cfg, known_providers=["scripted"])


def write_config(folder: Path, server: dict[str, Any]) -> Path:
    path = folder / "agents.yaml"
    path.write_text(json.dumps({"mcpServers": {"local": server}}))  # JSON is YAML
    return path


def test_relative_paths_resolve_from_the_config_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "project"
    (folder / "bin").mkdir(parents=True)
    (folder / "server.py").write_text("")
    (folder / "bin" / "tool.py").write_text("")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "stdio").write_text("")  # a file named like a word, in the process's cwd
    monkeypatch.chdir(elsewhere)
    server = {
        "command": "./bin/run",
        "args": ["server.py", "./data", "../shared", "--flag", "-", "stdio", "pkg@1", "a=b"],
    }
    loaded = load_config(write_config(folder, server)).mcp_servers["local"]
    assert loaded.command == str(folder / "bin" / "run")
    assert loaded.args == (
        str(folder / "server.py"),  # a plain word naming a file beside the config
        str(folder / "data"),  # written as a path: resolved, whether it exists or not
        str(tmp_path / "shared"),
        "--flag",
        "-",
        "stdio",  # no such file beside the config: a word
        "pkg@1",
        "a=b",
    )
    assert loaded.cwd is None

    # with a cwd, itself from the config folder, the command and args resolve from it
    server = {"command": "python3", "args": ["tool.py", "./x"], "cwd": "bin"}
    loaded = load_config(write_config(folder, server)).mcp_servers["local"]
    assert loaded.cwd == str(folder / "bin")
    assert loaded.command == "python3"  # no '/': looked up on PATH
    assert loaded.args == (str(folder / "bin" / "tool.py"), str(folder / "bin" / "x"))


async def test_a_relative_server_runs_from_any_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "server.py").write_bytes(await trio.Path(SERVER).read_bytes())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    env = {"MARKER_DIR": str(tmp_path)}
    path = write_config(folder, {"command": sys.executable, "args": ["./server.py", "stdio"]})
    path.write_text(path.read_text().replace('"args"', f'"env": {json.dumps(env)}, "args"'))
    with trio.fail_after(PROCESS_WAIT):
        async with open_runtime(str(path)) as rt:
            assert rt.start_failures == []
            assert "local__echo" in rt.tools
    assert os.getcwd() == str(elsewhere)


async def test_a_subagents_list_names_mcp_tools_too(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    block = cfg["plugins"][0]["config"]
    block["subagents"] = [
        {"id": "helper", "provider": "scripted", "model": "m", "tools": ["t__*", "read_file"]},
        {
            "id": "stuck",
            "provider": "scripted",
            "model": "m",
            "tools": ["broken__*"],
            "tool": "ask",
        },
    ]
    with trio.fail_after(PROCESS_WAIT):
        async with open_runtime(cfg, providers={"scripted": ScriptedModel([])}) as rt:
            listed = tuple(n for n in rt.tools if n.startswith("t__"))
            assert "t__echo" in listed
            helper, _ = rt.subagents["helper"]
            assert helper.tools == (*listed, "read_file")
            stuck, _ = rt.subagents["stuck"]
            assert stuck.tools == ("broken__*",)  # its server failed: creating one is refused
