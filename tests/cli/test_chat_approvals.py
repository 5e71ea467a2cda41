"""``dsh-agent chat`` asks about each tool call waiting for approval: y, n, always, sub-agents."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from dsh_agent_loop.cli._chat import ASK
from dsh_agent_loop.events import Event

from .helpers import PLUGIN, REQUIRED, Terminal, agent_events, cli, event_data, tool_errors

#: No permissions anywhere: the built-in ``write_file`` asks by default; every turn calls it.
DEFAULT = (
    PLUGIN
    + """\
      agents:
        - {id: main, provider: scripted, model: m, cwd: ., tools: [write_file]}
store: sqlite:///chat.db
providers:
  scripted:
    kind: scripted
    loop: true
    replies:
      - tool_calls: [{name: write_file, arguments: {path: out.txt, content: hi}}]
      - text: finished
"""
)
#: The agent delegates to a sub-agent whose ``write_file`` call waits for approval.
DELEGATES = (
    PLUGIN
    + """\
      agents:
        - {id: main, provider: parent, model: m, cwd: .}
      subagents:
        - id: helper
          provider: child
          model: m
          cwd: .
          tools: [write_file]
          requireApproval: [write_file]
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
LONG = "echo " + " ".join(f"word{n}" for n in range(110)) + "; touch HIDDEN"
COMMAND = (
    PLUGIN
    + f"""\
      agents:
        - id: main
          provider: scripted
          model: m
          cwd: .
          tools: [run_command]
          requireApproval: [run_command]
store: sqlite:///chat.db
providers:
  scripted:
    kind: scripted
    replies:
      - tool_calls: [{{name: run_command, arguments: {{command: "{LONG}"}}}}]
      - text: finished
"""
)
SGR = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def events_of(cwd: Path, agent_id: str) -> list[Event]:
    return agent_events(cwd / "chat.db", agent_id)


def write_results(events: list[Event]) -> list[Any]:
    return tool_errors(events, "write_file")


def test_yes_runs_the_call_after_showing_it(tmp_path: Path) -> None:
    (tmp_path / "chat.yaml").write_text(REQUIRED, encoding="utf-8")
    done = cli("chat", "chat.yaml", cwd=tmp_path, stdin="write it\ny\n/exit\n")
    assert done.returncode == 0, done.stderr
    assert f'main asks to run write_file:\n  path: "out.txt"\n  content: "hi"\n{ASK}y\n' in (
        done.stdout
    )
    assert done.stdout.index(ASK) < done.stdout.index("finished")  # the continuation is shown
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "hi"
    events = events_of(tmp_path, "main")
    kinds = [d["reason"]["kind"] for d in event_data(events, "turn/end")]
    assert kinds == ["awaiting-approval", "completed"]
    (decision,) = event_data(events, "tool/approval")
    assert decision["decision"] == "approve"


def test_no_refuses_the_call_and_the_model_reads_why(tmp_path: Path) -> None:
    (tmp_path / "chat.yaml").write_text(REQUIRED, encoding="utf-8")
    done = cli("chat", "chat.yaml", cwd=tmp_path, stdin="write it\nn\n/exit\n")
    assert done.returncode == 0, done.stderr
    assert "finished" in done.stdout
    assert not (tmp_path / "out.txt").exists()
    events = events_of(tmp_path, "main")
    (decision,) = event_data(events, "tool/approval")
    assert decision["decision"] == "deny"
    assert write_results(events) == ["DENIED"]


def test_an_answer_that_is_not_y_n_or_a_asks_again(tmp_path: Path) -> None:
    (tmp_path / "chat.yaml").write_text(REQUIRED, encoding="utf-8")
    done = cli("chat", "chat.yaml", cwd=tmp_path, stdin="write it\nmaybe\n\nyes please\nY\n/exit\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(ASK) == 4
    assert done.stderr.count("answer y (run it), n (refuse it) or a") == 3
    assert (tmp_path / "out.txt").exists()
    assert len(event_data(events_of(tmp_path, "main"), "tool/approval")) == 1


def test_end_of_input_leaves_the_call_pending(tmp_path: Path) -> None:
    (tmp_path / "chat.yaml").write_text(REQUIRED, encoding="utf-8")
    done = cli("chat", "chat.yaml", cwd=tmp_path, stdin="write it\n")
    assert done.returncode == 0, done.stderr
    assert "the calls stay pending" in done.stdout
    assert not (tmp_path / "out.txt").exists()
    events = events_of(tmp_path, "main")
    assert len(event_data(events, "tool/approval-requested")) == 1
    assert not event_data(events, "tool/result")


def test_always_runs_the_same_call_unasked_for_the_rest_of_the_session_and_after_resume(
    tmp_path: Path,
) -> None:
    (tmp_path / "chat.yaml").write_text(DEFAULT, encoding="utf-8")
    done = cli("chat", "chat.yaml", cwd=tmp_path, stdin="write it\na\nagain\n/session\n/exit\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(ASK) == 1  # the default policy asked once; the second ran unasked
    assert "main: allowed from now on in this session: write_file(out.txt)\n" in done.stdout
    assert done.stdout.count("finished") == 2
    session_id = done.stdout.rsplit("session ", 1)[1].split()[0]
    assert write_results(events_of(tmp_path, "main")) == [None, None]
    resumed = cli("chat", "chat.yaml", "--resume", session_id, cwd=tmp_path, stdin="more\n/exit\n")
    assert resumed.returncode == 0, resumed.stderr
    assert ASK not in resumed.stdout  # the rule is in the session: resume remembers it
    assert "finished" in resumed.stdout
    events = events_of(tmp_path, "main")
    assert write_results(events) == [None, None, None]
    assert len(event_data(events, "tool/approval-requested")) == 1


def test_without_always_the_same_call_asks_again(tmp_path: Path) -> None:
    (tmp_path / "chat.yaml").write_text(DEFAULT, encoding="utf-8")
    done = cli("chat", "chat.yaml", cwd=tmp_path, stdin="write it\ny\nagain\ny\n/exit\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(ASK) == 2
    assert write_results(events_of(tmp_path, "main")) == [None, None]


def test_on_a_terminal_always_is_asked_once_and_remembered(tmp_path: Path) -> None:
    (tmp_path / "chat.yaml").write_text(DEFAULT, encoding="utf-8")
    term = Terminal("chat", "chat.yaml", cwd=tmp_path)
    try:
        term.expect("you> ")
        term.send("write it\r")
        term.expect("main asks to run write_file:")
        term.expect(re.escape(ASK))
        term.send("what\r")
        term.expect("answer y")
        term.expect(re.escape(ASK))
        term.send("a\r")
        term.expect("finished")
        term.expect("you> ")
        term.send("again\r")
        term.expect("finished")
        term.expect("you> ")
        term.send("/exit\r")
        assert term.wait() == 0
    finally:
        term.close()
    assert term.output.count(ASK) == 2  # once, and once more after the bad answer
    assert write_results(events_of(tmp_path, "main")) == [None, None]


def test_a_sub_agents_call_is_asked_about_naming_the_sub_agent(tmp_path: Path) -> None:
    (tmp_path / "chat.yaml").write_text(DELEGATES, encoding="utf-8")
    done = cli("chat", "chat.yaml", cwd=tmp_path, stdin="go\ny\n/exit\n")
    assert done.returncode == 0, done.stderr
    assert 'main.helper asks to run write_file:\n  path: "out.txt"\n' in done.stdout
    assert done.stdout.count(ASK) == 1
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "from the child"
    assert "child finished" in done.stdout  # its continuation ran and was shown
    child = events_of(tmp_path, "main.helper")
    assert event_data(child, "tool/approval")[0]["decision"] == "approve"
    assert [d["reason"]["kind"] for d in event_data(child, "turn/end")][-1] == "completed"


def test_a_long_command_is_shown_whole_in_the_question(tmp_path: Path) -> None:
    assert len(LONG) > 600
    (tmp_path / "chat.yaml").write_text(COMMAND, encoding="utf-8")
    term = Terminal("chat", "chat.yaml", cwd=tmp_path, columns=80)
    try:
        term.expect("you> ")
        term.send("run it\r")
        start = term.expect("main asks to run run_command:").end()
        end = term.expect(re.escape(ASK)).start()
        term.send("n\r")
        term.expect("finished")
        term.expect("you> ")
        term.send("/exit\r")
        assert term.wait() == 0
    finally:
        term.close()
    question = SGR.sub("", term.output[start:end])
    assert "…" not in question
    assert len(question.splitlines()) > 6  # wrapped to the 80 columns, not one long line
    compact = "".join(question.split())
    assert compact.startswith("command:" + "".join(f'"{LONG}"'.split()))
    assert compact.count("HIDDEN") == 1
    assert not (tmp_path / "HIDDEN").exists()
