"""What an idle agent leaves for the cyclic garbage collector to walk (docs/design.md#scale).

Every collection of the oldest generation walks every GC-tracked object in the process, so
with thousands of agents the per-agent count sets the cost of a step. The log's data is not
tracked at all (``Event`` and ``FrozenDict`` are ``msgspec`` structs declared ``gc=False``,
and the tuples and dicts holding only them are untracked by CPython); these tests count what
is left: ``len(gc.get_objects())`` after a collection, per agent, after a 5-step turn.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

import pytest

from dsh_agent_loop._agent.options import AgentOptions
from dsh_agent_loop._runtime import open_runtime
from dsh_agent_loop._session.store import SessionStore
from dsh_agent_loop._tools.base import tool
from dsh_agent_loop.llm._base import ModelRequest
from dsh_agent_loop.llm._scripted import Reply, ScriptedModel
from dsh_agent_loop.stores._memory import MemoryStore
from dsh_agent_loop.stores.sqlite._store import SqliteStore

AGENTS = 200
STEPS = 5  # four tool steps, then text

# The target: at most 40 tracked objects per idle agent. What is left (about 38) is the
# agent's parked task and its nursery (trio's Task, Context, CancelStatus, CancelScope,
# Nursery, NurseryManager and their sets and lists, the parked coroutine chain), the session
# log's own containers, the writer and store handle, and the agent's records (the Agent façade
# and its AgentActor, AgentHandle, AgentOptions, AgentScope, HookChain, Inbox, AssemblyCache,
# RequestSeries, Workspace). The event data, the events and the per-agent caches are not
# tracked or are shared (alike agents share one permission Gate).
TARGET = 40
LIMITS = {"memory": TARGET, "sqlite": TARGET}


@tool
async def noop() -> str:
    """Do nothing."""
    return "ok"


_CALL = Reply.tool_calls(("noop", {}))
_DONE = Reply.text("done")


def _reply(request: ModelRequest) -> Reply:
    # The same two Reply objects every time: the scripted model keeps one plan per reply.
    assistant = sum(1 for m in request.messages if m["role"] == "assistant")
    return _CALL if assistant < STEPS - 1 else _DONE


async def _tracked_per_idle_agent(store: SessionStore) -> tuple[float, int]:
    """(tracked objects per agent after a STEPS-step turn each, events in one agent's log)."""
    model = ScriptedModel([_reply], loop=True, record=False)
    async with open_runtime(store=store, providers={"s": model}, tools=[noop]) as rt:
        # One agent first, so whatever the runtime makes once (caches, the commit timer's
        # structures, the store's connections) is made before counting.
        warm = await rt.agents.create(options=AgentOptions(id="warm", provider="s", model="m"))
        warm.agent.followup("go")
        await warm.agent.wait_idle()
        gc.collect()
        before = len(gc.get_objects())
        handles = [
            await rt.agents.create(options=AgentOptions(id=f"a{i}", provider="s", model="m"))
            for i in range(AGENTS)
        ]
        for h in handles:
            h.agent.followup("go")
        for h in handles:
            await h.agent.wait_idle()
        for h in handles:
            await h.agent.flush()
        gc.collect()
        per_agent = (len(gc.get_objects()) - before) / AGENTS
        events = len(handles[0].agent.session.events)
        assert all(h.agent.statistics().steps == STEPS for h in handles)
    return per_agent, events


@pytest.mark.parametrize(
    ("name", "make_store"),
    [
        ("memory", lambda tmp: MemoryStore()),
        ("sqlite", lambda tmp: SqliteStore(tmp / "gc.db")),
    ],
)
async def test_an_idle_agent_leaves_few_tracked_objects(
    name: str, make_store: Callable[[Path], SessionStore], tmp_path: Path
) -> None:
    per_agent, events = await _tracked_per_idle_agent(make_store(tmp_path))
    assert events >= 30  # the turn really ran: its whole log is alive and not counted
    assert per_agent <= LIMITS[name], f"{per_agent:.1f} tracked objects per idle agent"
    assert LIMITS[name] <= TARGET  # the limit is the target, never above it


def _clock() -> float:
    return 0.0


def test_a_session_log_alone_is_invisible_to_the_collector() -> None:
    """The log's part: a session with a whole turn's events adds only its own containers."""
    from dsh_agent_loop._frozen import freeze
    from dsh_agent_loop._session.log import Session
    from dsh_agent_loop.events import Event

    def build() -> Session:
        session = Session({"session_id": "s"}, clock=_clock)  # one clock: not counted
        session.append(
            Event("turn/start", None, 0.0, {"turn": 1}),
            Event(
                "user/message",
                None,
                0.0,
                {"message": {"id": "m-1", "role": "user", "content": [{"type": "text"}]}},
            ),
        )
        for step in range(1, 5):
            session.add("step/start", freeze({"turn": 1, "step": step}))
            content = ({"type": "tool-call", "call_id": f"c{step}", "name": "noop"},)
            message = {"role": "assistant", "content": content}
            session.add("assistant/message", freeze({"turn": 1, "message": message}))
            session.add("tool/call", freeze({"call_id": f"c{step}", "name": "noop"}))
            result = {"role": "tool", "content": ({"type": "tool-result", "text": "ok"},)}
            session.add("tool/result", freeze({"message": result}), source_event_seqs=(0,))
            session.add("step/end", freeze({"turn": 1, "step": step}))
        session.add("turn/end", freeze({"turn": 1, "reason": {"kind": "completed"}}))
        session.take_pending()
        return session

    build()  # anything made once
    gc.collect()
    before = len(gc.get_objects())
    sessions = [build() for _ in range(50)]
    # A tuple holding a tuple (a message's values holding its content) is untracked by the
    # second collection that sees it: CPython orders the inner one after the outer one in the
    # first. A running process does the same in its young generations (0, then 1), before
    # anything reaches the oldest one.
    gc.collect()
    gc.collect()
    per_session = (len(gc.get_objects()) - before - 1) / len(sessions)  # - the list `sessions`
    assert len(sessions[0]) == 23
    # Session, its event list and the surface's two lists (entries, messages): the events,
    # their data, the projections and the inbox's lists are all untracked.
    assert per_session <= 4, per_session
