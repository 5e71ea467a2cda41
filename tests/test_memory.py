"""Memory per live agent (docs/design.md#scale): what an idle agent keeps after a 5-step turn.

The target is 100,000 agents in at most 2 GB of peak RSS, about 18 KB per agent all in. These
tests count the bytes Python allocates (``tracemalloc``) per idle agent after a turn of four
tool steps and a text step (32 events), which is most of that budget: the log's events and
their data, the agent's records and its parked task. Measured at the time of writing: about
14.9 KB per agent (15.7 KB before the payloads agents write alike were shared, 21.5 KB before
event data was stored as shared shapes and value tuples).
"""

from __future__ import annotations

import gc
import sys
import tracemalloc

import trio

from dsh_agent_loop._agent.options import AgentOptions
from dsh_agent_loop._frozen import FrozenDict, freeze
from dsh_agent_loop._runtime import open_runtime
from dsh_agent_loop._tools.base import tool
from dsh_agent_loop.llm._base import ModelRequest
from dsh_agent_loop.llm._scripted import Reply, ScriptedModel

AGENTS = 500
STEPS = 5  # four tool steps, then text
#: Bytes per idle agent; about 14.9 KB measured (15.7 KB before shared payloads, 21.5 KB
#: before compact event data).
BYTES_PER_AGENT = 17_000
#: Bytes of one event's data, on average, in such a log; about 144 measured (170 before shared
#: payloads, 350 before compact event data).
DATA_BYTES_PER_EVENT = 170


@tool
async def noop(n: int = 0) -> str:
    """Do nothing."""
    return "ok"


def _reply(request: ModelRequest) -> Reply:
    steps = sum(1 for m in request.messages if m["role"] == "assistant")
    return Reply.tool_calls(("noop", {"n": steps})) if steps < STEPS - 1 else Reply.text("done")


async def _bytes_per_idle_agent() -> tuple[float, int]:
    """(bytes allocated per idle agent after a STEPS-step turn each, events in one log)."""
    model = ScriptedModel([_reply], loop=True, record=False)
    async with open_runtime(providers={"s": model}, tools=[noop]) as rt:
        # One agent first, so what the runtime makes once (caches, shapes) is not counted.
        first = await rt.agents.create(options=AgentOptions(id="a-first", provider="s", model="m"))
        first.agent.followup("hello")
        await first.agent.wait_idle()
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            handles = []
            for i in range(AGENTS):
                options = AgentOptions(id=f"a-{i}", provider="s", model="m")
                handles.append(await rt.agents.create(options=options))
            for h in handles:
                h.agent.followup("hello")
            for h in handles:
                await h.agent.wait_idle()
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        return grown / AGENTS, len(handles[0].agent.session.events)


def test_an_idle_agent_after_a_five_step_turn_stays_under_its_byte_budget() -> None:
    per_agent, events = trio.run(_bytes_per_idle_agent)
    assert events == 32  # the turn this budget is for
    assert per_agent <= BYTES_PER_AGENT, per_agent


def _data_bytes(value: object, seen: set[int]) -> int:
    """Bytes of ``value``'s frozen JSON not in ``seen`` (shared parts counted once)."""
    if id(value) in seen:
        return 0
    seen.add(id(value))
    if type(value) is FrozenDict:
        # the shape is shared by every mapping with these keys: not this value's cost
        return sys.getsizeof(value) + _data_bytes(value._v, seen)
    if type(value) is tuple:
        return sys.getsizeof(value) + sum(_data_bytes(v, seen) for v in value)
    return sys.getsizeof(value)


def test_a_turns_event_data_is_compact() -> None:
    """The data of a 5-step turn's events: small frozen mappings, about half a dict's size."""

    async def main() -> tuple[float, int]:
        model = ScriptedModel([_reply], loop=True, record=False)
        async with open_runtime(providers={"s": model}, tools=[noop]) as rt:
            logs = []
            for i in range(2):  # the second agent's records that repeat are shared
                h = await rt.agents.create(
                    options=AgentOptions(id=f"a-{i}", provider="s", model="m")
                )
                h.agent.followup("hello")
                await h.agent.wait_idle()
                logs.append(h.agent.session.events)
            seen: set[int] = set()
            for event in logs[0]:
                _data_bytes(event.data, seen)
            events = logs[1]
            total = sum(_data_bytes(event.data, seen) for event in events)
            return total / len(events), len(events)

    per_event, events = trio.run(main)
    assert events == 32
    assert per_event <= DATA_BYTES_PER_EVENT, per_event


def test_a_frozen_dict_costs_about_half_a_dict() -> None:
    value = {"turn": 1, "step": 2, "call_id": "c-1", "name": "noop", "arguments": "{}"}
    frozen = freeze(value)
    own = sys.getsizeof(frozen) + sys.getsizeof(frozen._v)
    assert own * 2 <= sys.getsizeof(value) + 40, (own, sys.getsizeof(value))
    assert freeze(dict(value))._k is frozen._k  # the keys are shared, not copied
