"""Fixtures for ``dsh-agent serve``: a real server process and a real worker process on one store.

``start_served(...)`` (the ``serve_factory`` fixture) starts ``dsh-agent worker`` and ``dsh-agent
serve --port 0`` in a temporary directory on a SQLite file or a fresh PostgreSQL table prefix,
with the config below, and returns a ``Served``: the base URL (read from the server's ``serving``
line), the store URL, the token, and helpers to create a session and wait for a condition. Every
process still running at the end is stopped (SIGTERM, then kill) and PostgreSQL tables dropped.

The agents of ``CONFIG`` (each on its own scripted provider, so the worker serves them all):

- ``helper``: reasoning, a line of text and a ``list_dir`` call, then the text ``done looking``;
- ``guarded``: a ``write_file`` call that requires approval, then the text ``finished``;
- ``slow``: a long text streamed a word every 200 ms (a turn to cancel);
- ``talker``: the text ``hello from talker`` (one step).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..cli.helpers import postgres_dsn
from ..fleet.conftest import PG_TABLES

COMMAND = [sys.executable, "-m", "dsh_agent_loop.cli"]
SLOW_TEXT = " ".join(f"word{i}" for i in range(200))

CONFIG = f"""\
plugins:
  - name: '@deepseek-ai/dsh-agent-loop'
    config:
      fleet: {{leaseSeconds: 2}}
      agents:
        - id: helper
          provider: steps
          model: m
          cwd: .
          tools: [list_dir]
        - id: guarded
          provider: guarded
          model: m
          cwd: .
          tools: [write_file]
          requireApproval: [write_file]
        - id: slow
          provider: slow
          model: m
          cwd: .
        - id: talker
          provider: talker
          model: m
          cwd: .
providers:
  steps:
    kind: scripted
    loop: true
    replies:
      - reasoning: I should look at the folder first.
        text: Let me look.
        tool_calls: [{{name: list_dir, arguments: {{path: .}}}}]
      - text: done looking
  guarded:
    kind: scripted
    loop: true
    replies:
      - tool_calls: [{{name: write_file, arguments: {{path: out.txt, content: hi}}}}]
      - text: finished
  slow:
    kind: scripted
    loop: true
    latency_ms: 200
    replies:
      - text: {SLOW_TEXT}
  talker:
    kind: scripted
    loop: true
    replies:
      - text: hello from talker
"""


def environment(cwd: Path, **extra: str) -> dict[str, str]:
    """A process environment with private settings and no inherited store or token."""
    unset = ("NO_COLOR", "FORCE_COLOR", "DSH_AGENT_STORE", "DSH_AGENT_TOKEN")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(XDG_CONFIG_HOME=str(cwd / ".xdg"), COLUMNS="100", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


class Proc:
    """A started CLI process whose stdout and stderr go to files in its directory."""

    def __init__(self, name: str, args: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.name = name
        self.out = cwd / f"{name}.out"
        self.err = cwd / f"{name}.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.process = subprocess.Popen(
                [*COMMAND, *args], cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                env=env,
            )  # fmt: skip

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def wait_line(self, needle: str, timeout: float = 60) -> str:
        """The first stdout line holding ``needle`` (bounded poll)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.stdout().splitlines():
                if needle in line:
                    return line
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(
            f"{self.name}: {needle!r} not printed (exit {self.process.poll()});"
            f" stdout {self.stdout()!r}; stderr {self.stderr()!r}"
        )

    def stop(self, how: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Signal it and wait; its exit code (killed when it does not stop)."""
        if self.process.poll() is None:
            self.process.send_signal(how)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        return self.process.returncode


class Served:
    """A running server (and, usually, a worker) on one store."""

    def __init__(self, cwd: Path, store_url: str, token: str | None) -> None:
        self.cwd = cwd
        self.store_url = store_url
        self.token = token
        self.url = ""
        self.server: Proc | None = None
        self.worker: Proc | None = None
        self.procs: list[Proc] = []

    def client(self, **kwargs: Any) -> httpx.Client:
        """An httpx client on the server (with the token as a bearer when there is one)."""
        headers = dict(kwargs.pop("headers", {}))
        if self.token is not None:
            headers.setdefault("Authorization", f"Bearer {self.token}")
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **kwargs)

    def start_worker(self, *extra: str) -> Proc:
        """Start one more ``dsh-agent worker`` on the store (ready once it printed its line)."""
        name = f"worker{len([p for p in self.procs if p.name.startswith('worker')])}"
        proc = Proc(
            name,
            ["worker", "--config", "serve.yaml", "--store", self.store_url, *extra],
            self.cwd,
            environment(self.cwd),
        )
        self.procs.append(proc)
        proc.wait_line("worker ")
        self.worker = proc
        return proc

    def create(self, agent: str, prompt: str | None = None, **body: Any) -> str:
        """Create a session through the API; its id."""
        payload: dict[str, Any] = {"agent": agent, **body}
        if prompt is not None:
            payload["prompt"] = prompt
        with self.client() as http:
            reply = http.post("/api/sessions", json=payload)
        assert reply.status_code == 201, reply.text
        return str(reply.json()["id"])

    def summary(self, sid: str) -> dict[str, Any]:
        with self.client() as http:
            reply = http.get(f"/api/sessions/{sid}")
        assert reply.status_code == 200, reply.text
        return dict(reply.json())

    def wait_for(
        self, check: Callable[[], Any], what: str = "condition", timeout: float = 60
    ) -> Any:
        """Poll ``check`` until it returns something truthy (bounded); that value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    def wait_status(self, sid: str, *statuses: str, timeout: float = 60) -> dict[str, Any]:
        """Wait until the session's status is one of ``statuses`` (and, for idle, a turn ran)."""

        def check() -> dict[str, Any] | None:
            summary = self.summary(sid)
            if summary["status"] in statuses and (summary["status"] != "idle" or summary["turns"]):
                return summary
            return None

        return dict(self.wait_for(check, f"{sid} to be {statuses}", timeout))


def _store_url(backend: str, cwd: Path, cleanup: list[Callable[[], None]]) -> str:
    if backend == "sqlite":
        return f"sqlite:///{cwd / 'serve.db'}"
    import psycopg

    dsn = postgres_dsn()
    prefix = f"dsh_t{secrets.token_hex(4)}_"

    def drop() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table in PG_TABLES:
                conn.execute(f"DROP TABLE IF EXISTS {prefix}{table}")

    cleanup.append(drop)
    return f"{dsn}?table_prefix={prefix}&lease_ttl=2"


StartServed = Callable[..., Served]


@contextmanager
def _starter(factory: pytest.TempPathFactory) -> Iterator[StartServed]:
    started: list[Served] = []
    cleanup: list[Callable[[], None]] = []

    def start(
        backend: str = "sqlite",
        *,
        token: str | None = None,
        host: str | None = None,
        worker: bool = True,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> Served:
        cwd = factory.mktemp("served")
        (cwd / "serve.yaml").write_text(CONFIG)
        served = Served(cwd, _store_url(backend, cwd, cleanup), token)
        started.append(served)
        args = ["serve", "--config", "serve.yaml", "--store", served.store_url, "--port", "0"]
        if token is not None:
            args += ["--token", token]
        if host is not None:
            args += ["--host", host]
        served.server = Proc("server", [*args, *extra], cwd, environment(cwd, **(env or {})))
        served.procs.append(served.server)
        line = served.server.wait_line("serving ")
        served.url = line.split("serving ", 1)[1].strip().rstrip("/")
        if worker:
            served.start_worker()
        return served

    try:
        yield start
    finally:
        for served in started:
            for proc in reversed(served.procs):
                proc.stop()
        for step in cleanup:
            step()


@pytest.fixture
def serve_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartServed]:
    """``start(backend="sqlite", token=None, host=None, worker=True, extra=(), env=None)``."""
    with _starter(tmp_path_factory) as start:
        yield start


@pytest.fixture(scope="module")
def module_serve_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartServed]:
    """``serve_factory`` whose processes live until the module's tests are done."""
    with _starter(tmp_path_factory) as start:
        yield start


@pytest.fixture
def served(serve_factory: StartServed) -> Served:
    """A server and a worker on a SQLite store."""
    return serve_factory("sqlite")


@pytest.fixture(params=["sqlite", "postgres"])
def served_any(request: pytest.FixtureRequest, serve_factory: StartServed) -> Served:
    """A server and a worker on SQLite, then on PostgreSQL."""
    return serve_factory(str(request.param))


@pytest.fixture(scope="module")
def shared_served(module_serve_factory: StartServed) -> Served:
    """One server and worker on SQLite for every test of a module that only adds sessions."""
    return module_serve_factory("sqlite")


# --- the API tests' shared servers (test_api.py, test_stream.py) ------------------------------


@pytest.fixture(scope="module")
def servers(module_serve_factory: StartServed) -> Any:
    """A module's ``Servers`` (``api_helpers.py``): one server per backend, started on first use."""
    from .api_helpers import Servers

    return Servers(module_serve_factory)


@pytest.fixture(params=["sqlite", "postgres"])
def live(request: pytest.FixtureRequest, servers: Any) -> Served:
    """The module's server and worker on SQLite, then on PostgreSQL."""
    return servers.get(str(request.param))  # type: ignore[no-any-return]


@pytest.fixture
async def api(live: Served) -> AsyncIterator[Any]:
    """An ``Api`` client (``api_helpers.py``) on ``live``."""
    from .api_helpers import open_api

    async with open_api(live) as client:
        yield client
