"""``dsh-agent approve`` / ``deny`` decide calls waiting in a stored session; ``run --resume`` on
such a session says so and exits 3 without queueing its prompt."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from dsh_agent_loop.events import Event

from .helpers import PLUGIN, agent_events, cli, event_data, stored_sessions, tool_errors

#: Two calls that ask under the default policy (no permissions configured anywhere).
TWO_CALLS = (
    PLUGIN
    + """\
      agents:
        - id: main
          provider: scripted
          model: m
          cwd: .
          tools: [write_file, run_command]
store: sqlite:///chat.db
providers:
  scripted:
    kind: scripted
    replies:
      - tool_calls:
          - {name: write_file, arguments: {path: out.txt, content: hi}}
          - {name: run_command, arguments: {command: "echo ran > RAN"}}
      - text: finished
"""
)
#: The same agent, for the process that decides: its script starts with the continuation's reply
#: (a new process starts a scripted model's replies over).
DECIDES = TWO_CALLS.replace("    replies:\n", "    replies:\n      - text: all done\n", 1)
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
    replies:
      - tool_calls: [{name: write_file, arguments: {path: out.txt, content: from the child}}]
      - text: child finished
"""
)
DELEGATE_DECIDES = DELEGATES.replace(
    "  child:\n    kind: scripted\n    replies:\n",
    "  child:\n    kind: scripted\n    replies:\n      - text: child done\n",
)


def waiting_session(tmp_path: Path, config: str = TWO_CALLS) -> str:
    """Run once (exit 3: calls wait) and write the deciding config; the session id."""
    (tmp_path / "run.yaml").write_text(config, encoding="utf-8")
    decides = DELEGATE_DECIDES if config == DELEGATES else DECIDES
    (tmp_path / "decide.yaml").write_text(decides, encoding="utf-8")
    done = cli("run", "run.yaml", "-q", "-p", "go", cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    return next(sid for sid, (agent, _) in sessions(tmp_path).items() if agent == "main")


def sessions(cwd: Path) -> dict[str, tuple[str, list[Event]]]:
    return stored_sessions(cwd / "chat.db")


def events_of(cwd: Path, agent_id: str = "main") -> list[Event]:
    return agent_events(cwd / "chat.db", agent_id)


def kinds(events: list[Event]) -> list[Any]:
    return [d["reason"]["kind"] for d in event_data(events, "turn/end")]


def waiting_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " is waiting for approval; " in line]


def test_approve_all_runs_the_calls_and_the_continuation(tmp_path: Path) -> None:
    session_id = waiting_session(tmp_path)
    assert not (tmp_path / "out.txt").exists()
    done = cli("approve", session_id, "--all", "--config", "decide.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "hi"
    assert (tmp_path / "RAN").exists()
    assert "approved main's call call-1 of write_file" in done.stdout
    assert "all done" in done.stdout  # the continuation, streamed
    assert f"session {session_id}" in done.stdout  # then summarised, as run does
    events = events_of(tmp_path)
    assert kinds(events) == ["awaiting-approval", "completed"]
    assert [d["decision"] for d in event_data(events, "tool/approval")] == ["approve", "approve"]
    assert waiting_lines(done.stderr) == []
    closing = done.stderr.splitlines()[-2:]  # it ends as run and chat do
    assert closing[0].startswith(f"session {session_id} stored in sqlite:///")
    assert closing[1].startswith(f"show it with: dsh-agent sessions show {session_id}")


def test_deny_with_a_message_refuses_and_the_model_reads_it(tmp_path: Path) -> None:
    session_id = waiting_session(tmp_path)
    done = cli(
        "deny", session_id, "call-1", "call-2", "-m", "not today", "--config", "decide.yaml",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "out.txt").exists()
    assert not (tmp_path / "RAN").exists()
    events = events_of(tmp_path)
    assert tool_errors(events, "write_file") == ["DENIED"]
    assert tool_errors(events, "run_command") == ["DENIED"]
    texts = [d["message"]["content"][0]["text"] for d in event_data(events, "tool/result")]
    assert texts == ["Error: tool call denied: not today"] * 2
    assert kinds(events) == ["awaiting-approval", "completed"]


def test_deciding_one_of_two_exits_3_with_the_commands_that_decide_the_other(
    tmp_path: Path,
) -> None:
    session_id = waiting_session(tmp_path)
    done = cli("approve", session_id, "call-1", "--config", "decide.yaml", cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert not (tmp_path / "out.txt").exists()  # the continuation waits for every decision
    (line,) = waiting_lines(done.stderr)
    assert line.startswith('main: run_command {"command": "echo ran > RAN"')
    deny = f"dsh-agent deny {session_id} call-2 --config decide.yaml"
    assert line.endswith(
        f"approve with: dsh-agent approve {session_id} call-2 --config decide.yaml"
        f" (or deny with: {deny})"
    )
    finished = cli(*shlex.split(deny)[1:], cwd=tmp_path)  # the printed command, as given
    assert finished.returncode == 0, finished.stderr
    assert (tmp_path / "out.txt").exists()
    assert not (tmp_path / "RAN").exists()
    events = events_of(tmp_path)
    assert [d["decision"] for d in event_data(events, "tool/approval")] == ["approve", "deny"]
    assert kinds(events) == ["awaiting-approval", "completed"]


def test_an_unknown_call_id_exits_2_listing_the_waiting_ids_and_decides_nothing(
    tmp_path: Path,
) -> None:
    session_id = waiting_session(tmp_path)
    before = len(events_of(tmp_path))
    done = cli("approve", session_id, "call-1", "nope", "--config", "decide.yaml", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"no tool call 'nope' waits for approval in session '{session_id}'; waiting:"
        " call-1 (main: write_file), call-2 (main: run_command)"
    )
    assert len(events_of(tmp_path)) == before  # not even resumed
    assert not (tmp_path / "out.txt").exists()


def test_an_unknown_session_or_no_call_is_a_usage_error(tmp_path: Path) -> None:
    session_id = waiting_session(tmp_path)
    missing = cli("deny", "no-such-session", "--all", "--config", "decide.yaml", cwd=tmp_path)
    assert missing.returncode == 2
    assert "session 'no-such-session' not found in sqlite:///chat.db" in missing.stderr
    neither = cli("approve", session_id, "--config", "decide.yaml", cwd=tmp_path)
    assert neither.returncode == 2
    assert "name the calls (CALL_ID ...) or give --all" in neither.stderr
    both = cli("approve", session_id, "call-1", "--all", "--config", "decide.yaml", cwd=tmp_path)
    assert both.returncode == 2
    assert (
        cli("approve", session_id, "--all", "--config", "decide.yaml", cwd=tmp_path).returncode == 0
    )
    again = cli("approve", session_id, "--all", "--config", "decide.yaml", cwd=tmp_path)
    assert again.returncode == 2
    assert f"session '{session_id}' has no tool calls waiting for approval" in again.stderr


def test_approve_always_records_the_rule(tmp_path: Path) -> None:
    session_id = waiting_session(tmp_path)
    done = cli("approve", session_id, "--all", "--always", "--config", "decide.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "main: allowed from now on in this session: write_file(out.txt)" in done.stdout
    rules = [d["rule"] for d in event_data(events_of(tmp_path), "permissions/allowed")]
    assert rules == ["write_file(out.txt)", "run_command(echo ran > RAN)"]


def test_a_sub_agents_call_is_decided_with_the_parent_session(tmp_path: Path) -> None:
    parent = waiting_session(tmp_path, DELEGATES)
    done = cli("approve", parent, "--all", "--config", "decide.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "approved main.helper's call" in done.stdout
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "from the child"
    child = events_of(tmp_path, "main.helper")
    assert tool_errors(child, "write_file") == [None]
    assert kinds(child) == ["awaiting-approval", "completed"]


def test_run_resume_on_a_waiting_session_exits_3_and_queues_nothing(tmp_path: Path) -> None:
    session_id = waiting_session(tmp_path)
    before = events_of(tmp_path)
    done = cli("run", "run.yaml", "-q", "-p", "and more", "--resume", session_id, cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert (
        f"session {session_id} has tool calls waiting for approval, so the prompt was not queued"
        in done.stderr
    )
    write, command = waiting_lines(done.stderr)
    approve = f"dsh-agent approve {session_id} call-1 --config run.yaml"
    assert write == (
        f'main: write_file {{"path": "out.txt", "content": "hi"}} is waiting for approval;'
        f" approve with: {approve} (or deny with: {approve.replace('approve', 'deny')})"
    )
    assert command.startswith('main: run_command {"command": "echo ran > RAN"')
    assert f"dsh-agent deny {session_id} call-2 --config run.yaml" in command
    assert events_of(tmp_path) == before  # nothing appended, not even a resume
    # ``--session`` names an existing session the same way.
    same = cli("run", "run.yaml", "-q", "-p", "more", "--session", session_id, cwd=tmp_path)
    assert same.returncode == 3, same.stderr
    assert events_of(tmp_path) == before
    # Once decided, run --resume queues its prompt again.
    assert cli("deny", session_id, "--all", "--config", "decide.yaml", cwd=tmp_path).returncode == 0
    later = cli("run", "decide.yaml", "-q", "-p", "next", "--resume", session_id, cwd=tmp_path)
    assert later.returncode == 0, later.stderr
    assert "next" in [
        d["message"]["content"][0]["text"] for d in event_data(events_of(tmp_path), "user/message")
    ]
