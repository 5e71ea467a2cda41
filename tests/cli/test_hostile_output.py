"""Control sequences from a model, a tool or a stored session never reach the terminal raw.

The scripted model replies with a clear-screen, a conceal and an OSC 52 clipboard write (plus a
C1 CSI and a bidi override), and calls a tool whose output carries the same; ``run``, ``chat``
and ``sessions show`` must show them as visible text, piped and on a terminal, and ``export``
must write them as JSON escapes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from .helpers import Terminal, cli

HOSTILE_CONFIG = r"""
plugins:
  - name: '@deepseek-ai/dsh-agent-loop'
    config:
      agents:
        - {id: main, provider: evil, model: m}
store: sqlite:///hostile.db
providers:
  evil:
    kind: scripted
    loop: true
    replies:
      - reasoning: "thinking \e[2J about it"
        text: "model-clear\e[2J model-conceal\e[8mhidden-text\e[0m model-clip\e]52;c;cHduZWQ=\a end"
        tool_calls:
          - name: evil
            arguments: {x: "arg\e[2J"}
      - text: "after \x9b2J c1 \u202Ereversed\u202C done\e[?1049h"
"""

EVIL_TOOLS = '''\
from dsh_agent_loop import tool


@tool
async def evil(x: str) -> str:
    """Answer with terminal control sequences."""
    return (
        "tool-clear\\x1b[2J tool-conceal\\x1b[8mtool-hidden"
        " tool-clip\\x1b]52;c;Zm9v\\x07 \\x9b1m"
    )
'''

#: Raw bytes (as characters) no hostile text may put on a terminal: C0 but newline and tab,
#: DEL, C1 and bidi controls. On a pty, ``\r\n`` is the terminal's own newline.
RAW = re.compile("[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]|\r(?!\n)")
SGR = re.compile(r"\x1b\[[0-9;]*m")


def strings(value: Any) -> list[str]:
    """Every string inside a decoded JSON value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return [text for item in value for text in strings(item)]
    return []


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "hostile.yaml").write_text(HOSTILE_CONFIG, encoding="utf-8")
    (tmp_path / "evil_tools.py").write_text(EVIL_TOOLS, encoding="utf-8")
    return tmp_path


def assert_shown_not_sent(output: str) -> None:
    """``output`` holds the hostile text as visible signs and none of it raw."""
    assert "\x1b" not in output
    assert not RAW.search(output), repr(RAW.search(output))
    for visible in (
        "model-clear␛[2J",
        "model-conceal␛[8mhidden-text",
        "model-clip␛]52;c;cHduZWQ=",
        "tool-clear␛[2J",
        "tool-conceal␛[8mtool-hidden",
        "tool-clip␛]52;c;Zm9v",
        "after \\x9b2J c1 \\u202ereversed\\u202c done␛[?1049h",
    ):
        assert visible in output, visible


def test_run_piped_shows_control_sequences_as_text(workdir: Path) -> None:
    done = cli("run", "hostile.yaml", "--tool", "evil_tools:evil", "--prompt", "go", cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert_shown_not_sent(done.stdout)
    assert "thinking ␛[2J about it" in done.stdout  # reasoning too
    assert not RAW.search(done.stderr)
    assert "\x1b" not in done.stderr


def test_run_on_a_terminal_keeps_its_styling_and_nothing_else(workdir: Path) -> None:
    term = Terminal("run", "hostile.yaml", "--tool", "evil_tools:evil", "-p", "go", cwd=workdir)
    try:
        assert term.wait(timeout=60) == 0, term.output
    finally:
        term.close()
    output = term.output
    escapes = re.findall(r"\x1b[^a-zA-Z]*[a-zA-Z]?", output)
    assert escapes, "rich styles a terminal"
    assert all(SGR.fullmatch(e) for e in escapes), [e for e in escapes if not SGR.fullmatch(e)]
    assert all("8" not in e[2:-1].split(";") for e in escapes)  # no conceal
    assert_shown_not_sent(SGR.sub("", output))


def test_chat_shows_control_sequences_as_text(workdir: Path) -> None:
    done = cli(
        "chat", "hostile.yaml", "--tool", "evil_tools:evil", cwd=workdir, stdin="go\n/exit\n"
    )
    assert done.returncode == 0, done.stderr
    assert_shown_not_sent(done.stdout)


def test_stored_hostile_text_is_shown_by_show_and_escaped_by_export(workdir: Path) -> None:
    done = cli("run", "hostile.yaml", "-q", "--tool", "evil_tools:evil", "-p", "go", cwd=workdir)
    assert done.returncode == 0, done.stderr
    session_id = cli("sessions", "list", "--config", "hostile.yaml", cwd=workdir).stdout
    session_id = session_id.split("\t")[0]
    shown = cli("sessions", "show", session_id, "--config", "hostile.yaml", cwd=workdir)
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout
    assert not RAW.search(shown.stdout)
    # Quoted as JSON strings: C0 controls are JSON escapes, the others visible signs.
    assert "model-clear\\u001b[2J" in shown.stdout
    assert "tool-clear\\u001b[2J" in shown.stdout
    assert "after \\x9b2J c1 \\u202ereversed" in shown.stdout
    exported = cli("sessions", "export", session_id, "--config", "hostile.yaml", cwd=workdir)
    assert exported.returncode == 0, exported.stderr
    assert not RAW.search(exported.stdout)
    texts = "\n".join(strings([json.loads(line) for line in exported.stdout.splitlines()]))
    # Escaped, not changed: the decoded JSON holds the sequences as they were stored.
    assert "model-clear\x1b[2J" in texts
    assert "after \x9b2J c1 \u202ereversed" in texts


LOGGING_TOOLS = '''\
import logging

from dsh_agent_loop import tool


@tool
async def evil(x: str) -> str:
    """Log through the library's logger and another library's."""
    logging.getLogger("dsh_agent_loop._tools").warning("own warning\\x1b[2J\\x07 kept")
    logging.getLogger("psycopg").warning("third-party noise\\x1b]52;c;Zm9v\\x07")
    return "logged"
'''


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_log_records_reach_stderr_cleaned_and_others_only_with_debug(
    workdir: Path, debug: bool
) -> None:
    (workdir / "evil_tools.py").write_text(LOGGING_TOOLS, encoding="utf-8")
    more = ["--debug"] if debug else []
    done = cli(
        "run", "hostile.yaml", "-q", "--tool", "evil_tools:evil", "-p", "go", *more, cwd=workdir
    )
    assert done.returncode == 0, done.stderr
    assert not RAW.search(done.stderr)
    assert "\x1b" not in done.stderr
    assert "own warning␛[2J␇ kept" in done.stderr.splitlines()
    assert ("third-party noise␛]52;c;Zm9v␇" in done.stderr) is debug
