"""``dsh-agent run``: the quick start, prompts, several agents, exit codes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .helpers import QUICKSTART, Terminal, cli

TWO_AGENTS = """\
plugins:
  - name: '@deepseek-ai/dsh-agent-loop'
    config:
      agents:
        - {id: alpha, provider: good, model: m}
        - {id: beta, provider: empty, model: m}
store: sqlite:///two.db
providers:
  good:
    kind: scripted
    replies:
      - text: "first line of alpha\\nsecond line of alpha"
  empty: {kind: scripted, replies: []}
"""


def test_quickstart_streams_text_a_tool_call_and_the_summary(tmp_path: Path) -> None:
    done = cli("run", str(QUICKSTART), "--prompt", "What is in this directory?", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # stderr holds only the closing lines: where the session is, how to show it.
    assert re.fullmatch(
        r"session (main-session-\S+) stored in sqlite:///sessions\.db\n"
        r"show it with: dsh-agent sessions show \1\n",
        done.stderr,
    ), done.stderr
    out = done.stdout
    assert "I should list it before answering." in out  # reasoning
    assert "Let me look at the working directory first." in out  # streamed text
    assert "tool call: list_dir" in out
    assert "result: list_dir" in out
    assert "Those are the entries of the working directory." in out
    assert (tmp_path / "sessions.db").is_file()
    # The closing summary, in the words of ``sessions show``: the totals, then one line per
    # event with dense seqs from 0, and no raw event type anywhere.
    summary = out[out.index("session main-session-") :].splitlines()
    assert summary[1].startswith("1 turn (1 completed) · 2 model calls · 1 tool call")
    rows = [m for m in (re.match(r"\s*(\d+)  (.*)", line) for line in summary) if m]
    assert [int(m.group(1)) for m in rows] == list(range(len(rows)))
    words = [m.group(2) for m in rows]
    assert words[0] == "session opened"
    assert words[-1] == "turn 1 completed"
    assert any(w.startswith("run tool list_dir") for w in words)
    assert any(w.startswith("tool list_dir answered") for w in words)
    assert 'you: "What is in this directory?"' in words
    assert not re.search(r"\b(session/end-seed|turn/end|tool/call|tool/result)\b", out)
    # Panels come in model order: the call before its result, both before the final text.
    assert out.index("tool call: list_dir") < out.index("result: list_dir")
    assert out.index("result: list_dir") < out.index("Those are the entries")


def test_prompt_from_stdin_and_quiet(tmp_path: Path) -> None:
    done = cli("run", str(QUICKSTART), "--quiet", cwd=tmp_path, stdin="piped prompt\n")
    assert done.returncode == 0, done.stderr
    assert "Let me look at the working directory first." in done.stdout
    assert "session opened" not in done.stdout  # --quiet: no summary
    shown = cli("sessions", "list", cwd=tmp_path)
    session_id = shown.stdout.split("\t")[0]
    log = cli("sessions", "show", session_id, cwd=tmp_path)
    assert '"piped prompt"' in log.stdout


def test_prompt_is_required_without_stdin(tmp_path: Path) -> None:
    done = cli("run", str(QUICKSTART), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "--prompt is required" in done.stderr
    assert not (tmp_path / "sessions.db").exists()


def test_several_agents_are_prefixed_and_an_error_turn_exits_1(tmp_path: Path) -> None:
    (tmp_path / "two.yaml").write_text(TWO_AGENTS, encoding="utf-8")
    done = cli("run", "two.yaml", "--prompt", "go", cwd=tmp_path)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert "alpha │ first line of alpha" in lines
    assert "alpha │ second line of alpha" in lines
    assert "SCRIPT_EXHAUSTED" in done.stderr
    assert "beta" in done.stderr
    # Both sessions are summarised; alpha completed, beta ended error.
    assert re.search(r"  turn 1 completed$", done.stdout, re.MULTILINE)
    assert re.search(r"  turn 1 failed: SCRIPT_EXHAUSTED: ", done.stdout)


def test_agent_option_prompts_only_that_agent(tmp_path: Path) -> None:
    (tmp_path / "two.yaml").write_text(TWO_AGENTS, encoding="utf-8")
    done = cli("run", "two.yaml", "--agent", "alpha", "--prompt", "go", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "first line of alpha"  # one agent: no prefix
    unknown = cli("run", "two.yaml", "--agent", "gamma", "--prompt", "go", cwd=tmp_path)
    assert unknown.returncode == 2
    assert unknown.stderr == "two.yaml: no agent 'gamma' (declared: alpha, beta)\n"
    assert not (tmp_path / "two.db").exists() or done.returncode == 0


def test_an_aborted_turn_does_not_fail_the_run(tmp_path: Path) -> None:
    limit = "      maxParallelToolCalls: 4\n"
    text = QUICKSTART.read_text(encoding="utf-8")
    assert limit in text
    text = text.replace(limit, limit + "      turnBudget: {maxSteps: 1}\n")
    (tmp_path / "budget.yaml").write_text(text, encoding="utf-8")
    done = cli("run", "budget.yaml", "--prompt", "look", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert re.search(r"  turn 1 cancelled by a hook$", done.stdout, re.MULTILINE)


@pytest.mark.parametrize("order", ["before", "after"])
def test_common_options_stand_anywhere(tmp_path: Path, order: str) -> None:
    options = ["--store", "sqlite:///elsewhere.db", "--prompt", "hi", "--quiet"]
    args = [*options, str(QUICKSTART)] if order == "before" else [str(QUICKSTART), *options]
    done = cli("run", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "elsewhere.db").is_file()
    assert not (tmp_path / "sessions.db").exists()


def test_user_settings_file_is_read(tmp_path: Path) -> None:
    settings = tmp_path / ".xdg" / "dsh-agent" / "settings.yaml"
    settings.parent.mkdir(parents=True)
    settings.write_text("persona: Persona from the user settings.\n", encoding="utf-8")
    done = cli("run", str(QUICKSTART), "--prompt", "hi", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert re.search(r"  system prompt: \"Persona from the user settings.\"", done.stdout)
    settings.write_text("maxParallelToolCalls: 0\n", encoding="utf-8")
    bad = cli("run", str(QUICKSTART), "--prompt", "hi", cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr == f"{settings}: maxParallelToolCalls: must be a positive integer\n"


def test_ctrl_c_cancels_the_running_turns(tmp_path: Path) -> None:
    text = QUICKSTART.read_text(encoding="utf-8")
    assert "latency_ms: 15\n" in text
    (tmp_path / "slow.yaml").write_text(text.replace("latency_ms: 15\n", "latency_ms: 150\n"))
    term = Terminal("run", "slow.yaml", "--prompt", "look", cwd=tmp_path)
    try:
        term.expect("working")
        term.send("\x03")
        assert term.wait() == 130  # interrupted, as a shell reports Ctrl-C
    finally:
        term.close()
    assert "tool call: list_dir" not in term.output
    assert re.search(r"assistant: .*\[cut off by the cancel\]", term.output)
    assert re.search(r"  turn 1 cancelled by the user", term.output)
    assert "interrupted: the cancelled turns are stored as aborted" in term.output
