"""``sessions show`` hides nothing: compactions, every model call, approvals, forks, the tree.

Each test runs ``dsh-agent`` in a subprocess on a store written by the CLI itself (or, for a
fork, by the library), and reads what a person would read.
"""

from __future__ import annotations

import re
from pathlib import Path

import trio

from dsh_agent_loop import AgentOptions, Reply, ScriptedModel, SqliteStore, open_runtime
from dsh_agent_loop.events import Event, event_to_json

from .helpers import Terminal, agent_events, cli

PLUGIN = "plugins:\n  - name: '@deepseek-ai/dsh-agent-loop'\n    config:\n"
#: A window so small that every turn after the second compacts what came before it.
COMPACTING = (
    PLUGIN
    + """\
      compaction: {triggerRatio: 0.5, keepRecentTurns: 1}
      agents:
        - {id: main, provider: s, model: m}
store: sqlite:///c.db
providers:
  s:
    kind: scripted
    context_window: 200
    loop: true
    replies:
      - text: "A long answer that fills the window with many words, again and again and again."
"""
)
#: A call that waits for a person's approval (``run`` exits 3).
ASKING = (
    PLUGIN
    + """\
      agents:
        - {id: main, provider: s, model: m, cwd: ., tools: [write_file]}
store: sqlite:///a.db
providers:
  s:
    kind: scripted
    replies:
      - tool_calls: [{name: write_file, arguments: {path: out.txt, content: hi}}]
      - text: written
"""
)


def _numbered(stdout: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^\s*\d+  (.*)$", stdout, re.MULTILINE)]


def test_a_compaction_and_its_summary_call_are_shown_and_counted(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(COMPACTING, encoding="utf-8")
    for n in range(5):
        prompt = f"question {n} with enough padding words to grow the history quickly"
        done = cli("run", "c.yaml", "-q", "--session", "s1", "-p", prompt, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    events = agent_events(tmp_path / "c.db", "main")
    records = [e for e in events if e.type == "context/compaction"]
    assert len(records) >= 2
    assert all(e.ignorable for e in records)
    answers = [e for e in events if e.type == "assistant/message"]
    assert len(answers) == 5  # the summary calls are not assistant messages

    shown = cli("sessions", "show", "s1", "--store", "sqlite:///c.db", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    # Every call the runtime made, each with its tokens: the answers and the summaries.
    n = len(records)
    assert shown.stdout.splitlines()[1] == (
        f"5 turns (5 completed) · {5 + n} model calls ({n} for compaction) · 0 tool calls"
        f" · {n} compactions"
    )
    used = [e.data["usage"] for e in answers] + [e.data["call"]["usage"] for e in records]
    tokens_in = sum(u["input_tokens"] for u in used)
    tokens_out = sum(u["output_tokens"] for u in used)
    assert f"tokens: {tokens_in:,} in, {tokens_out:,} out," in shown.stdout
    lines = _numbered(shown.stdout)
    for record in records:
        data = record.data
        summary = events[data["summary_seq"]]
        op = summary.surface_op
        assert (op["start_seq"], op["end_seq"]) == (data["start_seq"], data["end_seq"])
        line = lines[summary.seq]
        assert line.startswith(
            f"compaction: events {data['start_seq']}..{data['end_seq']} replaced by a summary, "
            f"{data['tokens_before']:,} → {data['tokens_after']:,} tokens: "
        ), line
        usage = data["call"]["usage"]
        assert lines[record.seq] == (
            f"summary call for the compaction at {summary.seq}: s/m "
            f"[{usage['input_tokens']:,} in, {usage['output_tokens']:,} out]"
        )
    assert not any(line.startswith('you: "[Summary') for line in lines)
    checked = cli("sessions", "check", "s1", "--store", "sqlite:///c.db", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout


def test_a_call_waiting_for_approval_reads_as_waiting_in_show_and_list(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(ASKING, encoding="utf-8")
    done = cli("run", "a.yaml", "-q", "--session", "s1", "-p", "write it", cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    shown = cli("sessions", "show", "s1", "--store", "sqlite:///a.db", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "waiting for approval: 1 tool call" in out.splitlines()[:4]
    assert re.search(
        r"^  call-1: write_file \{\"path\": \"out.txt\", \"content\": \"hi\"\}; "
        r"decide with: dsh-agent approve s1 call-1 --store sqlite:///a.db "
        r"\(or deny: dsh-agent deny s1 call-1 --store sqlite:///a.db\)$",
        out,
        re.MULTILINE,
    ), out
    lines = _numbered(out)
    assert 'tool write_file {"path":"out.txt","content":"hi"} is waiting for approval' in lines
    assert 'waiting for approval: write_file {"path": "out.txt", "content": "hi"} (call-1)' in (
        lines
    )
    assert lines[-1] == "turn 1 stopped to wait for approval of 1 tool call"
    assert "1 turn (1 stopped for approval)" in out
    assert "tool/approval-requested" not in out
    # Given the config, the printed command names it (its providers run the continuation),
    # and it decides the call as printed.
    with_config = cli("sessions", "show", "s1", "--config", "a.yaml", cwd=tmp_path)
    printed = re.search(r"decide with: (dsh-agent approve [^(]+) \(or deny: ", with_config.stdout)
    assert printed is not None, with_config.stdout
    assert printed.group(1) == "dsh-agent approve s1 call-1 --config a.yaml"
    decided = cli(*printed.group(1).split()[1:], cwd=tmp_path)
    # (3: the scripted model, fresh in this process, starts its script over and asks again)
    assert decided.returncode in (0, 3), decided.stderr
    assert "approved" in decided.stdout
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "hi"
    assert "awaiting-approval" not in out

    listed = cli("sessions", "list", "--store", "sqlite:///a.db", cwd=tmp_path)
    assert listed.stdout.split("\t")[3] == "waiting for approval (1 call)\n"
    tree = cli("sessions", "list", "--tree", "--store", "sqlite:///a.db", cwd=tmp_path)
    assert tree.stdout.split("\t")[3] == "waiting for approval (1 call)"


def test_decisions_read_as_words(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(ASKING, encoding="utf-8")
    assert cli("run", "a.yaml", "-q", "--session", "s1", "-p", "go", cwd=tmp_path).returncode == 3
    chat = cli("chat", "a.yaml", "--resume", "s1", stdin="a\n/exit\n", cwd=tmp_path)
    assert chat.returncode == 0, chat.stderr
    shown = cli("sessions", "show", "s1", "--store", "sqlite:///a.db", cwd=tmp_path)
    lines = _numbered(shown.stdout)
    assert "always allowed from now on: write_file(out.txt)" in lines
    assert "approved: write_file (call-1)" in lines
    assert 'approval asked: write_file {"path": "out.txt", "content": "hi"} (call-1)' in lines
    assert 'tool write_file {"path":"out.txt","content":"hi"} needs approval' in lines
    assert "waiting for approval" not in shown.stdout
    assert "\t" not in shown.stdout
    assert "permissions/allowed" not in shown.stdout
    listed = cli("sessions", "list", "--store", "sqlite:///a.db", cwd=tmp_path)
    assert listed.stdout.split("\t")[3] == "completed\n"


def test_a_forks_first_request_says_it_is_a_fork(tmp_path: Path) -> None:
    async def make() -> None:
        model = ScriptedModel([Reply.text("one"), Reply.text("two")])
        store = SqliteStore(str(tmp_path / "f.db"))
        async with open_runtime(store=store, providers={"s": model}) as rt:
            options = AgentOptions(id="main", provider="s", model="m")
            handle = await rt.agents.create(session_id="src", options=options)
            await handle.agent.run("first")
            await handle.dispose()
            fork = await rt.agents.fork("src", new_session_id="forked")
            await fork.agent.run("second")

    trio.run(make)
    shown = cli("sessions", "show", "forked", "--store", "sqlite:///f.db", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    head, *_ = shown.stdout.splitlines()
    assert re.search(r"  fork of src@\d+$", head), head
    lines = _numbered(shown.stdout)
    settings = [line for line in lines if line.startswith("model settings")]
    assert settings[0] == "model settings (first request): s/m, 0 tools"  # the source's
    assert settings[1] == "model settings (first request of this fork): s/m, 0 tools"
    source = cli("sessions", "show", "src", "--store", "sqlite:///f.db", cwd=tmp_path)
    assert "fork" not in source.stdout


def _jsonl(directory: Path, session_id: str, created: str, **links: object) -> None:
    import json

    header = {"session_id": session_id, "agent_id": session_id.rsplit("-session-", 1)[0]}
    header.update(created_at=created, format_version=1, **links)
    seed = event_to_json(Event("session/end-seed", 0, 0.0, {}))
    path = directory / f"{session_id}.jsonl"
    path.write_text(json.dumps(header) + "\n" + seed + "\n", encoding="utf-8")


def test_the_tree_never_breaks_a_word_on_an_80_column_terminal(tmp_path: Path) -> None:
    store = tmp_path / "tree"
    store.mkdir()
    agent = "main"
    ids = []
    parent = None
    for depth in range(8):  # a sub-agent's id is its parent's plus .sub: 77 columns at 7
        session_id = f"{agent}-session-{depth:08d}-0000-4000-8000-000000000000"
        links = {"parent_session_id": parent} if parent else {}
        _jsonl(store, session_id, f"2026-01-01T00:00:{depth:02d}", **links)
        ids.append(session_id)
        parent, agent = session_id, f"{agent}.sub"
    assert max(len(i) for i in ids) <= 80
    term = Terminal(
        "sessions", "list", "--tree", "--store", "jsonl:///tree", cwd=tmp_path, columns=80
    )
    try:
        assert term.wait() == 0
    finally:
        term.close()
    shown = re.sub(r"\x1b\[[0-9;]*m", "", term.output).replace("\r", "")
    lines = [line for line in shown.split("\n") if line]
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    words = {word for line in lines for word in line.split()}
    assert set(ids) <= words  # each id whole on one line, never cut by the terminal
    for depth in range(8):
        assert f"agent {'main' + '.sub' * depth}" in shown
    # Two columns a level, until the id would no longer fit: then the details say the level.
    indents = [len(line) - len(line.lstrip()) for line in lines if line.strip() in ids]
    assert indents == [min(2 * depth, 80 - len(i)) for depth, i in enumerate(ids)]
    assert indents[-1] < 2 * 7
    assert "level 7 of the tree" in shown
