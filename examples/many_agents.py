"""A seeded many-agent simulation on a real store, checked event by event.

N agents share one runtime and one ``SqliteStore`` file (one writer connection for all of
their sessions, group commit). Each agent gets its own scripted model whose replies — text,
tool calls, a transient ``HTTP_5XX`` that the default policy retries — are drawn from a
seeded random source, so a run is repeatable. After the runtime closes, every session is read
back from the database and checked with ``invariants.check``; then the whole simulation runs a
second time on a fresh database and the logs are compared (session ids are fixed here, and
timestamps are left out of the comparison).

    python examples/many_agents.py [N] [SEED]
"""

import os
import random
import sys
import tempfile
import time

import trio

from dsh_agent_loop import (
    AgentOptions,
    Reply,
    ScriptedModel,
    SqliteStore,
    invariants,
    open_runtime,
    tool,
)


@tool
async def add(a: int, b: int) -> str:
    """Add two integers."""
    await trio.lowlevel.checkpoint()
    return str(a + b)


@tool(execution_mode="exclusive")
async def record(text: str) -> str:
    """Record a line in the agent's notebook (exclusive)."""
    await trio.lowlevel.checkpoint()
    return "recorded"


def script(rng: random.Random, turns: int) -> list[Reply]:
    """Replies for one agent: per turn, maybe a retried failure, maybe tools, then text."""
    replies = []
    for turn in range(turns):
        if rng.random() < 0.1:
            replies.append(Reply.error("HTTP_5XX", "overloaded", after_text="Let me"))
        if rng.random() < 0.7:
            calls = [
                ("add", {"a": rng.randint(0, 99), "b": rng.randint(0, 99)})
                for _ in range(rng.randint(1, 3))
            ]
            if rng.random() < 0.5:
                calls.insert(rng.randint(0, len(calls)), ("record", {"text": f"turn {turn}"}))
            replies.append(Reply.tool_calls(*calls))
        replies.append(Reply.text(f"Turn {turn} done after {rng.randint(1, 9)} thoughts."))
    return replies


async def simulate(path: str, agents: int, turns: int, seed: int) -> dict[str, list]:
    rng = random.Random(seed)
    models = {f"model-{n}": ScriptedModel(script(rng, turns)) for n in range(agents)}
    async with open_runtime(
        store=SqliteStore(path), providers=models, tools=[add, record], seed=seed
    ) as rt:
        handles = []
        for n in range(agents):
            options = AgentOptions(id=f"sim-{n}", provider=f"model-{n}", model="scripted")
            handles.append(await rt.agents.create(session_id=f"sim-{n}-session", options=options))

        async def run_agent(agent) -> None:
            for turn in range(turns):
                agent.followup(f"Task {turn} for {agent.id}")
                await agent.wait_idle()

        async with trio.open_nursery() as nursery:
            for handle in handles:
                nursery.start_soon(run_agent, handle.agent)
        print(f"  commits: {rt.store.statistics()}")

    # Read every session back from the file, with a fresh store.
    logs = {}
    async with SqliteStore(path) as store:
        for info in await store.list():
            reader = await store.open(info.session_id, "read")
            logs[info.session_id] = await reader.read()
            await reader.close()
    return logs


def summarise(logs: dict[str, list], turns: int) -> None:
    ends: dict[str, int] = {}
    tool_results = events = 0
    for session_id, log in logs.items():
        violations = invariants.check(log, allow_open_turn=False)
        assert violations == [], (session_id, violations)
        for event in log:
            if event.type == "turn/end":
                kind = event.data["reason"]["kind"]
                ends[kind] = ends.get(kind, 0) + 1
            tool_results += event.type == "tool/result"
        events += len(log)
    print(f"  sessions: {len(logs)}  events: {events}  tool results: {tool_results}")
    print(f"  turn ends: {ends}")
    assert ends == {"completed": len(logs) * turns}, ends


def comparable(logs: dict[str, list]) -> dict[str, list]:
    return {sid: [(e.type, e.seq, e.data) for e in log] for sid, log in logs.items()}


async def main(agents: int, seed: int) -> None:
    turns = 2
    with tempfile.TemporaryDirectory(prefix="dsh-many-agents-") as tmp:
        started = time.perf_counter()
        first = await simulate(os.path.join(tmp, "run1.db"), agents, turns, seed)
        print(f"run 1: {agents} agents x {turns} turns in {time.perf_counter() - started:.2f}s")
        summarise(first, turns)
        second = await simulate(os.path.join(tmp, "run2.db"), agents, turns, seed)
        assert comparable(first) == comparable(second), "the seeded runs differ"
        print("run 2: identical logs (same seed)")


if __name__ == "__main__":
    n_agents = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    trio.run(main, n_agents, seed)
