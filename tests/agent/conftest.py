"""Small helpers for the agent-layer tests: a runtime with one scripted agent, log queries."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from dsh_agent_loop import (
    AgentOptions,
    Event,
    MemoryStore,
    ScriptedModel,
    Tool,
    invariants,
    open_runtime,
    tool,
)

OPTIONS = AgentOptions(id="main", provider="scripted", model="m")


def types(events: Iterable[Event]) -> list[str]:
    """Event types in log order."""
    return [e.type for e in events]


def of_type(events: Iterable[Event], *wanted: str) -> list[Event]:
    """The events of the given types, in log order."""
    return [e for e in events if e.type in wanted]


def texts(message: Any) -> list[str]:
    """The texts of a message's text blocks."""
    return [b["text"] for b in message["content"] if b["type"] == "text"]


def user_texts(messages: Sequence[Any]) -> list[str]:
    """Texts of every user message, in order."""
    return ["".join(texts(m)) for m in messages if m["role"] == "user"]


def assert_well_formed(events: Sequence[Event]) -> None:
    """``invariants.check`` finds nothing (the open turn is not allowed either)."""
    violations = invariants.check(events, allow_open_turn=False)
    assert violations == [], [str(v) for v in violations]


def turn_ends(events: Iterable[Event]) -> list[dict[str, Any]]:
    """The ``reason`` of every ``turn/end`` as plain dicts."""
    return [_plain(e.data["reason"]) for e in events if e.type == "turn/end"]


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


plain = _plain


@attrs.define
class Harness:
    """A runtime with one agent on a scripted model."""

    rt: Any
    handle: Any
    model: ScriptedModel

    @property
    def agent(self) -> Any:
        return self.handle.agent

    @property
    def events(self) -> list[Event]:
        return self.agent.session.events

    def types(self) -> list[str]:
        return types(self.events)

    def of_type(self, *wanted: str) -> list[Event]:
        return of_type(self.events, *wanted)

    async def run(self, message: Any = "go") -> str:
        """Follow up with ``message`` and wait until the agent is idle."""
        message_id = self.agent.followup(message)
        await self.agent.wait_idle()
        return message_id

    async def stored(self) -> list[Event]:
        """What the store holds for this session (durable events only)."""
        reader = await self.rt.store.open(self.agent.session_id)
        try:
            return await reader.read()
        finally:
            await reader.close()


@asynccontextmanager
async def harness(
    replies: Sequence[Any] = (),
    *,
    model: ScriptedModel | None = None,
    latency: float = 0.0,
    system_prompt_update: Any = None,
    options: AgentOptions = OPTIONS,
    setup: Any = None,
    **runtime_kwargs: Any,
) -> AsyncIterator[Harness]:
    """Open a runtime (memory store, virtual clock) and create one agent."""
    if model is None:
        model = ScriptedModel(replies, latency=latency, system_prompt_update=system_prompt_update)
    runtime_kwargs.setdefault("store", MemoryStore())
    runtime_kwargs.setdefault("clock", trio.current_time)
    async with open_runtime(providers={"scripted": model}, **runtime_kwargs) as rt:
        handle = await rt.agents.create(options=options, setup=setup)
        yield Harness(rt, handle, model)


async def wait_until(predicate: Any, *, step: float = 0.001, limit: float = 1000.0) -> None:
    """Poll ``predicate`` on the virtual clock (autojump makes this instant)."""
    deadline = trio.current_time() + limit
    while not predicate():
        if trio.current_time() > deadline:
            raise AssertionError("condition never became true")
        await trio.sleep(step)


# -- parent and child agents (sub-agent and delegate tests) ----------------------------------
def parent_child_runtime(parent: Iterable[Any] = (), child: Iterable[Any] = (), **kwargs: Any):
    """A runtime with two scripted providers: ``p`` (the parent's) and ``c`` (the child's)."""
    kwargs.setdefault("store", MemoryStore())
    kwargs.setdefault("clock", trio.current_time)
    providers = {"p": ScriptedModel(list(parent)), "c": ScriptedModel(list(child))}
    return open_runtime(providers=providers, **kwargs)


def hanging_tool(started: trio.Event) -> Tool:
    """A tool ``hang`` that sets ``started`` and then waits until cancelled."""

    @tool
    async def hang() -> str:
        """Wait until cancelled."""
        started.set()
        await trio.sleep_forever()
        return "never"

    return hang


async def stored(rt: Any, session_id: str) -> list[Event]:
    """The events the store holds for ``session_id``."""
    handle = await rt.store.open(session_id)
    try:
        return await handle.read()
    finally:
        await handle.close()
