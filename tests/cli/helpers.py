"""Run ``dsh-agent`` as a user would: in a subprocess, in a temporary directory, or on a pty."""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import select
import signal
import struct
import subprocess
import sys
import termios
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from dsh_agent_loop import SqliteStore
from dsh_agent_loop.events import Event

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart.yaml"
COMMAND = [sys.executable, "-m", "dsh_agent_loop.cli"]
PG_ENV = "DSH_TEST_POSTGRES_DSN"


def environment(cwd: Path, **extra: str) -> dict[str, str]:
    """The process environment: private settings, no store variable, no colour, 100 columns."""
    unset = ("NO_COLOR", "FORCE_COLOR", "DSH_AGENT_STORE")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(XDG_CONFIG_HOME=str(cwd / ".xdg"), COLUMNS="100", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def cli(
    *args: str, cwd: Path, stdin: str | None = None, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``dsh-agent ARGS`` in ``cwd`` with piped output; ``stdin`` text or nothing."""
    return subprocess.run(
        [*COMMAND, *args],
        cwd=cwd,
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment(cwd, **env),
        check=False,
    )


# The child makes the pty its controlling terminal, so a written ^C becomes a real SIGINT
# sent by the terminal to the foreground process group, as when a person types it.
_ATTACH = (
    "import fcntl, os, sys, termios\n"
    "fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'dsh_agent_loop.cli', *sys.argv[1:]])\n"
)


class Terminal:
    """``dsh-agent ARGS`` on a pseudo-terminal: ``expect`` output, ``send`` keys, ``wait``."""

    def __init__(self, *args: str, cwd: Path, columns: int = 100, **env: Any) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
        self.process = subprocess.Popen(
            [sys.executable, "-c", _ATTACH, *args],
            cwd=cwd,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            env=environment(cwd, COLUMNS=str(columns), TERM="xterm", **env),
        )
        os.close(slave)
        self.fd = master
        self.output = ""
        self._seen = 0
        self._closed = False

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            return False
        if not data:
            return False
        self.output += data.decode("utf-8", "replace")
        return True

    def expect(self, pattern: str, timeout: float = 20) -> re.Match[str]:
        """Wait for ``pattern`` (a regex) in the output after the previous match."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while True:
            match = regex.search(self.output, self._seen)
            if match:
                self._seen = match.end()
                return match
            left = deadline - time.monotonic()
            if left <= 0 or (not self._read(min(left, 0.1)) and self.process.poll() is not None):
                raise AssertionError(f"{pattern!r} not seen; output so far:\n{self.output}")

    def send(self, text: str) -> None:
        """Type ``text``."""
        os.write(self.fd, text.encode())

    def wait(self, timeout: float = 20) -> int:
        """Wait for the exit code, collecting output."""
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            self._read(0.05)
        while self._read(0.05) and select.select([self.fd], [], [], 0)[0]:
            pass
        if self.process.poll() is None:
            self.close()
            raise AssertionError(f"still running; output so far:\n{self.output}")
        return self.process.returncode

    def close(self) -> None:
        """Kill the child (if it still runs) and release the pty."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if not self._closed:
            self._closed = True
            os.close(self.fd)


def postgres_dsn() -> str:
    """The test server's DSN (``DSH_TEST_POSTGRES_DSN``), or skip with the reason shown."""
    import psycopg

    dsn = os.environ.get(PG_ENV)
    if not dsn:
        pytest.skip(f"PostgreSQL tests need {PG_ENV} (e.g. postgresql://postgres@127.0.0.1/test)")
    try:
        psycopg.connect(dsn, connect_timeout=3).close()
    except psycopg.Error as exc:
        pytest.skip(f"PostgreSQL at {PG_ENV} is unreachable: {exc}")
    return dsn


def with_password(dsn: str, password: str) -> str:
    """``dsn`` with ``password`` in its userinfo (the user is ``postgres`` if it names none)."""
    parts = urllib.parse.urlsplit(dsn)
    user = parts.username or "postgres"
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{user}:{urllib.parse.quote(password, safe='')}@{host}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


@contextmanager
def pg_tables(dsn: str) -> Iterator[str]:
    """A fresh table prefix on the test server; its tables are dropped afterwards."""
    import psycopg

    prefix = f"dsh_cli{secrets.token_hex(4)}_"
    try:
        yield prefix
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table in ("events", "sessions", "leases"):
                conn.execute(f"DROP TABLE IF EXISTS {prefix}{table}")


def stored_sessions(path: Path) -> dict[str, tuple[str, list[Event]]]:
    """Every session of the SQLite store at ``path``: its agent id and events."""

    async def read() -> dict[str, tuple[str, list[Event]]]:
        store = SqliteStore(str(path))
        try:
            out = {}
            for info in await store.list():
                handle = await store.open(info.session_id, "read")
                out[info.session_id] = (info.agent_id, await handle.read())
                await handle.close()
            return out
        finally:
            await store.aclose()

    return trio.run(read)


def agent_events(path: Path, agent_id: str) -> list[Event]:
    """The events of the one session of ``agent_id`` in the SQLite store at ``path``."""
    (events,) = [e for a, e in stored_sessions(path).values() if a == agent_id]
    return events


def event_data(events: list[Event], kind: str) -> list[Any]:
    """The data of the events of type ``kind``, in order."""
    return [e.data for e in events if e.type == kind]


def tool_errors(events: list[Event], name: str) -> list[Any]:
    """The results of tool ``name`` in order: None for a success, else the error code."""
    return [
        (d.get("error") or {}).get("code")
        for d in event_data(events, "tool/result")
        if d["message"]["name"] == name
    ]


#: The seed's plugin wrapper, for configs written inline.
PLUGIN = "plugins:\n  - name: '@deepseek-ai/dsh-agent-loop'\n    config:\n"
#: A chat agent whose ``write_file`` call asks for approval: ``requireApproval`` makes the
#: call ask whatever the permission policy says.
REQUIRED = (
    PLUGIN
    + """\
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
)
