"""Failover across processes: ``kill -9``, a worker paused past its lease, a graceful drain.

docs/design.md#fleet-workers: a killed worker's sessions are taken over once its heartbeat is
older than the lease, repaired by the crash closers, and answer again; a worker paused past its
lease (SIGSTOP) finds its sessions taken over when it wakes, drops them, and its late writes are
fenced, so the log never forks; a worker stopped with SIGTERM lets a running turn finish,
exits 0 and gives its sessions back at once.
"""

from __future__ import annotations

import signal
from collections import Counter

import trio

from dsh_agent_loop import AgentOptions, Event
from dsh_agent_loop.events import ASSISTANT_MESSAGE, TURN_START

from .conftest import (
    LEASE,
    PG_LEASE,
    Fleet,
    check_log,
    inserted_ids,
    open_turns,
    read_log,
    turn_ends,
    wait_log,
)


def options(agent_id: str) -> AgentOptions:
    return AgentOptions(id=agent_id, provider="scripted", model="m")


def started(events: list[Event]) -> bool:
    return any(e.type == TURN_START for e in events)


async def test_kill_9_mid_turn_then_takeover(fleet: Fleet) -> None:
    a = await fleet.start_worker("wa", "--latency", "0.05")
    async with fleet.client() as c:
        sid = await c.create(options("a"))
        await c.send(sid, "slow 400")  # 20 s of words
        await wait_log(c, sid, started, "the slow turn's start")
        await a.wait_line(f"activated {sid}")
        b = await fleet.start_worker("wb")
        a.signal(signal.SIGKILL)
        assert await a.wait_exit() == -signal.SIGKILL
        await b.wait_line(f"took over {sid} from wa", timeout=LEASE + 5)
        events = await wait_log(
            c, sid, lambda ev: bool(turn_ends(ev)), "the interrupted turn's end", timeout=30
        )
        check_log(events)
        assert not open_turns(events)
        (turn,) = [e.data["turn"] for e in events if e.type == TURN_START]
        assert turn in turn_ends(events), "no turn/end for the interrupted turn"
        result = await c.run(sid, "still there?", timeout=60)
        assert result.text == "echo still there?"
        check_log(await read_log(c, sid))


async def test_paused_worker_is_fenced(pg_fleet: Fleet) -> None:
    fleet = pg_fleet
    a = await fleet.start_worker("wa", "--latency", "0.05")
    async with fleet.client() as c:
        sid = await c.create(options("a"))
        await c.send(sid, "slow 200", message_id="m-slow")  # 10 s of words
        await wait_log(c, sid, started, "the slow turn's start")
        b = await fleet.start_worker("wb")
        a.signal(signal.SIGSTOP)
        try:
            await b.wait_line(f"took over {sid} from wa", timeout=PG_LEASE * 2 + 10)
            result = await c.run(sid, "who now", message_id="m-new", timeout=60)
            assert result.text == "echo who now"
        finally:
            a.signal(signal.SIGCONT)
        await a.wait_line(f"dropped {sid}", timeout=30)
        # let A get through whatever it would still do (its stream ends within 10 s)
        await trio.sleep(PG_LEASE)
        result = await c.run(sid, "and again", message_id="m-last", timeout=60)
        assert result.text == "echo and again"
        events = await read_log(c, sid)
        check_log(events)
        counts = Counter(inserted_ids(events))
        assert counts == {"m-slow": 1, "m-new": 1, "m-last": 1}, counts
        texts = [str(e.data) for e in events if e.type == ASSISTANT_MESSAGE]
        assert not any("slow slow" in t for t in texts), "A's late answer reached the log"
        assert all(r.get("cause") != "disposed" for r in turn_ends(events).values()), (
            "A's disposal closers reached the log"
        )
        assert a.proc.returncode is None, "A should live on, without the session"


async def test_graceful_drain(fleet: Fleet) -> None:
    # leases far longer than the test may wait: only a release lets B in
    url = fleet.url_with(lease_ttl=120)
    a = await fleet.start_worker("wa", "--latency", "0.05", url=url, lease=120)
    async with fleet.client() as c:
        sid = await c.create(options("a"))
        await c.run(sid, "hello", timeout=60)
        assert a.has(f"activated {sid}"), "A should own the session"
        b = await fleet.start_worker("wb", url=url, lease=120)
        await c.send(sid, "slow 40")  # 2 s of words
        await wait_log(c, sid, lambda ev: len([e for e in ev if e.type == TURN_START]) == 2, "t2")
        a.signal(signal.SIGTERM)
        assert await a.wait_exit() == 0, a.output()
        assert a.has("EXIT")
        events = await read_log(c, sid)
        reasons = turn_ends(events)
        assert len(reasons) == 2, reasons
        assert reasons[max(reasons)]["kind"] == "completed", reasons
        assert [w.worker_id for w in (await c.status()).workers] == ["wb"]
        with trio.fail_after(30):  # far less than the 120 s lease
            result = await c.run(sid, "next", timeout=60)
        assert result.text == "echo next"
        assert b.has(f"activated {sid}")
        check_log(await read_log(c, sid))
