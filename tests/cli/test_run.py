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
    assert done.stderr == ""
    out = done.stdout
    assert "I should list it before answering." in out  # reasoning
    assert "Let me look at the working directory first." in out  # streamed text
    assert "tool call: list_dir" in out
    assert "result: list_dir" in out
    assert "Those are the entries of the working directory." in out
    assert (tmp_path / "sessions.db").is_file()
    # The one-line-per-event summary: dense seqs from 0, the prompt, the call, the end.
    summary = out[out.index("session main-session-") :].splitlines()
    rows = [re.match(r"\s*(\d+)  (\S+)", line) for line in summary[1:]]
    assert all(rows), summary
    assert [int(m.group(1)) for m in rows if m] == list(range(len(rows)))
    kinds = [m.group(2) for m in rows if m]
    assert kinds[0] == "session/end-seed"
    assert kinds[-1] == "turn/end"
    assert "tool/call" in kinds
    assert "tool/result" in kinds
    assert '"What is in this directory?"' in out
    assert summary[-1].endswith("completed")
    # Panels come in model order: the call before its result, both before the final text.
    assert out.index("tool call: list_dir") < out.index("result: list_dir")
    assert out.index("result: list_dir") < out.index("Those are the entries")


def test_prompt_from_stdin_and_quiet(tmp_path: Path) -> None:
    done = cli("run", str(QUICKSTART), "--quiet", cwd=tmp_path, stdin="piped prompt\n")
    assert done.returncode == 0, done.stderr
    assert "Let me look at the working directory first." in done.stdout
    assert "session/end-seed" not in done.stdout  # --quiet: no summary
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
    assert re.search(r"turn/end\s+turn 1  completed", done.stdout)
    assert re.search(r"turn/end\s+turn 1  error:SCRIPT_EXHAUSTED", done.stdout)


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
    assert re.search(r"turn/end\s+turn 1  aborted:hook", done.stdout)


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
    assert re.search(r"system/message\s+\"Persona from the user settings.\"", done.stdout)
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
    assert re.search(r"assistant/message .*INTERRUPTED", term.output)
    assert re.search(r"turn/end\s+turn 1  aborted:user", term.output)
    assert "interrupted: the cancelled turns are stored as aborted" in term.output
