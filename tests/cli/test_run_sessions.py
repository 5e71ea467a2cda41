"""``dsh-agent run`` and ``chat`` on named sessions, Ctrl-C as a signal, and ``--tool``."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from pathlib import Path

import trio

from dsh_agent_loop import SqliteStore, invariants
from dsh_agent_loop.events import Event

from .helpers import COMMAND, QUICKSTART, cli, environment

SLOW = """\
plugins:
  - name: '@deepseek-ai/dsh-agent-loop'
    config:
      agents:
        - {id: main, provider: slow, model: m}
store: sqlite:///slow.db
providers:
  slow:
    kind: scripted
    latency_ms: 200
    replies:
      - text: "one two three four five six seven eight nine ten eleven twelve"
"""

TOOLS_MODULE = '''\
from dsh_agent_loop import tool


@tool
async def shout(text: str) -> str:
    """Say it louder."""
    return text.upper() + "!"


not_a_tool = 42
'''

USES_SHOUT = """\
plugins:
  - name: '@deepseek-ai/dsh-agent-loop'
    config:
      agents:
        - {id: main, provider: s, model: m, tools: [list_dir]}
store: sqlite:///tools.db
providers:
  s:
    kind: scripted
    replies:
      - tool_calls: [{name: shout, arguments: {text: hello}}]
      - text: done
"""


def stored(path: Path, session_id: str | None = None) -> dict[str, list[Event]]:
    """Every session in the SQLite file (or just ``session_id``), read back."""

    async def read() -> dict[str, list[Event]]:
        store = SqliteStore(str(path))
        try:
            ids = [session_id] if session_id else [i.session_id for i in await store.list()]
            out = {}
            for sid in ids:
                handle = await store.open(sid, "read")
                out[sid] = await handle.read()
                await handle.close()
            return out
        finally:
            await store.aclose()

    return trio.run(read)


def turn_ends(events: list[Event]) -> list[str]:
    return [
        str(e.data["reason"]["kind"])
        + (":" + e.data["reason"]["cause"] if "cause" in e.data["reason"] else "")
        for e in events
        if e.type == "turn/end"
    ]


def test_sigint_stores_the_aborted_turn_and_exits_130(tmp_path: Path) -> None:
    (tmp_path / "slow.yaml").write_text(SLOW, encoding="utf-8")
    process = subprocess.Popen(
        [*COMMAND, "run", "slow.yaml", "--prompt", "count"],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment(tmp_path),
    )
    try:
        seen = b""
        deadline = time.monotonic() + 30
        assert process.stdout is not None
        while b"two" not in seen:  # the reply is streaming: the turn is open
            assert time.monotonic() < deadline, seen
            ready, _, _ = select.select([process.stdout], [], [], 1.0)
            if ready:
                chunk = os.read(process.stdout.fileno(), 4096)
                assert chunk, f"exited early: {seen!r}"
                seen += chunk
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert b"interrupted: the cancelled turns are stored as aborted" in err
    (events,) = stored(tmp_path / "slow.db").values()
    assert turn_ends(events) == ["aborted:user"]
    message = next(e for e in events if e.type == "assistant/message")
    assert message.data["interrupted"] is True
    assert message.data["message"]["content"][0]["text"].startswith("one two")
    assert "twelve" not in message.data["message"]["content"][0]["text"]
    assert invariants.check(events) == []


def test_session_creates_then_continues_and_resume_needs_an_existing_one(tmp_path: Path) -> None:
    first = cli("run", str(QUICKSTART), "-q", "--session", "my-work", "-p", "hi", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    again = cli("run", str(QUICKSTART), "-q", "--session", "my-work", "-p", "more", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    resumed = cli("run", str(QUICKSTART), "-q", "--resume", "my-work", "-p", "last", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    sessions = stored(tmp_path / "sessions.db")
    assert list(sessions) == ["my-work"]
    events = sessions["my-work"]
    assert turn_ends(events) == ["completed", "completed", "completed"]
    prompts = [
        e.data["message"]["content"][0]["text"]
        for e in events
        if e.type == "user/message" and not e.data["message"].get("source")
    ]
    assert prompts == ["hi", "more", "last"]
    missing = cli("run", str(QUICKSTART), "--resume", "nope", "-p", "x", cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr == "session 'nope' not found in sqlite:///sessions.db\n"
    both = cli("run", str(QUICKSTART), "--session", "a", "--resume", "b", "-p", "x", cwd=tmp_path)
    assert both.returncode == 2
    assert "not allowed with argument" in both.stderr


def test_session_needs_one_agent(tmp_path: Path) -> None:
    two = QUICKSTART.read_text(encoding="utf-8").replace(
        "        - id: main\n",
        "        - id: other\n          provider: demo\n          model: m\n        - id: main\n",
    )
    (tmp_path / "two.yaml").write_text(two, encoding="utf-8")
    done = cli("run", "two.yaml", "--session", "s1", "-p", "hi", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == "--session needs one agent: add --agent ID (declared: other, main)\n"
    one = cli(
        "run", "two.yaml", "--agent", "main", "--session", "s1", "-q", "-p", "hi", cwd=tmp_path
    )
    assert one.returncode == 0, one.stderr
    assert sorted(stored(tmp_path / "sessions.db")) != []
    assert "s1" in stored(tmp_path / "sessions.db")


def test_chat_resume_continues_a_stored_session(tmp_path: Path) -> None:
    first = cli("run", str(QUICKSTART), "-q", "--session", "talk", "-p", "hi", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    done = cli(
        "chat", str(QUICKSTART), "--resume", "talk", cwd=tmp_path, stdin="and then?\n/session\n"
    )
    assert done.returncode == 0, done.stderr
    assert "main on session talk" in done.stdout
    assert "session talk" in done.stdout
    events = stored(tmp_path / "sessions.db", "talk")["talk"]
    assert turn_ends(events) == ["completed", "completed"]
    missing = cli("chat", str(QUICKSTART), "--resume", "nope", cwd=tmp_path, stdin="hi\n")
    assert missing.returncode == 2
    assert "session 'nope' not found in sqlite:///sessions.db" in missing.stderr


def test_tool_option_adds_tools_to_the_runtime_and_listed_agents(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(TOOLS_MODULE, encoding="utf-8")
    (tmp_path / "tools.yaml").write_text(USES_SHOUT, encoding="utf-8")
    done = cli("run", "tools.yaml", "--tool", "mytools:shout", "-p", "go", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "HELLO!" in done.stdout
    (events,) = stored(tmp_path / "tools.db").values()
    (result,) = [e for e in events if e.type == "tool/result"]
    assert "error" not in result.data
    without = cli("run", "tools.yaml", "-p", "go", cwd=tmp_path)
    assert "UNKNOWN_TOOL" in without.stdout


def test_tool_option_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(TOOLS_MODULE, encoding="utf-8")
    for ref, fragment in (
        ("mytools:not_a_tool", "is of type int, not a Tool"),
        ("missing_module:x", "cannot import 'missing_module'"),
        ("mytools", "expected 'package.module:attribute'"),
    ):
        done = cli("run", str(QUICKSTART), "--tool", ref, "-p", "hi", cwd=tmp_path)
        assert done.returncode == 2, ref
        assert done.stderr.startswith("--tool: tool reference"), done.stderr
        assert fragment in done.stderr
        assert len(done.stderr.splitlines()) == 1
    for verb in (["chat", str(QUICKSTART)], ["simulate", "--agents", "1"]):
        done = cli(*verb, "--tool", "mytools:not_a_tool", cwd=tmp_path, stdin="hi\n")
        assert done.returncode == 2, verb
        assert done.stderr.startswith("--tool: tool reference 'mytools:not_a_tool'")
    assert not (tmp_path / "sessions.db").exists()


def test_simulate_honours_config_and_tool(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(TOOLS_MODULE, encoding="utf-8")
    (tmp_path / "sim.yaml").write_text(
        "plugins:\n  - name: '@deepseek-ai/dsh-agent-loop'\n    config:\n"
        "      persona: Simulated persona.\n      agents: [{id: main, provider: p, model: m}]\n"
        "store: sqlite:///from-config.db\nproviders:\n  p: {kind: scripted, replies: []}\n",
        encoding="utf-8",
    )
    done = cli(
        "simulate", "--agents", "2", "--config", "sim.yaml", "--tool", "mytools:shout", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "sim.yaml: its agents (main) are not run" in done.stderr
    sessions = stored(tmp_path / "from-config.db")
    assert sorted(sid.split("-session-")[0] for sid in sessions) == ["sim-0", "sim-1"]
    for events in sessions.values():
        prompt = [e for e in events if e.type == "system/message"]
        assert prompt
        assert prompt[0].data["message"]["content"][0]["text"] == "Simulated persona."
        header = next(e for e in events if e.type == "request/header")
        names = sorted(t["name"] for t in header.data["header"]["tools"])
        assert names == ["shout", "sim_tool"]
