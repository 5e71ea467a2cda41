"""Fixtures for the fleet's cross-process tests: a shared store, worker processes, log checks.

``fleet`` (parametrised over SQLite and PostgreSQL where a test asks for ``backend``) gives a
``Fleet``: the store URL every process uses, ``start_worker`` (a ``worker_proc.py`` process,
its stdout collected line by line, started once it printed ``READY``), and helpers that read a
session's stored log. Every process still running at the end is killed; PostgreSQL tables (a
fresh random prefix per test) are dropped (docs/design.md#fleet).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from dsh_agent_loop import Event, invariants, open_client
from dsh_agent_loop.events import INBOX_SPLICED, TURN_END, TURN_START
from dsh_agent_loop.fleet import FleetClient

from ..stores.conftest import new_pg_prefix, postgres_dsn

WORKER = Path(__file__).with_name("worker_proc.py")
PG_LEASE = 2.0
#: The fleet lease the tests give SQLite workers too (the default, 10 s, is slow to wait out).
LEASE = 2.0
PG_TABLES = (
    "events",
    "sessions",
    "leases",
    "fleet_workers",
    "fleet_sessions",
    "fleet_messages",
    "fleet_commands",
)


def drop_fleet_tables(dsn: str, prefix: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in PG_TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {prefix}{table}")


class WorkerProc:
    """One ``worker_proc.py`` process and the lines it printed so far."""

    def __init__(self, name: str, proc: trio.Process, stderr: Path) -> None:
        self.name = name
        self.proc = proc
        self.stderr = stderr
        self.lines: list[str] = []
        self.eof = trio.Event()

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        buf = b""
        try:
            while chunk := await self.proc.stdout.receive_some():
                buf += chunk
                *done, buf = buf.split(b"\n")
                self.lines.extend(line.decode() for line in done)
        except trio.ClosedResourceError:
            pass
        finally:
            if buf:
                self.lines.append(buf.decode())
            self.eof.set()

    def output(self) -> str:
        err = self.stderr.read_text() if self.stderr.exists() else ""
        return "\n".join(self.lines) + ("\n--- stderr ---\n" + err[-4000:] if err else "")

    def has(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def count(self, text: str) -> int:
        return sum(text in line for line in self.lines)

    async def wait_line(self, text: str, *, timeout: float = 30.0, count: int = 1) -> None:
        """Wait until ``count`` lines contain ``text`` (fails after ``timeout``, or at exit)."""
        with trio.move_on_after(timeout):
            while self.count(text) < count:
                if self.eof.is_set():
                    break
                await trio.sleep(0.02)
        if self.count(text) < count:
            raise AssertionError(f"{self.name}: no line with {text!r}:\n{self.output()}")

    def signal(self, signum: int) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signum)

    async def wait_exit(self, timeout: float = 60.0) -> int:
        with trio.fail_after(timeout):
            code = await self.proc.wait()
            await self.eof.wait()
        return code

    async def kill(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        with trio.CancelScope(shield=True):
            await self.proc.wait()


class Fleet:
    """The store every process of a test shares, and its worker processes."""

    def __init__(self, backend: str, url: str, tmp: Path, nursery: trio.Nursery) -> None:
        self.backend = backend
        self.url = url
        self.tmp = tmp
        self.nursery = nursery
        self.workers: list[WorkerProc] = []

    def url_with(self, **options: Any) -> str:
        """The store URL with other query options (PostgreSQL: e.g. a longer ``lease_ttl``)."""
        if self.backend == "sqlite":
            return self.url
        base, _, _ = self.url.partition("?")
        prefix = self.url.split("table_prefix=")[1].split("&")[0]
        query = "&".join(f"{k}={v}" for k, v in {"table_prefix": prefix, **options}.items())
        return f"{base}?{query}"

    async def start_worker(
        self, name: str, *args: str, url: str | None = None, lease: float | None = LEASE
    ) -> WorkerProc:
        """Start a worker process and wait for its ``READY`` line."""
        cmd = [str(WORKER), "--store", url or self.url, "--id", name, *args]
        if lease is not None:
            cmd += ["--lease", str(lease)]
        worker = await self.start_process(name, cmd)
        await worker.wait_line(f"READY {name}", timeout=60)
        return worker

    async def start_process(self, name: str, cmd: Sequence[str]) -> WorkerProc:
        """Start ``python *cmd``, collecting its stdout lines (killed at the end of the test)."""
        stderr = self.tmp / f"{name}.stderr"
        with stderr.open("ab") as err:
            proc = await trio.lowlevel.open_process(
                [sys.executable, *cmd], stdout=subprocess.PIPE, stderr=err
            )
        worker = WorkerProc(name, proc, stderr)
        self.workers.append(worker)
        self.nursery.start_soon(worker._read)
        return worker

    def client(self) -> Any:
        return open_client(self.url)

    async def kill_all(self) -> None:
        for worker in self.workers:
            await worker.kill()
        for worker in self.workers:  # shown by pytest when the test failed
            print(f"=== worker {worker.name} (exit {worker.proc.returncode}) ===")
            print(worker.output())


async def read_log(client: FleetClient, sid: str) -> list[Event]:
    """Every stored event of ``sid``, in seq order."""
    reader = await client.store.open(sid, "read")
    try:
        events: list[Event] = []
        while batch := await reader.read(len(events)):
            events.extend(batch)
        return events
    finally:
        await reader.close()


def inserted_ids(events: Sequence[Event]) -> list[str]:
    """Ids of the messages the log's splices inserted, in log order (repeats kept)."""
    return [
        m["id"]
        for e in events
        if e.type == INBOX_SPLICED
        for m in e.data.get("inserted", ())
        if isinstance(m.get("id"), str)
    ]


def check_log(events: Sequence[Event]) -> None:
    """Seqs dense from 0 and ``invariants.check`` clean (the last turn may be open)."""
    assert [e.seq for e in events] == list(range(len(events))), "seqs not dense"
    violations = invariants.check(events, allow_open_turn=True)
    assert not violations, violations


def turn_ends(events: Sequence[Event]) -> dict[int, Any]:
    """``turn -> turn/end reason``."""
    return {int(e.data["turn"]): e.data["reason"] for e in events if e.type == TURN_END}


def open_turns(events: Sequence[Event]) -> list[int]:
    ended = turn_ends(events)
    return [
        int(e.data["turn"]) for e in events if e.type == TURN_START and e.data["turn"] not in ended
    ]


async def wait_for(
    what: str, probe: Callable[[], Any], *, timeout: float = 30.0, every: float = 0.05
) -> Any:
    """Poll the async ``probe`` until it returns something truthy; return it."""
    with trio.move_on_after(timeout):
        while True:
            value = await probe()
            if value:
                return value
            await trio.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


async def wait_log(
    client: FleetClient,
    sid: str,
    predicate: Callable[[list[Event]], Any],
    what: str,
    *,
    timeout: float = 30.0,
) -> list[Event]:
    """Poll the session's log until ``predicate(events)``; return the events."""

    async def probe() -> list[Event] | None:
        if await client.store.stat(sid) is None:
            return None
        events = await read_log(client, sid)
        return events if predicate(events) else None

    result: list[Event] = await wait_for(what, probe, timeout=timeout, every=0.1)
    return result


@asynccontextmanager
async def open_fleet(backend: str, tmp_path: Path) -> AsyncIterator[Fleet]:
    """A fresh store location of ``backend``; its processes killed and its tables dropped after."""
    dsn = prefix = None
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'fleet.db'}"
    else:
        dsn, prefix = postgres_dsn(), new_pg_prefix()
        url = f"{dsn}?table_prefix={prefix}&lease_ttl={PG_LEASE:g}"
    try:
        async with trio.open_nursery() as nursery:
            the_fleet = Fleet(backend, url, tmp_path, nursery)
            try:
                yield the_fleet
            finally:
                await the_fleet.kill_all()
                nursery.cancel_scope.cancel()
    finally:
        if dsn is not None and prefix is not None:
            await trio.to_thread.run_sync(drop_fleet_tables, dsn, prefix)


@pytest.fixture(params=["sqlite", "postgres"])
async def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Fleet]:
    async with open_fleet(request.param, tmp_path) as the_fleet:
        yield the_fleet


@pytest.fixture
async def sqlite_fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    async with open_fleet("sqlite", tmp_path) as the_fleet:
        yield the_fleet


@pytest.fixture
async def pg_fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    async with open_fleet("postgres", tmp_path) as the_fleet:
        yield the_fleet
