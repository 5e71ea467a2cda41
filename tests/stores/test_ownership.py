"""Write ownership across real OS processes: races, ``kill -9`` takeover, and fencing.

Each worker is a separate Python process running a small trio program that executes one
command per stdin line (``open``/``create``/``append``/``renew``/``release``) against its own
store object and answers one line on stdout. Real time is used here on purpose: these are the
tests that the lock or lease really excludes other processes; waits are short and bounded.
``DSH_LONG=1`` runs more trials.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio

from dsh_agent_loop._errors import SessionAlreadyOwnedError
from dsh_agent_loop._session.store import SessionStore
from dsh_agent_loop.stores import JsonlStore, SqliteStore

from .conftest import drop_pg_tables, ev, header, new_pg_prefix, postgres_dsn

LONG = os.environ.get("DSH_LONG") == "1"
WORKERS = 8
TRIALS = 50 if LONG else 10
T = TypeVar("T")

WORKER = r"""
import os, socket, sys, trio
from dsh_agent_loop._errors import (
    SessionAlreadyOwnedError, SessionOwnershipLostError, StoreError)
from dsh_agent_loop.events import Event

def make_store(backend, location, prefix, ttl):
    if backend == "sqlite":
        from dsh_agent_loop.stores.sqlite import SqliteStore
        return SqliteStore(location, busy_timeout=30.0)
    if backend == "jsonl":
        from dsh_agent_loop.stores._jsonl import JsonlStore
        return JsonlStore(location)
    from dsh_agent_loop.stores.postgres import PostgresStore
    return PostgresStore(location, table_prefix=prefix, lease_ttl=float(ttl))

def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()

async def run(store, handles, cmd, sid, arg):
    me = os.getpid()
    if cmd == "open":
        handles[sid] = await store.open(sid, "write")
        say(f"won {me}")
    elif cmd == "create":
        handles[sid] = await store.create({"session_id": sid, "agent_id": "w"})
        await handles[sid].append([Event("user/message", 0, 0.0, {"by": me})])
        say("created")
    elif cmd == "append":
        seq = int(arg)
        await handles[sid].append([Event("user/message", seq, float(seq), {"by": "stale"})])
        await handles[sid].flush()
        say("appended")
    elif cmd == "renew":
        await handles[sid].renew()
        say("renewed")
    elif cmd == "release":
        await handles.pop(sid).close()
        say("released")

async def main():
    store = make_store(*sys.argv[1:5])
    handles = {}
    say(f"ready {os.getpid()} {os.readlink('/proc/self/ns/pid')} {socket.gethostname()}")
    while True:
        line = await trio.to_thread.run_sync(sys.stdin.readline)
        cmd, sid, arg = (line.split() + ["", "", ""])[:3]
        if cmd in ("", "quit"):
            break
        try:
            await run(store, handles, cmd, sid, arg)
        except SessionAlreadyOwnedError as exc:
            say(f"owned-by {exc.owner} | {exc}")
        except SessionOwnershipLostError as exc:
            say(f"lost {exc}")
        except StoreError as exc:
            say(f"error {type(exc).__name__}: {exc}")
    for handle in handles.values():
        try:
            await handle.abort()
        except StoreError:
            pass
    await store.aclose()

trio.run(main)
"""


class Worker:
    """One worker process and its line protocol (``wrapper``: a command that runs it)."""

    def __init__(self, *args: str, wrapper: Sequence[str] = ()) -> None:
        self.proc = subprocess.Popen(
            [*wrapper, sys.executable, "-c", WORKER, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._buf = b""
        self.pid = self.proc.pid

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float = 30.0) -> str:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"worker {self.pid} did not answer")
            if select.select([fd], [], [], remaining)[0]:
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise EOFError(f"worker {self.pid} exited ({self.proc.poll()})")
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def ask(self, command: str) -> str:
        self.send(command)
        return self.recv()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


class Location:
    """Where one backend's sessions live, and how to build a parent-side store there."""

    def __init__(self, backend: str, tmp_path: Path) -> None:
        self.backend = backend
        self.prefix = ""
        if backend == "sqlite":
            self.where = str(tmp_path / "s.db")
        elif backend == "jsonl":
            self.where = str(tmp_path / "sessions")
        else:
            self.where, self.prefix = postgres_dsn(), new_pg_prefix()

    def store(self, **options: Any) -> SessionStore:
        if self.backend == "sqlite":
            return SqliteStore(self.where)
        if self.backend == "jsonl":
            return JsonlStore(self.where)
        from dsh_agent_loop.stores.postgres import PostgresStore

        return PostgresStore(self.where, table_prefix=self.prefix, **options)

    def worker(self, lease_ttl: float = 30.0, wrapper: Sequence[str] = ()) -> Worker:
        args = (self.backend, self.where, self.prefix or "-", str(lease_ttl))
        return Worker(*args, wrapper=wrapper)

    def cleanup(self) -> None:
        if self.backend == "postgres":
            drop_pg_tables(self.where, self.prefix)


@pytest.fixture(params=["sqlite", "jsonl", "postgres"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Location]:
    loc = Location(request.param, tmp_path)
    try:
        yield loc
    finally:
        loc.cleanup()


def with_store(location: Location, fn: Callable[[SessionStore], Awaitable[T]], **options: Any) -> T:
    """Run ``fn(store)`` in its own trio run, on a fresh parent-side store."""

    async def main() -> T:
        store = location.store(**options)
        try:
            return await fn(store)
        finally:
            await store.aclose()

    return trio.run(main)


async def seed(store: SessionStore, *sids: str) -> None:
    for sid in sids:
        handle = await store.create(header(sid))
        await handle.append([ev(0)])
        await handle.close()


async def read_all(store: SessionStore, sid: str) -> list[Any]:
    handle = await store.open(sid, "read")
    try:
        return list(await handle.read())
    finally:
        await handle.close()


def start_workers(location: Location, n: int, **options: Any) -> list[Worker]:
    workers = [location.worker(**options) for _ in range(n)]
    for worker in workers:
        assert worker.recv().startswith("ready"), "worker failed to start"
    return workers


def test_racing_processes_have_exactly_one_winner(location: Location) -> None:
    with_store(location, lambda store: seed(store, "contested"))
    workers = start_workers(location, WORKERS)
    try:
        winners_per_trial = []
        for _ in range(TRIALS):
            for worker in workers:
                worker.send("open contested")
            answers = {worker.pid: worker.recv() for worker in workers}
            winners = [w for w in workers if answers[w.pid].startswith("won")]
            winners_per_trial.append(len(winners))
            assert len(winners) == 1, answers
            winner = winners[0]
            for worker in workers:
                if worker is not winner:  # every loser names the winner
                    assert answers[worker.pid].startswith(f"owned-by pid {winner.pid} on host ")
            assert winner.ask("release contested") == "released"
        assert winners_per_trial == [1] * TRIALS
        assert TRIALS * WORKERS >= 50
    finally:
        for worker in workers:
            worker.stop()
    assert with_store(location, lambda store: read_all(store, "contested")) == [ev(0)]


@pytest.mark.parametrize("location", ["sqlite", "jsonl"], indirect=True)
def test_kill_9_of_the_owner_allows_immediate_takeover(location: Location) -> None:
    """SQLite and JSONL detect a dead owner at once (PostgreSQL waits for the lease: below)."""
    with_store(location, lambda store: seed(store, "stored"))
    (worker,) = start_workers(location, 1)
    try:
        assert worker.ask("open stored") == f"won {worker.pid}"
        assert worker.ask("create fresh") == "created"  # owned, never flushed

        async def refused(store: SessionStore) -> None:
            for attempt in (store.open("stored", "write"), store.create(header("fresh"))):
                with pytest.raises(SessionAlreadyOwnedError, match=f"pid {worker.pid} on host"):
                    await attempt

        with_store(location, refused)
        worker.proc.send_signal(signal.SIGKILL)
        worker.proc.wait()
    finally:
        worker.stop()

    async def take_over(store: SessionStore) -> float:
        start = time.monotonic()
        stored = await store.open("stored", "write")
        fresh = await store.create(header("fresh"))
        elapsed = time.monotonic() - start
        assert await stored.read() == [ev(0)]
        assert await fresh.read() == []  # the dead owner's unflushed event left nothing
        await stored.append([ev(1)])
        await fresh.append([ev(0, text="parent")])
        await stored.close()
        await fresh.close()
        assert await read_all(store, "stored") == [ev(0), ev(1)]
        assert await read_all(store, "fresh") == [ev(0, text="parent")]
        return elapsed

    assert with_store(location, take_over) < 2.0


@pytest.mark.parametrize("location", ["postgres"], indirect=True)
def test_postgres_paused_owner_is_fenced_after_its_lease_is_taken_over(
    location: Location,
) -> None:
    """A SIGSTOPped owner outlives its lease; woken up, its late append is rejected."""
    ttl, trials = 1.0, (10 if LONG else 3)
    sids = [f"paused{k}" for k in range(trials)]
    with_store(location, lambda store: seed(store, *sids))
    (worker,) = start_workers(location, 1, lease_ttl=ttl)
    rejected = 0
    try:
        for sid in sids:
            assert worker.ask(f"open {sid}") == f"won {worker.pid}"
            worker.proc.send_signal(signal.SIGSTOP)
            try:
                waited = with_store(location, lambda store, sid=sid: take_over(store, sid, ttl))
            finally:
                worker.proc.send_signal(signal.SIGCONT)
            assert waited >= ttl * 0.5
            answer = worker.ask(f"append {sid} 1")
            assert answer.startswith("lost "), answer
            assert worker.ask(f"renew {sid}").startswith("lost ")
            rejected += 1
            stored = with_store(location, lambda store, sid=sid: read_all(store, sid))
            assert stored == [ev(0), ev(1, text="new owner")]
        assert rejected == trials

        # A crashed owner of a never-flushed session is replaced once its lease expires.
        assert worker.ask("create crashed") == "created"
        worker.proc.send_signal(signal.SIGKILL)
        worker.proc.wait()
        assert with_store(location, lambda store: recreate_after_expiry(store, ttl)) >= 1
    finally:
        worker.stop()


async def take_over(store: SessionStore, sid: str, ttl: float) -> float:
    """Wait (bounded) for the paused owner's lease to expire, take over, append one event."""
    start = time.monotonic()
    with pytest.raises(SessionAlreadyOwnedError, match=r"pid \d+ on host"):
        await store.open(sid, "write")
    with trio.fail_after(ttl + 5.0):
        while True:
            try:
                handle = await store.open(sid, "write")
            except SessionAlreadyOwnedError:
                await trio.sleep(0.05)
            else:
                break
    waited = time.monotonic() - start
    await handle.append([ev(1, text="new owner")])
    await handle.close()
    return waited


async def recreate_after_expiry(store: SessionStore, ttl: float) -> int:
    """Create over a dead owner's unflushed session once its lease expires; count refusals."""
    refused = 0
    with trio.fail_after(ttl + 5.0):
        while True:
            try:
                handle = await store.create(header("crashed"))
            except SessionAlreadyOwnedError:
                refused += 1
                await trio.sleep(0.05)
            else:
                break
    assert await handle.read() == []  # the dead owner's staged event was never stored
    await handle.abort()
    assert await store.stat("crashed") is None
    return refused
