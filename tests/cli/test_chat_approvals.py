"""``dsh-agent chat`` asks y/n for each tool call waiting for approval (issue 12 §6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import cli

CONFIG = """\
plugins:
  - name: '@deepseek-ai/dsh-agent-loop'
    config:
      agents:
        - id: main
          provider: scripted
          model: m
          cwd: .
          tools: [write_file]
          requireApproval: [write_file]
store: sqlite:///chat.db
providers:
  scripted:
    kind: scripted
    replies:
      - tool_calls: [{name: write_file, arguments: {path: out.txt, content: hi}}]
      - text: finished
"""


def exported(cwd: Path) -> list[dict[str, object]]:
    listed = cli("sessions", "list", "--store", "sqlite:///chat.db", cwd=cwd)
    session_id = listed.stdout.splitlines()[-1].split("\t")[0]
    done = cli("sessions", "export", session_id, "--store", "sqlite:///chat.db", cwd=cwd)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()[1:]]


@pytest.mark.parametrize(("answer", "written"), [("y", True), ("n", False)])
def test_chat_asks_before_a_call_that_needs_approval(
    tmp_path: Path, answer: str, written: bool
) -> None:
    (tmp_path / "chat.yaml").write_text(CONFIG, encoding="utf-8")
    done = cli("chat", "chat.yaml", cwd=tmp_path, stdin=f"write it\n{answer}\n/exit\n")
    assert done.returncode == 0, done.stderr
    assert 'allow write_file {"path": "out.txt", "content": "hi"}? [y/n]' in done.stdout
    assert "finished" in done.stdout
    assert (tmp_path / "out.txt").exists() is written
    events = exported(tmp_path)
    kinds = [e["data"]["reason"]["kind"] for e in events if e["type"] == "turn/end"]
    assert kinds == ["awaiting-approval", "completed"]
    decision = next(e["data"] for e in events if e["type"] == "tool/approval")
    assert decision["decision"] == ("approve" if answer == "y" else "deny")


def test_end_of_input_leaves_the_call_pending(tmp_path: Path) -> None:
    (tmp_path / "chat.yaml").write_text(CONFIG, encoding="utf-8")
    done = cli("chat", "chat.yaml", cwd=tmp_path, stdin="write it\n")
    assert done.returncode == 0, done.stderr
    assert "the calls stay pending" in done.stdout
    assert not (tmp_path / "out.txt").exists()
    events = exported(tmp_path)
    assert [e["type"] for e in events].count("tool/approval-requested") == 1
    assert not [e for e in events if e["type"] == "tool/result"]
