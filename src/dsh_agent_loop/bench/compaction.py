"""The compaction benchmark: context accounting and one compaction, without the model call.

Run ``python -m dsh_agent_loop.bench.compaction [--messages N] [--quick] [--json PATH]`` (in a
source checkout, ``scripts/bench/compaction.py`` is a wrapper around it), or ``dsh-agent bench``.

- ``compact_ms``: one ``agent.compact()`` over a history of N derived messages (default 1,000:
  user questions, assistant answers, and every third turn a tool call and its result), with a
  summarizer that returns at once, so what is timed is the runtime's own work: planning the
  range, the token estimates before and after, the replacement event and its surface fold.
  Each round forks a fresh agent from the same stored history; best and median of 7 rounds
  (3 with ``--quick``).
- ``usage_us``: one ``agent.context_usage()`` on that history (the estimate the policy makes
  before every step).
- ``w1_policy_us_per_step`` / ``w1_plain_us_per_step``: 1,000 steps of one tool call each with
  a compaction policy that never triggers, and without one (what the check costs per step).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import trio

from dsh_agent_loop import (
    AgentOptions,
    CompactionPolicy,
    MemoryStore,
    Reply,
    ScriptedModel,
    open_runtime,
    tool,
)
from dsh_agent_loop.llm import ModelRequest


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


async def instant(messages: Sequence[Any], instructions: str | None) -> str:
    """A summarizer that costs nothing (the model call is not what is measured)."""
    return f"summary of {len(messages)} messages"


def _history_reply(request: ModelRequest) -> Reply:
    last = request.messages[-1]
    if last["role"] == "user" and str(last["content"][0].get("text", "")).startswith("tool"):
        return Reply.tool_calls(("lookup", {"key": "k"}))
    return Reply.text("an answer of a few words " * 4)


async def _compaction(messages: int, rounds: int) -> dict[str, float]:
    model = ScriptedModel([_history_reply], loop=True, record=False)
    policy = CompactionPolicy(keep_recent_turns=2, summarizer=instant)
    async with open_runtime(
        store=MemoryStore(), providers={"s": model}, tools=[lookup], compaction=policy
    ) as rt:
        base = await rt.agents.create(options=AgentOptions(id="base", provider="s", model="m"))
        n = 0
        while len(base.agent.session.derive_messages()) < messages:
            await base.agent.run(("tool " if n % 3 == 0 else "question ") + f"{n}")
            n += 1
        history = list(base.agent.session.events)
        size = len(base.agent.session.derive_messages())
        compact_ms: list[float] = []
        usage_us: list[float] = []
        for r in range(rounds):
            handle = await rt.agents.create(
                options=AgentOptions(id=f"fork-{r}", provider="s", model="m"),
                inherited_events=history,
            )
            agent = handle.agent
            started = time.perf_counter()
            for _ in range(100):
                agent.context_usage()
            usage_us.append((time.perf_counter() - started) / 100 * 1e6)
            started = time.perf_counter()
            done = await agent.compact()
            compact_ms.append((time.perf_counter() - started) * 1e3)
            assert done is not None
            await handle.dispose()
    return {
        "messages": float(size),
        "compact_ms_best": min(compact_ms),
        "compact_ms_median": statistics.median(compact_ms),
        "usage_us_best": min(usage_us),
    }


async def _w1(policy: CompactionPolicy | None, steps: int = 1000) -> float:
    count = 0

    def reply(request: ModelRequest) -> Reply:
        nonlocal count
        count += 1
        return Reply.tool_calls(("lookup", {"key": "k"})) if count % steps else Reply.text("done")

    model = ScriptedModel([reply], loop=True, record=False, context_window=10_000_000)
    async with open_runtime(
        store=MemoryStore(), providers={"s": model}, tools=[lookup], compaction=policy
    ) as rt:
        handle = await rt.agents.create(options=AgentOptions(id="w1", provider="s", model="m"))
        started = time.perf_counter()
        await handle.agent.run("go")
        return (time.perf_counter() - started) / steps * 1e6


def run_compaction_bench(quick: bool = False, messages: int = 1000) -> dict[str, float]:
    """The figures (``dsh-agent bench`` tabulates them)."""
    rounds = 3 if quick else 7
    figures = trio.run(_compaction, messages, rounds)
    repeats = 3 if quick else 5
    figures["w1_plain_us_per_step"] = min(trio.run(_w1, None) for _ in range(repeats))
    figures["w1_policy_us_per_step"] = min(
        trio.run(_w1, CompactionPolicy()) for _ in range(repeats)
    )
    return figures


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print (or write) its figures."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=1000, help="history size (messages)")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and repeats")
    parser.add_argument("--json", metavar="PATH", default=None, help="write the figures as JSON")
    args = parser.parse_args(argv)
    figures = run_compaction_bench(args.quick, args.messages)
    for key, value in figures.items():
        print(f"{key:28} {value:10.1f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(figures, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
