"""Soak: client processes send thousands of messages to a thousand sessions across worker
processes while one worker is killed half-way (docs/design.md#fleet-workers).

Then every message id is in exactly one ``agent/inbox/spliced`` insert of its session's log,
each client's messages reach each session in the order its ``send`` calls returned, and every
log passes ``invariants.check``. It runs on SQLite (about 20 s on two cores);
``DSH_SOAK_BACKEND=postgres`` runs it on PostgreSQL instead.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path

import trio

from dsh_agent_loop import AgentOptions

from .conftest import Fleet, check_log, inserted_ids, open_fleet, read_log, wait_for

BACKEND = os.environ.get("DSH_SOAK_BACKEND", "sqlite")
MESSAGES, SESSIONS = 10_000, 1_000
CLIENTS, WORKERS = 4, 3
CLIENT = Path(__file__).with_name("client_proc.py")


async def create_sessions(fleet: Fleet, count: int) -> list[str]:
    sids: list[str] = []
    async with fleet.client() as c:

        async def create(lane: int) -> None:
            for i in range(lane, count, 8):
                opts = AgentOptions(id=f"s{i}", provider="scripted", model="m")
                sids.append(await c.create(opts, session_id=f"soak-{i}"))

        async with trio.open_nursery() as nursery:
            for lane in range(8):
                nursery.start_soon(create, lane)
    return sorted(sids)


async def test_soak_kill_a_worker_half_way(tmp_path: Path) -> None:
    async with open_fleet(BACKEND, tmp_path) as fleet:
        await soak(fleet, tmp_path)


async def soak(fleet: Fleet, tmp_path: Path) -> None:
    t0 = time.monotonic()
    # PostgreSQL: a lease that a CPU-starved worker (3 workers, 4 clients) still renews in time
    url = fleet.url_with(lease_ttl=10)
    workers = [await fleet.start_worker(f"w{i}", url=url) for i in range(WORKERS)]
    sids = await create_sessions(fleet, SESSIONS)
    (tmp_path / "sessions").write_text("\n".join(sids))
    clients = []
    for k in range(CLIENTS):
        cmd = [str(CLIENT), "--store", url, "--sessions", str(tmp_path / "sessions")]
        cmd += ["--count", str(MESSAGES // CLIENTS), "--tag", f"c{k}", "--seed", str(k)]
        cmd += ["--out", str(tmp_path / f"c{k}.out")]
        clients.append(await fleet.start_process(f"c{k}", cmd))
    t_sent = time.monotonic()
    for client in clients:
        await client.wait_line("HALF", timeout=120)
    victim = workers[0]
    victim.signal(signal.SIGKILL)
    assert await victim.wait_exit() == -signal.SIGKILL
    for client in clients:
        assert await client.wait_exit(timeout=300) == 0, client.output()
    t_clients = time.monotonic()
    async with fleet.client() as c:

        async def drained() -> bool:
            status = await c.status()
            return bool(status.undelivered == 0 and status.sessions_waiting == 0)

        await wait_for("every message delivered", drained, timeout=300, every=0.2)
        t_delivered = time.monotonic()
        took_over = sum(w.count("took over ") for w in workers[1:])
        assert took_over > 0, "nobody took over the killed worker's sessions"
        sent: dict[str, list[list[str]]] = defaultdict(list)  # sid -> per client, in order
        for k in range(CLIENTS):
            per_session: dict[str, list[str]] = defaultdict(list)
            for line in (tmp_path / f"c{k}.out").read_text().splitlines():
                sid, mid = line.split()
                per_session[sid].append(mid)
            for sid, mids in per_session.items():
                sent[sid].append(mids)
        total = 0
        for sid in sids:
            events = await read_log(c, sid)
            check_log(events)
            ids = inserted_ids(events)
            counts = Counter(ids)
            assert all(n == 1 for n in counts.values()), f"{sid}: inserted twice: {counts}"
            expected = {mid for mids in sent[sid] for mid in mids}
            assert set(counts) == expected, f"{sid}: lost {expected - set(counts)}"
            for mids in sent[sid]:
                mine = set(mids)
                assert [i for i in ids if i in mine] == mids, f"{sid}: out of order"
            total += len(ids)
        assert total == MESSAGES
    print(
        f"soak: {MESSAGES} messages, {SESSIONS} sessions, {WORKERS} workers (1 killed), "
        f"{CLIENTS} clients, {fleet.backend}: setup {t_sent - t0:.1f}s, "
        f"sends {t_clients - t_sent:.1f}s, "
        f"delivered +{t_delivered - t_clients:.1f}s, checks {time.monotonic() - t_delivered:.1f}s,"
        f" takeovers {took_over}"
    )
