"""A worker's capacity across processes: ``max_agents`` back-pressure and idle unloading.

docs/design.md#fleet-workers: a worker never holds more than ``max_agents`` live agents (work
for other sessions waits, it is never dropped), and unloads an agent idle for
``idle_unload_s``, giving its session back; the next message activates it again.
"""

from __future__ import annotations

import trio

from dsh_agent_loop import AgentOptions
from dsh_agent_loop.fleet import FleetClient

from .conftest import Fleet, WorkerProc, check_log, read_log, wait_for


def options(agent_id: str) -> AgentOptions:
    return AgentOptions(id=agent_id, provider="scripted", model="m")


def live_by_lines(worker: WorkerProc) -> list[int]:
    """The worker's live agent count after each of its lines."""
    live, counts = 0, []
    for line in worker.lines:
        if " activated " in line or " took over " in line:
            live += 1
        elif " unloaded " in line or " dropped " in line:
            live -= 1
        counts.append(live)
    return counts


async def sample_live(client: FleetClient, samples: list[int]) -> None:
    while True:
        for worker in (await client.status()).workers:
            samples.append(worker.live_agents)
        await trio.sleep(0.05)


async def test_max_agents_back_pressure(fleet: Fleet) -> None:
    worker = await fleet.start_worker(
        "w1", "--max-agents", "2", "--idle-unload", "0.3", "--latency", "0.01"
    )
    async with fleet.client() as c:
        sids = [await c.create(options(f"a{i}")) for i in range(5)]
        samples: list[int] = []
        texts: dict[str, str] = {}

        async def run(sid: str) -> None:
            texts[sid] = (await c.run(sid, "slow 20", timeout=90)).text

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample_live, c, samples)
            async with trio.open_nursery() as runs:
                for sid in sids:
                    runs.start_soon(run, sid)
            nursery.cancel_scope.cancel()
        assert texts == {sid: " ".join(["slow"] * 20) for sid in sids}
        assert samples
        assert max(samples) <= 2, samples
        by_lines = live_by_lines(worker)
        assert max(by_lines) == 2, worker.output()  # full, never over
        for sid in sids:
            assert worker.has(f"activated {sid}")
            check_log(await read_log(c, sid))


async def test_idle_unload_and_reactivation(fleet: Fleet) -> None:
    worker = await fleet.start_worker("w1", "--idle-unload", "2")
    async with fleet.client() as c:
        sid = await c.create(options("a"))
        assert (await c.run(sid, "one", timeout=60)).text == "echo one"

        async def live_agents() -> bool:
            return [w.live_agents for w in (await c.status()).workers] == [1]

        await wait_for("live_agents 1", live_agents, timeout=30)
        await worker.wait_line(f"unloaded {sid}", timeout=30)

        async def none_live() -> bool:
            return [w.live_agents for w in (await c.status()).workers] == [0]

        await wait_for("live_agents 0", none_live, timeout=30)
        assert worker.count(f"activated {sid}") == 1
        assert (await c.run(sid, "two", timeout=60)).text == "echo two"
        assert worker.count(f"activated {sid}") == 2
        check_log(await read_log(c, sid))
