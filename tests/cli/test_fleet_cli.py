"""The fleet's verbs as a user runs them: ``worker``, ``send``, ``cancel``, ``fleet status``,
and ``approve``/``deny`` reaching a session a live worker holds.

Every command is a real process; the worker is a real ``dsh-agent worker`` on a real SQLite file
(and once on PostgreSQL), stopped with a real SIGTERM. Nothing is timed: each wait is a bounded
poll for a line or a stored event.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from .helpers import (
    COMMAND,
    PLUGIN,
    QUICKSTART,
    cli,
    environment,
    event_data,
    postgres_dsn,
    stored_sessions,
)

#: A session maker: agents ``main`` and ``other`` ask before each ``write_file``; their one
#: reply is text.
MAKE = (
    PLUGIN
    + """\
      agents:
        - id: main
          provider: scripted
          model: m
          cwd: .
          tools: [write_file]
          requireApproval: [write_file]
        - id: other
          provider: scripted
          model: m
          cwd: .
          tools: [write_file]
          requireApproval: [write_file]
store: sqlite:///fleet.db
providers:
  scripted: {kind: scripted, loop: true, replies: [{text: hello}]}
"""
)
#: The worker's config: the same provider name, whose model calls write_file, then answers.
SERVE = (
    PLUGIN
    + """\
      fleet: {workerId: from-config, maxAgents: 3}
store: sqlite:///fleet.db
providers:
  scripted:
    kind: scripted
    loop: true
    replies:
      - tool_calls: [{name: write_file, arguments: {path: out.txt, content: hi}}]
      - text: finished
"""
)


class Worker:
    """A ``dsh-agent worker`` process and the lines it printed so far."""

    def __init__(self, *args: str, cwd: Path) -> None:
        self.process = subprocess.Popen(
            [*COMMAND, "worker", *args],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment(cwd),
        )
        self.lines: list[str] = []

    def expect(self, needle: str, timeout: float = 30) -> str:
        """Read lines until one holds ``needle``; return it."""
        for line in self.lines:
            if needle in line:
                return line
        deadline = time.monotonic() + timeout
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            self.lines.append(line.rstrip("\n"))
            if needle in line:
                return line.rstrip("\n")
        raise AssertionError(f"{needle!r} not printed; so far: {self.lines}")

    def stop(self, how: int = signal.SIGTERM) -> tuple[int, str, str]:
        """Send ``how``; the exit code, the rest of stdout, and stderr."""
        self.process.send_signal(how)
        out, err = self.process.communicate(timeout=60)
        self.lines += out.splitlines()
        return self.process.returncode, out, err

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate(timeout=30)


@contextmanager
def worker(*args: str, cwd: Path) -> Iterator[Worker]:
    running = Worker(*args, cwd=cwd)
    try:
        running.expect("worker ")  # the first line: it is ready for signals
        yield running
    finally:
        running.kill()


def _poll(check: object, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.1)


def _inserted(path: Path, session_id: str) -> set[str]:
    _, events = stored_sessions(path)[session_id]
    return {
        m["id"] for d in event_data(events, "agent/inbox/spliced") for m in d.get("inserted", ())
    }


@pytest.fixture
def made(tmp_path: Path) -> Path:
    """A directory holding make.yaml, serve.yaml and fleet.db with session ``s`` (agent main)."""
    (tmp_path / "make.yaml").write_text(MAKE)
    (tmp_path / "serve.yaml").write_text(SERVE)
    done = cli(
        "run", "make.yaml", "-q", "--agent", "main", "--session", "s", "-p", "hi", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    return tmp_path


def test_worker_serves_send_and_status_and_drains_on_sigterm(tmp_path: Path) -> None:
    made = cli("run", str(QUICKSTART), "-q", "--session", "notes", "-p", "hi", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    store = ["--store", "sqlite:///sessions.db"]
    with worker("--config", str(QUICKSTART), "--id", "w1", "--max-agents", "4", cwd=tmp_path) as w:
        assert w.lines[0] == "worker w1 on sqlite:///sessions.db (max 4 agents)"
        answered = cli("send", "notes", "And now?", "--wait", *store, cwd=tmp_path)
        assert answered.returncode == 0, answered.stderr
        assert "Those are the entries of the working directory" in answered.stdout
        assert "session notes stored in sqlite:///sessions.db" in answered.stderr
        assert w.expect("activated notes")

        sent = cli("send", "notes", "queued", *store, "--json", cwd=tmp_path)
        assert sent.returncode == 0, sent.stderr
        record = json.loads(sent.stdout)
        assert record["session_id"] == "notes"
        assert record["kind"] == "followup"
        mid = record["message_id"]
        _poll(lambda: mid in _inserted(tmp_path / "sessions.db", "notes"), "delivered")

        status = cli("fleet", "status", *store, cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        header, row = status.stdout.splitlines()[:2]
        assert header.split() == ["WORKER", "HOST", "PID", "HEARTBEAT", "AGENTS", "STATE", "ALIVE"]
        assert row.split()[0] == "w1"
        assert row.split()[-2:] == ["running", "yes"]
        assert str(w.process.pid) in row.split()
        shown = json.loads(cli("fleet", "status", *store, "--json", cwd=tmp_path).stdout)
        (only,) = shown["workers"]
        assert (only["worker_id"], only["max_agents"], only["alive"]) == ("w1", 4, True)

        code, out, err = w.stop(signal.SIGTERM)
    assert code == 0, err
    assert "worker w1 draining" in out
    last = out.splitlines()[-1]
    assert last.startswith("worker w1 drained and stopped on SIGTERM: 1 activations"), out
    assert "2 messages delivered" in last
    after = json.loads(cli("fleet", "status", *store, "--json", cwd=tmp_path).stdout)
    assert after["workers"] == []  # the drain gave its row back


def test_ctrl_c_drains_too_and_config_fleet_block_gives_defaults(made: Path) -> None:
    with worker("--config", "serve.yaml", "--max-agents", "5", cwd=made) as w:
        assert w.lines[0] == "worker from-config on sqlite:///fleet.db (max 5 agents)"
        code, out, err = w.stop(signal.SIGINT)
    assert code == 0, err
    assert out.splitlines()[-1].startswith("worker from-config drained and stopped on SIGINT")
    assert "agents the config declares" not in err  # serve.yaml declares none


def test_cancel_waits_for_a_worker_or_says_it_is_queued(made: Path) -> None:
    store = ["--store", "sqlite:///fleet.db"]
    queued = cli("cancel", "s", *store, "--timeout", "0.5", cwd=made)
    assert queued.returncode == 3, queued.stderr
    assert "cancel of session s is queued: no worker applied it within 0.5 s" in queued.stderr
    now = cli("cancel", "s", *store, "--no-wait", "--keep-inbox", cwd=made)
    assert (now.returncode, now.stdout.strip()) == (0, "cancel of session s queued")
    with worker("--config", "serve.yaml", cwd=made) as w:
        applied = cli("cancel", "s", *store, cwd=made)
        assert applied.returncode == 0, applied.stderr
        assert applied.stdout.strip() == "cancelled session s (inbox cleared)"
        assert w.expect("activated s")
    status = json.loads(cli("fleet", "status", *store, "--json", cwd=made).stdout)
    assert status["sessions_waiting"] == 0  # the three cancels were applied


def test_approve_and_deny_reach_a_session_a_live_worker_holds(made: Path) -> None:
    store = ["--store", "sqlite:///fleet.db"]
    made_too = cli(
        "run", "make.yaml", "-q", "--agent", "other", "--session", "d", "-p", "hi", cwd=made
    )
    assert made_too.returncode == 0, made_too.stderr
    with worker("--config", "serve.yaml", cwd=made):
        asked = cli("send", "s", "write it", "--wait", *store, cwd=made)
        assert asked.returncode == 3, asked.stderr
        assert "main: write_file" in asked.stderr
        assert "is waiting for approval" in asked.stderr
        assert "approve with: dsh-agent approve s call-1 --store sqlite:///fleet.db" in asked.stderr

        approved = cli("approve", "s", "call-1", *store, cwd=made)
        assert approved.returncode == 0, approved.stderr
        assert "approved main's call call-1 of write_file" in approved.stdout
        assert 'assistant: "finished"' in approved.stdout
        assert "session s stored in sqlite:///fleet.db" in approved.stderr
        assert (made / "out.txt").read_text() == "hi"

        (made / "out.txt").unlink()
        assert cli("send", "d", "write it", "--wait", *store, cwd=made).returncode == 3
        denied = cli("deny", "d", "--all", "-m", "not now", "--quiet", *store, cwd=made)
        assert denied.returncode == 0, denied.stderr
        assert "denied other's call call-" in denied.stdout
        assert "assistant:" not in denied.stdout  # --quiet
        assert not (made / "out.txt").exists()

        unknown = cli("approve", "s", "call-9", *store, cwd=made)
        assert unknown.returncode == 2
        assert "no tool call 'call-9' waits" in unknown.stderr or "no tool calls" in unknown.stderr
    _, events = stored_sessions(made / "fleet.db")["d"]
    results = [d for d in event_data(events, "tool/result") if d["message"]["name"] == "write_file"]
    assert results[-1]["error"]["code"] == "DENIED"


def test_without_a_worker_approve_stays_local(made: Path) -> None:
    """No worker holds the session: approve resumes it here, as before the fleet."""
    store = ["--store", "sqlite:///fleet.db"]
    agent = "{id: main, provider: scripted, model: m, cwd: ., tools: [write_file]}"
    (made / "ask.yaml").write_text(
        SERVE.replace("fleet: {workerId: from-config, maxAgents: 3}", f"agents: [{agent}]")
    )
    asked = cli("run", "ask.yaml", "-q", "--session", "s", "--prompt", "go", cwd=made)
    assert asked.returncode == 3, asked.stderr
    approved = cli("approve", "s", "--all", "--always", "--config", "ask.yaml", *store, cwd=made)
    assert approved.returncode == 0, approved.stderr
    assert "fleet worker" not in approved.stdout
    assert (made / "out.txt").read_text() == "hi"


def test_send_refuses_what_it_cannot_do(made: Path) -> None:
    store = ["--store", "sqlite:///fleet.db"]
    unknown = cli("send", "nope", "hi", *store, cwd=made)
    assert (unknown.returncode, unknown.stderr.strip()) == (
        2,
        "session 'nope' not found in sqlite:///fleet.db",
    )
    absent = cli("send", "s", "hi", "--store", "sqlite:///absent.db", cwd=made)
    assert absent.returncode == 2
    assert not (made / "absent.db").exists()
    steer = cli("send", "s", "hi", "--steer", "--wait", *store, cwd=made)
    assert steer.returncode == 2
    assert "a steer has none" in steer.stderr
    queued = cli("send", "s", "hello", *store, cwd=made)
    assert queued.returncode == 0
    assert queued.stdout.strip().startswith("msg-")
    assert "no live worker on sqlite:///fleet.db" in queued.stderr
    timed = cli("send", "s", "hello", "--wait", "--timeout", "0.5", *store, cwd=made)
    assert timed.returncode == 1
    assert "no answer within 0.5 s; the message is withdrawn" in timed.stderr
    status = json.loads(cli("fleet", "status", *store, "--json", cwd=made).stdout)
    assert status["workers"] == []
    assert (status["sessions_waiting"], status["undelivered"]) == (1, 2)  # until a worker runs


@pytest.mark.parametrize("url", ["memory:", "jsonl:///logs"])
def test_a_store_no_other_process_reaches_is_refused(tmp_path: Path, url: str) -> None:
    for args in (["worker"], ["send", "s", "hi"], ["cancel", "s"], ["fleet", "status"]):
        done = cli(*args, "--store", url, cwd=tmp_path, timeout=30)
        assert done.returncode == 2, (args, done.stderr)
        line = done.stderr.strip()
        assert "a fleet needs a store every process can reach" in line, line
        assert "(CONFIG_INVALID)" in line
        assert len(line.splitlines()) == 1


def test_status_of_an_absent_store_creates_nothing(tmp_path: Path) -> None:
    done = cli("fleet", "status", "--store", "sqlite:///none.db", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "no workers"
    assert not (tmp_path / "none.db").exists()


def test_worker_and_send_on_postgresql_hide_the_password(tmp_path: Path) -> None:
    import psycopg

    from .helpers import with_password

    dsn = postgres_dsn()
    prefix = f"dsh_t{secrets.token_hex(4)}_"
    url = f"{with_password(dsn, 'Hunter2')}?table_prefix={prefix}&lease_ttl=2"
    store = ["--store", url]
    try:
        made = cli(
            "run", str(QUICKSTART), "-q", "--session", "pg", "-p", "hi", *store, cwd=tmp_path
        )
        assert made.returncode == 0, made.stderr
        with worker("--config", str(QUICKSTART), "--id", "pgw", *store, cwd=tmp_path) as w:
            assert "Hunter2" not in w.lines[0]
            assert "***" in w.lines[0]
            answered = cli("send", "pg", "again", "--wait", *store, cwd=tmp_path)
            assert answered.returncode == 0, answered.stderr
            assert "Those are the entries" in answered.stdout
            assert "Hunter2" not in answered.stdout + answered.stderr
            status = cli("fleet", "status", *store, cwd=tmp_path)
            assert status.stdout.split()[7] == "pgw"
            code, out, err = w.stop()
        assert code == 0, err
        assert "drained and stopped on SIGTERM: 1 activations" in out
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table in (
                "events",
                "sessions",
                "leases",
                "fleet_workers",
                "fleet_sessions",
                "fleet_messages",
                "fleet_commands",
            ):
                conn.execute(f"DROP TABLE IF EXISTS {prefix}{table}")
