"""``dsh-agent chat``: ``/exit`` at an approval question leaves; a line typed while a turn runs is
shown after the prompt when it starts the next turn."""

from __future__ import annotations

import re
from pathlib import Path

from dsh_agent_loop.cli._chat import ASK

from .helpers import PLUGIN, REQUIRED, Terminal, agent_events, cli, event_data

#: The styling the prompt may end with.
SGR = r"(?:\x1b\[[0-9;]*m)*"
SLOW = (
    PLUGIN
    + """\
      agents:
        - {id: main, provider: scripted, model: m}
store: sqlite:///chat.db
providers:
  scripted:
    kind: scripted
    latency_ms: 20
    loop: true
    replies:
      - text: "one two three four five six seven eight nine ten eleven twelve"
"""
)


def test_exit_at_the_question_leaves_with_the_call_pending(tmp_path: Path) -> None:
    (tmp_path / "chat.yaml").write_text(REQUIRED, encoding="utf-8")
    done = cli("chat", "chat.yaml", cwd=tmp_path, stdin="write it\nmaybe\n/exit\nmore\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(ASK) == 2  # "maybe" asked again; "/exit" left
    assert "the calls stay pending" in done.stdout
    assert "you> more" not in done.stdout
    events = agent_events(tmp_path / "chat.db", "main")
    assert event_data(events, "tool/approval") == []
    assert len(event_data(events, "tool/approval-requested")) == 1
    assert [d["reason"]["kind"] for d in event_data(events, "turn/end")] == ["awaiting-approval"]
    assert not (tmp_path / "out.txt").exists()


def test_a_line_typed_during_a_turn_is_shown_when_its_turn_starts(tmp_path: Path) -> None:
    (tmp_path / "chat.yaml").write_text(SLOW, encoding="utf-8")
    term = Terminal("chat", "chat.yaml", cwd=tmp_path)
    try:
        term.expect("you> ")
        term.send("first\rsecond\r")  # the second is typed while the first turn runs
        term.expect("twelve")
        term.expect(rf"you> {SGR}second\r?\n")  # shown again after the prompt, before its turn
        term.expect("twelve")
        term.expect("you> ")
        term.send("/exit\r")
        assert term.wait() == 0
    finally:
        term.close()
    # A line typed at the prompt is echoed by the terminal only (not twice).
    assert not re.search(rf"you> {SGR}first\r?\nfirst", term.output)
