"""``--permission-mode`` and calls waiting for approval in ``run`` (exit 3) and ``simulate``."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from dsh_agent_loop.cli._chat import ASK
from dsh_agent_loop.events import Event

from .helpers import PLUGIN, agent_events, cli, event_data, stored_sessions, tool_errors

#: A command longer than any cut a display could make, with its payload at the end.
LONG = "echo " + " ".join(f"word{n}" for n in range(110)) + "; touch HIDDEN"

#: Two calls that ask under the default policy (no permissions configured anywhere).
CALLS = f"""\
      agents:
        - id: main
          provider: scripted
          model: m
          cwd: .
          tools: [write_file, run_command]{{extra}}
store: sqlite:///chat.db
providers:
  scripted:
    kind: scripted
    replies:
      - tool_calls:
          - {{name: write_file, arguments: {{path: out.txt, content: hi}}}}
          - {{name: run_command, arguments: {{command: "{LONG}"}}}}
      - text: finished
"""
DEFAULT = PLUGIN + CALLS.replace("{extra}", "")
REQUIRED = PLUGIN + CALLS.replace(
    "{extra}", "\n          requireApproval: [write_file, run_command]"
)
#: The same, with a second agent whose turn fails (its script is empty).
FAILING = DEFAULT.replace(
    "store:", "        - {id: other, provider: empty, model: m}\nstore:"
).replace("providers:\n", "providers:\n  empty: {kind: scripted, replies: []}\n")
DELEGATES = (
    PLUGIN
    + """\
      agents:
        - {id: main, provider: parent, model: m, cwd: .}
      subagents:
        - {id: helper, provider: child, model: m, cwd: ., tools: [write_file]}
store: sqlite:///chat.db
providers:
  parent:
    kind: scripted
    replies:
      - tool_calls: [{name: delegate, arguments: {task: write the file}}]
      - text: parent finished
  child:
    kind: scripted
    loop: true
    replies:
      - tool_calls: [{name: write_file, arguments: {path: out.txt, content: from the child}}]
      - text: child finished
"""
)


def sessions(cwd: Path) -> dict[str, tuple[str, list[Event]]]:
    return stored_sessions(cwd / "chat.db")


def events_of(cwd: Path, agent_id: str) -> list[Event]:
    return agent_events(cwd / "chat.db", agent_id)


def write_results(events: list[Event]) -> list[Any]:
    return tool_errors(events, "write_file")


def _waiting_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " is waiting for approval; " in line]


@pytest.mark.parametrize("config", [DEFAULT, REQUIRED], ids=["default-policy", "requireApproval"])
def test_run_lists_each_waiting_call_and_exits_3(tmp_path: Path, config: str) -> None:
    (tmp_path / "run.yaml").write_text(config, encoding="utf-8")
    done = cli("run", "run.yaml", "-q", "-p", "go", cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    (session_id,) = sessions(tmp_path)
    how = f"decide with: dsh-agent chat run.yaml --resume {session_id}"
    write, command = _waiting_lines(done.stderr)
    decide = f"dsh-agent approve {session_id} call-1 --config run.yaml"
    assert write == (
        f'main: write_file {{"path": "out.txt", "content": "hi"}} is waiting for approval; {how};'
        f" or approve with: {decide} (or deny with: {decide.replace('approve', 'deny')})"
    )
    assert command.startswith(f'main: run_command {{"command": "{LONG}"')  # whole, one line
    assert f"; {how}; or approve with: dsh-agent approve {session_id} call-2 " in command
    assert not (tmp_path / "out.txt").exists()
    assert not (tmp_path / "HIDDEN").exists()
    # The printed command asks about them: the first runs, the second is refused. (The new
    # process's script starts over, so the continuation asks for both again: refused too.)
    argv = shlex.split(how.removeprefix("decide with: "))
    assert argv[:2] == ["dsh-agent", "chat"]
    decided = cli(*argv[1:], cwd=tmp_path, stdin="y\nn\nn\nn\n/exit\n")
    assert decided.returncode == 0, decided.stderr
    assert decided.stdout.count(ASK) == 4
    assert "finished" in decided.stdout
    assert (tmp_path / "out.txt").exists()
    assert not (tmp_path / "HIDDEN").exists()
    events = events_of(tmp_path, "main")
    decisions = [d["decision"] for d in event_data(events, "tool/approval")]
    assert decisions == ["approve", "deny", "deny", "deny"]


def test_on_a_memory_store_the_line_says_the_call_is_lost(tmp_path: Path) -> None:
    (tmp_path / "run.yaml").write_text(DEFAULT, encoding="utf-8")
    done = cli("run", "run.yaml", "-q", "-p", "go", "--store", "memory:", cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    lines = _waiting_lines(done.stderr)
    assert len(lines) == 2
    for line in lines:
        assert line.endswith(
            "is waiting for approval; it is lost when run exits, as the memory: store keeps"
            " nothing (give a --store that keeps sessions to decide it with chat, or"
            " --permission-mode deny-asks)"
        )
    assert list(tmp_path.iterdir()) == [tmp_path / "run.yaml"]


def test_a_failed_turn_exits_1_even_with_calls_waiting(tmp_path: Path) -> None:
    (tmp_path / "run.yaml").write_text(FAILING, encoding="utf-8")
    done = cli("run", "run.yaml", "-q", "-p", "go", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "other: a turn ended error" in done.stderr
    assert len(_waiting_lines(done.stderr)) == 2  # still listed
    assert " --agent other " not in done.stderr
    assert "dsh-agent chat run.yaml --resume main-session-" in done.stderr


def test_deny_asks_refuses_what_would_ask_and_the_turn_completes(tmp_path: Path) -> None:
    (tmp_path / "run.yaml").write_text(DEFAULT, encoding="utf-8")
    done = cli("run", "run.yaml", "-q", "-p", "go", "--permission-mode", "deny-asks", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert _waiting_lines(done.stderr) == []
    assert "finished" in done.stdout
    assert not (tmp_path / "out.txt").exists()
    assert not (tmp_path / "HIDDEN").exists()
    events = events_of(tmp_path, "main")
    codes = [(d.get("error") or {}).get("code") for d in event_data(events, "tool/result")]
    assert codes == ["DENIED", "DENIED"]
    assert [d["reason"]["kind"] for d in event_data(events, "turn/end")] == ["completed"]


def test_allow_all_overrides_the_configured_mode_and_keeps_its_rules(tmp_path: Path) -> None:
    config = DEFAULT.replace(
        "      agents:\n",
        "      permissions: {mode: deny-asks, deny: ['run_command(echo *)']}\n      agents:\n",
    )
    first, second = tmp_path / "first", tmp_path / "second"
    for where in (first, second):
        where.mkdir()
        (where / "run.yaml").write_text(config, encoding="utf-8")
    before = cli("run", "run.yaml", "-q", "-p", "go", cwd=first)
    assert before.returncode == 0, before.stderr
    assert not (first / "out.txt").exists()  # deny-asks refused it
    assert write_results(events_of(first, "main")) == ["DENIED"]
    tmp_path = second
    done = cli("run", "run.yaml", "-q", "-p", "go", "--permission-mode", "allow-all", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "hi"
    events = events_of(tmp_path, "main")
    results = {d["message"]["name"]: d for d in event_data(events, "tool/result")}
    assert "error" not in results["write_file"]
    assert results["run_command"]["error"]["code"] == "DENIED"  # the deny rule still holds
    assert "run_command(echo *)" in results["run_command"]["message"]["content"][0]["text"]
    assert not (tmp_path / "HIDDEN").exists()


def test_a_sub_agents_waiting_call_is_listed_and_chat_on_the_parent_asks(tmp_path: Path) -> None:
    (tmp_path / "run.yaml").write_text(DELEGATES, encoding="utf-8")
    done = cli("run", "run.yaml", "-q", "-p", "go", cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    parent = next(sid for sid, (agent, _) in sessions(tmp_path).items() if agent == "main")
    (line,) = _waiting_lines(done.stderr)
    assert line.startswith(
        'main.helper: write_file {"path": "out.txt", "content": "from the child"}'
    )
    assert f"decide with: dsh-agent chat run.yaml --resume {parent}; or approve with:" in line
    decided = cli("chat", "run.yaml", "--resume", parent, cwd=tmp_path, stdin="y\n/exit\n")
    assert decided.returncode == 0, decided.stderr
    assert "main.helper asks to run write_file:" in decided.stdout
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "from the child"
    child = events_of(tmp_path, "main.helper")
    assert write_results(child) == [None]


def test_a_bad_mode_is_a_usage_error_listing_the_modes(tmp_path: Path) -> None:
    (tmp_path / "run.yaml").write_text(DEFAULT, encoding="utf-8")
    for verb in (
        ["run", "run.yaml", "-p", "go"],
        ["chat", "run.yaml"],
        ["simulate", "--agents", "1"],
    ):
        done = cli(*verb, "--permission-mode", "yolo", cwd=tmp_path)
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1
        assert (
            "argument --permission-mode: expected one of ask, accept-edits, allow-all, deny-asks,"
            " got 'yolo'" in done.stderr
        )
    assert not (tmp_path / "chat.db").exists()


def test_help_documents_the_option_and_exit_code_3(tmp_path: Path) -> None:
    done = cli("run", "--help", cwd=tmp_path, COLUMNS="300")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "--permission-mode MODE" in text
    assert "ask, accept-edits, allow-all, deny-asks" in text
    assert "3 tool calls wait for approval" in text
    assert "the first in the order 130, 2, 1, 3 wins" in text


SIMULATED = (
    PLUGIN
    + """\
      permissions: {ask: [sim_tool]}
store: sqlite:///sim.db
"""
)


def test_simulate_takes_the_mode_too(tmp_path: Path) -> None:
    (tmp_path / "sim.yaml").write_text(SIMULATED, encoding="utf-8")
    asks = cli(
        "simulate", "--agents", "2", "--config", "sim.yaml", "--json", "a.json", cwd=tmp_path
    )
    assert asks.returncode == 0, asks.stderr
    assert json.loads((tmp_path / "a.json").read_text())["turn_ends"] == {"awaiting-approval": 2}
    args = ("simulate", "--agents", "2", "--config", "sim.yaml", "--json", "b.json")
    denied = cli(*args, "--store", "memory:", "--permission-mode", "deny-asks", cwd=tmp_path)
    assert denied.returncode == 0, denied.stderr
    summary = json.loads((tmp_path / "b.json").read_text())
    assert summary["turn_ends"] == {"completed": 2}
