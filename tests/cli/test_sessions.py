"""``dsh-agent sessions list | show | check | export`` on stored sessions."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from dsh_agent_loop.events import Event, event_from_json, event_to_json

from .helpers import QUICKSTART, Terminal, cli


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory whose sessions.db holds one quick-start session."""
    path = tmp_path_factory.mktemp("sessions")
    done = cli("run", str(QUICKSTART), "--prompt", "hi", "--quiet", cwd=path)
    assert done.returncode == 0, done.stderr
    return path


@pytest.fixture
def workdir(store_dir: Path, tmp_path: Path) -> Path:
    """A private copy of ``store_dir``."""
    for name in ("sessions.db", "sessions.db-wal", "sessions.db-shm"):
        if (store_dir / name).exists():
            shutil.copy(store_dir / name, tmp_path / name)
    return tmp_path


def only_id(workdir: Path) -> str:
    done = cli("sessions", "list", cwd=workdir)
    (line,) = done.stdout.splitlines()
    return line.split("\t")[0]


def test_list_is_tab_separated_when_piped(workdir: Path) -> None:
    done = cli("sessions", "list", cwd=workdir)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    session_id, agent, events, last = line.split("\t")
    assert re.fullmatch(r"main-session-[0-9a-f-]{36}", session_id)
    assert (agent, last) == ("main", "completed")
    assert int(events) > 10


def test_list_on_a_narrow_terminal_keeps_the_whole_id_on_its_row(workdir: Path) -> None:
    session_id = only_id(workdir)
    term = Terminal("sessions", "list", cwd=workdir, columns=40)
    try:
        assert term.wait() == 0
    finally:
        term.close()
    plain = re.sub(r"\x1b\[[0-9;]*m", "", term.output)
    rows = [line for line in plain.splitlines() if session_id in line]
    assert len(rows) == 1, plain
    assert re.match(rf"{re.escape(session_id)}\s+main\s+\d+\s+completed\s+\S+", rows[0])
    assert "…" not in plain


def test_show_prints_plain_words_and_token_totals(workdir: Path) -> None:
    session_id = only_id(workdir)
    done = cli("sessions", "show", session_id, cwd=workdir)
    assert done.returncode == 0, done.stderr
    head, counts, tokens, *lines = done.stdout.splitlines()
    assert session_id in head
    assert counts == "1 turn (1 completed) · 2 model calls · 1 tool call"
    # The quick-start script reports usage: 30 + 65 tokens in (the listing of the folder,
    # sessions.db and its side files included), 24 + 25 out.
    assert tokens == "tokens: 95 in, 49 out, 144 total"
    assert [int(line.split()[0]) for line in lines] == list(range(len(lines)))
    words = [line.split(None, 1)[1] for line in lines]
    assert 'you: "hi"' in words
    assert 'run tool list_dir {"path":"."}' in words
    assert words[-1] == "turn 1 completed"
    for jargon in ("turn/end", "tool/call", "end-seed", "spliced", "request/header", "seq"):
        assert jargon not in done.stdout


def test_export_writes_the_jsonl_store_format(workdir: Path) -> None:
    session_id = only_id(workdir)
    done = cli("sessions", "export", session_id, cwd=workdir)
    assert done.returncode == 0, done.stderr
    header_line, *event_lines = done.stdout.splitlines()
    header = json.loads(header_line)
    assert header["session_id"] == session_id
    assert header["agent_id"] == "main"
    assert header["format_version"] == 1
    events = [event_from_json(line) for line in event_lines]
    assert [e.seq for e in events] == list(range(len(events)))
    assert events[-1].type == "turn/end"
    # -o FILE: the same bytes, and a JSONL store reads the file as that session.
    (workdir / "dir").mkdir()
    out = workdir / "dir" / f"{session_id}.jsonl"
    to_file = cli("sessions", "export", session_id, "-o", str(out), cwd=workdir)
    assert to_file.returncode == 0
    assert to_file.stdout == ""
    assert out.read_text(encoding="utf-8") == done.stdout
    assert out.stat().st_mode & 0o777 == 0o600  # the session's copy: its owner's only
    listed = cli("sessions", "list", "--store", "jsonl:///dir", cwd=workdir)
    assert listed.stdout.split("\t")[:3] == [session_id, "main", str(len(events))]
    checked = cli("sessions", "check", session_id, "--store", "jsonl:///dir", cwd=workdir)
    assert checked.returncode == 0, checked.stdout


def test_check_passes_on_a_good_log_and_fails_on_a_broken_one(workdir: Path) -> None:
    session_id = only_id(workdir)
    good = cli("sessions", "check", session_id, cwd=workdir)
    assert good.returncode == 0
    assert "no violations" in good.stdout
    # A log whose model tool call never got a tool/call nor a tool/result.
    call = {"type": "tool-call", "call_id": "c1", "name": "list_dir", "arguments": "{}"}
    datas = [
        ("session/end-seed", {}),
        ("turn/start", {"turn": 1}),
        ("step/start", {"turn": 1, "step": 1}),
        (
            "assistant/message",
            {"turn": 1, "step": 1, "message": {"role": "assistant", "content": [call]}},
        ),
        ("step/end", {"turn": 1, "step": 1}),
        ("turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
    ]
    header = {"session_id": "broken", "agent_id": "x", "created_at": "2026", "format_version": 1}
    lines = [json.dumps(header)]
    lines += [event_to_json(Event(t, i, 0.0, d)) for i, (t, d) in enumerate(datas)]
    (workdir / "bad").mkdir()
    (workdir / "bad" / "broken.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    bad = cli("sessions", "check", "broken", "--store", "jsonl:///bad", cwd=workdir)
    assert bad.returncode == 1
    assert "tool-call" in bad.stdout
    assert "1 violation" in bad.stdout or "violations" in bad.stdout


@pytest.mark.parametrize("verb", ["show", "check", "export"])
def test_an_unknown_id_exits_2(workdir: Path, verb: str) -> None:
    done = cli("sessions", verb, "no-such-id", cwd=workdir)
    assert done.returncode == 2
    assert done.stderr == "session 'no-such-id' not found in sqlite:///sessions.db\n"
    assert done.stdout == ""


def test_a_missing_store_is_empty_and_not_created(tmp_path: Path) -> None:
    listed = cli("sessions", "list", cwd=tmp_path)
    assert (listed.returncode, listed.stdout) == (0, "")
    shown = cli("sessions", "show", "x", "--store", "sqlite:///none.db", cwd=tmp_path)
    assert shown.returncode == 2
    assert shown.stderr == "session 'x' not found in sqlite:///none.db\n"
    assert list(tmp_path.iterdir()) == []


def test_store_and_config_options_stand_anywhere(workdir: Path) -> None:
    (workdir / "other").mkdir()
    for name in ("sessions.db", "sessions.db-wal", "sessions.db-shm"):
        if (workdir / name).exists():
            shutil.move(workdir / name, workdir / "other" / name)
    store = "sqlite:///other/sessions.db"
    before = cli("sessions", "--store", store, "list", cwd=workdir)
    after = cli("sessions", "list", "--store", store, cwd=workdir)
    outside = cli("--store", store, "sessions", "list", cwd=workdir)
    assert before.returncode == after.returncode == outside.returncode == 0
    assert before.stdout == after.stdout == outside.stdout
    assert before.stdout.startswith("main-session-")
    session_id = before.stdout.split("\t")[0]
    (workdir / "c.yaml").write_text(f"store: {store}\n", encoding="utf-8")
    a = cli("sessions", "show", "--config", "c.yaml", session_id, cwd=workdir)
    b = cli("sessions", "show", session_id, "--config", "c.yaml", cwd=workdir)
    assert a.returncode == b.returncode == 0
    assert a.stdout == b.stdout
    assert not (workdir / "sessions.db").exists()


def _jsonl_session(directory: Path, session_id: str, created: str, **links: object) -> None:
    header = {
        "session_id": session_id,
        "agent_id": session_id.split("-")[0],
        "created_at": created,
        "format_version": 1,
        **links,
    }
    seed = event_to_json(Event("session/end-seed", 0, 0.0, {}))
    (directory / f"{session_id}.jsonl").write_text(
        json.dumps(header) + "\n" + seed + "\n", encoding="utf-8"
    )


def test_list_tree_puts_children_and_forks_under_their_origin(tmp_path: Path) -> None:
    store = tmp_path / "tree"
    store.mkdir()
    _jsonl_session(store, "main-1", "2026-01-01T00:00:01")
    _jsonl_session(store, "helper-1", "2026-01-01T00:00:02", parent_session_id="main-1")
    _jsonl_session(store, "deep-1", "2026-01-01T00:00:03", parent_session_id="helper-1")
    _jsonl_session(
        store, "fork-1", "2026-01-01T00:00:04", forked_from={"session_id": "main-1", "at_seq": 1}
    )
    _jsonl_session(store, "orphan-1", "2026-01-01T00:00:05", parent_session_id="gone")
    _jsonl_session(store, "other-1", "2026-01-01T00:00:00")
    done = cli("sessions", "list", "--tree", "--store", "jsonl:///tree", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = [line.split("\t") for line in done.stdout.splitlines()]
    assert [(r[0], r[-1]) for r in rows] == [
        ("other-1", "-"),
        ("main-1", "-"),
        ("  helper-1", "child"),
        ("    deep-1", "child"),
        ("  fork-1", "fork of main-1@1"),
        ("orphan-1", "child"),
    ]
    flat = cli("sessions", "list", "--store", "jsonl:///tree", cwd=tmp_path)
    assert [line.split("\t")[0] for line in flat.stdout.splitlines()] == [
        "other-1",
        "main-1",
        "helper-1",
        "deep-1",
        "fork-1",
        "orphan-1",
    ]
    term = Terminal("sessions", "list", "--tree", "--store", "jsonl:///tree", cwd=tmp_path)
    try:
        assert term.wait() == 0
    finally:
        term.close()
    shown = re.sub(r"\x1b\[[0-9;]*m", "", term.output)
    assert re.search(r"^SESSION +AGENT +EVENTS +LAST TURN END +LINK", shown, re.MULTILINE)
    assert re.search(r"^    deep-1 +deep +1 +- +child\r?$", shown, re.MULTILINE), shown
