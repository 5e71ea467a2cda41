"""Ownership across PID namespaces: containers that share a volume and a hostname.

Each worker (``test_ownership.WORKER``) runs under ``unshare --pid --fork --mount-proc``: a PID
namespace of its own, where it is pid 1 and sees no other process, on the same host and the same
files. A pid means nothing across namespaces, so no store may judge another's owner dead by its
pid: the second worker must be refused while the first lives, and may take over at once after
the first is killed with SIGKILL (SQLite: the kernel dropped the owner's lock on its slot of
``<db>-owners``; JSONL: its ``flock``). The parent, in the root namespace, is refused too.

CI runs as root on this same machine: if ``unshare`` cannot make a PID namespace, the test fails
(it never skips), since it would otherwise prove nothing.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from dsh_agent_loop._errors import SessionAlreadyOwnedError
from dsh_agent_loop._session.store import SessionStore

from .conftest import ev, header
from .test_ownership import Location, Worker, read_all, seed, with_store

UNSHARE = ("unshare", "--pid", "--fork", "--mount-proc")


def start_in_namespace(location: Location, hostname: str | None = None) -> tuple[Worker, str]:
    """Start a worker in a PID namespace of its own; return it and its namespace.

    With ``hostname``, in a UTS namespace of its own too, under that hostname (as a container
    gets by default).
    """
    wrapper: tuple[str, ...] = UNSHARE
    if hostname is not None:
        rename = f'hostname {hostname} && exec "$0" "$@"'
        wrapper = (*UNSHARE[:2], "--uts", *UNSHARE[2:], "sh", "-c", rename)
    worker = location.worker(wrapper=wrapper)
    try:
        ready = worker.recv()
    except (EOFError, TimeoutError) as exc:
        worker.stop()
        raise AssertionError(
            f"`{' '.join(UNSHARE)}` could not start a worker ({exc}); this test needs PID "
            "namespaces (root, or unprivileged user namespaces) and must not be skipped"
        ) from exc
    word, pid, namespace, host = ready.split()
    assert (word, pid) == ("ready", "1"), ready  # pid 1: alone in a namespace of its own
    assert host == (hostname or socket.gethostname()), ready
    return worker, namespace


def kill_9(worker: Worker) -> None:
    """SIGKILL the worker itself (pid 1 of its namespace), not the ``unshare`` around it."""
    parent = worker.proc.pid
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    assert len(children) == 1, children
    os.kill(int(children[0]), signal.SIGKILL)
    assert worker.proc.wait(timeout=30) != 0  # unshare exits once its child is gone


@pytest.mark.parametrize("backend", ["sqlite", "jsonl"])
def test_owner_in_another_pid_namespace_is_live_until_killed(backend: str, tmp_path: Path) -> None:
    location = Location(backend, tmp_path)
    with_store(location, lambda store: seed(store, "stored"))
    first, first_ns = start_in_namespace(location)
    second: Worker | None = None
    try:
        second, second_ns = start_in_namespace(location)
        assert len({first_ns, second_ns, os.readlink("/proc/self/ns/pid")}) == 3

        assert first.ask("open stored") == "won 1"
        assert first.ask("create fresh") == "created"  # owned, never flushed
        for _ in range(3):  # (asked again: a refusal changes nothing)
            for command in ("open stored", "create fresh"):
                answer = second.ask(command)
                assert answer.startswith("owned-by "), answer

        async def refused(store: SessionStore) -> None:
            for attempt in (store.open("stored", "write"), store.create(header("fresh"))):
                with pytest.raises(SessionAlreadyOwnedError):
                    await attempt

        with_store(location, refused)  # from the root namespace, too

        kill_9(first)  # a crash: no release, no cleanup
        assert second.ask("open stored") == "won 1"  # taken over at once, across namespaces
        assert second.ask("create fresh") == "created"
        assert second.ask("append stored 1") == "appended"
        assert second.ask("release stored") == "released"
        assert second.ask("release fresh") == "released"
    finally:
        first.stop()
        if second is not None:
            second.stop()
    stored = with_store(location, lambda store: read_all(store, "stored"))
    assert [e.seq for e in stored] == [0, 1]
    assert stored[0] == ev(0)
    assert stored[1].data == {"by": "stale"}  # (what the worker's ``append`` writes)


def test_the_sqlite_refusal_names_the_other_namespace(tmp_path: Path) -> None:
    """The owner's pid is meaningless here, and the message says so."""
    location = Location("sqlite", tmp_path)
    with_store(location, lambda store: seed(store, "stored"))
    first, first_ns = start_in_namespace(location)
    try:
        assert first.ask("open stored") == "won 1"

        async def refused(store: SessionStore) -> str:
            with pytest.raises(SessionAlreadyOwnedError) as info:
                await store.open("stored", "write")
            return str(info.value.owner)

        owner = with_store(location, refused)
        assert (
            owner == f"pid 1 on host {socket.gethostname()} (in another PID namespace, {first_ns})"
        )
    finally:
        first.stop()


@pytest.mark.parametrize("backend", ["sqlite", "jsonl"])
def test_a_crashed_owner_under_another_hostname_is_taken_over_at_once(
    backend: str, tmp_path: Path
) -> None:
    """Containers get hostnames of their own: the lock, not the hostname, tells who is alive."""
    location = Location(backend, tmp_path)
    with_store(location, lambda store: seed(store, "stored"))
    worker, _ = start_in_namespace(location, hostname="container-a")
    try:
        assert worker.ask("open stored") == "won 1"

        async def refused(store: SessionStore) -> None:
            with pytest.raises(SessionAlreadyOwnedError):
                await store.open("stored", "write")

        with_store(location, refused)
        kill_9(worker)
    finally:
        worker.stop()

    async def take_over(store: SessionStore) -> None:
        handle = await store.open("stored", "write")  # at once: no lease, no waiting
        assert await handle.read() == [ev(0)]
        await handle.close()

    with_store(location, take_over)
