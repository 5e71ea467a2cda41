"""``dsh-agent chat`` on a pseudo-terminal: Ctrl-C cancels a streaming turn, then exits."""

from __future__ import annotations

import json
from pathlib import Path

from .helpers import Terminal, cli

WORDS = " ".join(f"word{n}" for n in range(1, 41))
CHAT = f"""\
plugins:
  - name: '@deepseek-ai/dsh-agent-loop'
    config:
      agents:
        - {{id: main, provider: slow, model: m}}
store: sqlite:///chat.db
providers:
  slow:
    kind: scripted
    latency_ms: 150
    loop: true
    replies:
      - text: "{WORDS}"
"""
QUICK = CHAT.replace("latency_ms: 150", "latency_ms: 1").replace(WORDS, "pong")


def exported(cwd: Path, session_id: str) -> list[dict[str, object]]:
    done = cli("sessions", "export", session_id, "--store", "sqlite:///chat.db", cwd=cwd)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()[1:]]


def test_ctrl_c_cancels_the_turn_keeps_the_text_and_a_second_one_exits(tmp_path: Path) -> None:
    (tmp_path / "chat.yaml").write_text(CHAT, encoding="utf-8")
    term = Terminal("chat", "chat.yaml", cwd=tmp_path)
    try:
        session_id = term.expect(r"main on session (\S+)").group(1)
        term.expect("you> ")
        term.send("hello there\r")
        term.expect("word3 ")
        term.send("\x03")
        term.expect("cancelling the turn")
        term.expect("turn aborted:user: what was shown is kept")
        term.expect("you> ")
        term.send("\x03")
        assert term.wait() == 0
    finally:
        term.close()
    assert "word40" not in term.output
    events = exported(tmp_path, session_id)
    anchors = [e for e in events if e["type"] == "assistant/message"]
    assert len(anchors) == 1
    data = anchors[0]["data"]
    assert isinstance(data, dict)
    assert data["interrupted"] is True
    (block,) = data["message"]["content"]
    assert block["text"].startswith("word1 word2 word3 ")
    assert WORDS.startswith(block["text"])
    assert len(block["text"]) < len(WORDS)
    ends = [e["data"]["reason"] for e in events if e["type"] == "turn/end"]  # type: ignore[index]
    assert ends == [{"kind": "aborted", "cause": "user"}]
    checked = cli("sessions", "check", session_id, "--store", "sqlite:///chat.db", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout


def test_two_quick_ctrl_c_exit_while_the_turn_runs(tmp_path: Path) -> None:
    (tmp_path / "chat.yaml").write_text(CHAT, encoding="utf-8")
    term = Terminal("chat", "chat.yaml", cwd=tmp_path)
    try:
        session_id = term.expect(r"main on session (\S+)").group(1)
        term.expect("you> ")
        term.send("hello\r")
        term.expect("word2 ")
        term.send("\x03")
        term.expect("cancelling the turn")
        term.send("\x03")
        assert term.wait() == 0
    finally:
        term.close()
    events = exported(tmp_path, session_id)
    assert events[-1]["type"] == "turn/end"
    assert any(e["type"] == "assistant/message" for e in events)


def test_new_resume_and_exit(tmp_path: Path) -> None:
    (tmp_path / "chat.yaml").write_text(QUICK, encoding="utf-8")
    term = Terminal("chat", "chat.yaml", cwd=tmp_path)
    try:
        first = term.expect(r"main on session (\S+)").group(1)
        term.expect("you> ")
        term.send("ping\r")
        term.expect("pong")
        term.expect("you> ")
        term.send("/new\r")
        second = term.expect(r"new session (\S+)").group(1)
        assert second != first
        term.expect("you> ")
        term.send("/resume no-such-session\r")
        term.expect("session 'no-such-session' not found in sqlite:///chat.db")
        term.expect("you> ")
        term.send(f"/resume {first}\r")
        term.expect(rf"resumed session {first} \(\d+ events\)")
        term.expect("you> ")
        term.send("ping again\r")
        term.expect("pong")
        term.expect("you> ")
        term.send("/exit\r")
        assert term.wait() == 0
    finally:
        term.close()
    listed = cli("sessions", "list", "--store", "sqlite:///chat.db", cwd=tmp_path)
    ids = {line.split("\t")[0] for line in listed.stdout.splitlines()}
    assert first in ids
    turns = [e for e in exported(tmp_path, first) if e["type"] == "turn/end"]
    assert len(turns) == 2  # "ping", then "ping again" after /resume


def test_chat_reads_piped_lines_without_a_config(tmp_path: Path) -> None:
    done = cli("chat", "--store", "memory:", cwd=tmp_path, stdin="hello echo\n/exit\n")
    assert done.returncode == 0, done.stderr
    assert "(echo) hello echo" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_compact_summarises_the_older_turns(tmp_path: Path) -> None:
    config = QUICK.replace(
        "      agents:\n", "      compaction: {keepRecentTurns: 1}\n      agents:\n"
    )
    (tmp_path / "chat.yaml").write_text(config, encoding="utf-8")
    lines = "/compact\none\ntwo\n/compact keep numbers\n/session\n/exit\n"
    done = cli("chat", "chat.yaml", cwd=tmp_path, stdin=lines)
    assert done.returncode == 0, done.stderr
    assert "nothing to compact yet" in done.stdout
    assert "compacted seqs" in done.stdout
    session_id = done.stdout.split("session ")[-1].split()[0]
    events = exported(tmp_path, session_id)
    summaries = [
        e
        for e in events
        if e["type"] == "user/message" and e["data"]["message"].get("source") == "compaction"
    ]
    assert len(summaries) == 1
    assert summaries[0]["surface_op"]["op"] == "replace"
