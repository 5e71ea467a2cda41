"""Shared harness of the fault corpus: a victim and a bystander in one runtime.

Every case runs two agents in one ``open_runtime``: the *victim* meets the fault, the
*bystander* does an ordinary scripted tool turn (``note`` then a text answer). After the runtime
block has exited normally, every stored log is read back from the store (a fresh store object
for file-backed stores) and must pass ``invariants.check``.

Only the public surface is used: the package root, ``dsh_agent_loop.testing`` and the CLI.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs

from dsh_agent_loop import (
    AgentHandle,
    AgentOptions,
    Event,
    JsonlStore,
    MemoryStore,
    Reply,
    ScriptedModel,
    SessionStore,
    SqliteStore,
    invariants,
    open_runtime,
    tool,
)
from tests.llm.agent_helpers import plain as plain  # re-exported for the corpus modules

VICTIM = "victim"
BYSTANDER = "bystander"
VICTIM_SESSION = "victim-session"
BYSTANDER_SESSION = "bystander-session"
LIMIT = 10.0
"""Seconds (virtual under autojump, real otherwise) a case may take before it fails."""
BYSTANDER_TEXT = "bystander done"


@tool
async def note(text: str) -> str:
    """Record a note."""
    return f"noted {text}"


def bystander_model() -> ScriptedModel:
    """A normal tool turn: call ``note``, then answer."""
    return ScriptedModel([Reply.tool_calls(("note", {"text": "b"})), Reply.text(BYSTANDER_TEXT)])


def turn_ends(events: Iterable[Event]) -> list[dict[str, Any]]:
    """The ``reason`` of every ``turn/end``, plain."""
    return [plain(e.data["reason"]) for e in events if e.type == "turn/end"]


def results(events: Iterable[Event]) -> list[dict[str, Any]]:
    """The data of every ``tool/result``, plain."""
    return [plain(e.data) for e in events if e.type == "tool/result"]


def answer_text(events: Sequence[Event]) -> str:
    """The text blocks of the last ``assistant/message``, joined."""
    for event in reversed(events):
        if event.type == "assistant/message":
            blocks = event.data["message"]["content"]
            return "".join(b["text"] for b in blocks if b["type"] == "text")
    raise AssertionError("no assistant/message in the log")


def last_assistant(events: Sequence[Event]) -> dict[str, Any]:
    for event in reversed(events):
        if event.type == "assistant/message":
            return plain(event.data)
    raise AssertionError("no assistant/message in the log")


def assert_well_formed(events: Sequence[Event], *, allow_open_turn: bool = False) -> None:
    violations = invariants.check(events, allow_open_turn=allow_open_turn)
    assert violations == [], [str(v) for v in violations]


def assert_bystander_ok(events: Sequence[Event]) -> None:
    """The bystander ran ``note`` cleanly and completed its turn with its answer."""
    ends = turn_ends(events)
    assert ends, "the bystander ended a turn"
    assert ends[-1] == {"kind": "completed"}, ends
    res = results(events)
    assert len(res) == 1, res
    assert res[0].get("error") is None, res
    assert "noted b" in json.dumps(res[0]["message"]["content"])
    assert answer_text(events) == BYSTANDER_TEXT


def is_strict_json(value: Any) -> bool:
    """True when ``value`` serialises as RFC 8259 JSON (no NaN/Infinity, only JSON types)."""
    try:
        json.dumps(plain(value), allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


# --- stores ------------------------------------------------------------------------------------


def make_store(kind: str, tmp_path: Path) -> SessionStore:
    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        return SqliteStore(tmp_path / "sessions.db")
    return JsonlStore(tmp_path / "sessions")


async def stored_log(
    store: SessionStore, kind: str, tmp_path: Path, session_id: str
) -> list[Event]:
    """The stored log of ``session_id``, read back after the runtime closed."""
    reader = store if kind == "memory" else make_store(kind, tmp_path)
    try:
        handle = await reader.open(session_id, "read")
        try:
            return list(await handle.read())
        finally:
            await handle.close()
    finally:
        if reader is not store:
            await reader.aclose()


# --- the pair ----------------------------------------------------------------------------------


@attrs.define
class Pair:
    """A runtime with a victim and a bystander, and the notifications seen."""

    rt: Any
    victim: AgentHandle
    bystander: AgentHandle
    errors: list[Event] = attrs.field(factory=list)
    """``agent/error`` notifications of every agent."""

    def victim_errors(self) -> list[dict[str, Any]]:
        return [plain(e.data) for e in self.errors if e.data.get("agent_id") == VICTIM]

    def bystander_errors(self) -> list[dict[str, Any]]:
        return [plain(e.data) for e in self.errors if e.data.get("agent_id") == BYSTANDER]

    async def run_both(self, victim_prompt: Any = "go") -> None:
        """Follow up both agents and wait until both are idle."""
        self.bystander.agent.followup("go")
        self.victim.agent.followup(victim_prompt)
        await self.victim.agent.wait_idle()
        await self.bystander.agent.wait_idle()


Setup = Callable[[Any, Any], Awaitable[None]]


@asynccontextmanager
async def open_pair(
    victim_model: Any,
    *,
    store: SessionStore,
    tools: Sequence[Any] = (),
    victim_setup: Setup | None = None,
    config: Mapping[str, Any] | None = None,
    victim_provider: str = "victim",
    victim_model_name: str = "m",
    rt_setup: Callable[[Any], None] | None = None,
    extra_providers: Mapping[str, Any] | None = None,
    **runtime_kwargs: Any,
) -> AsyncIterator[Pair]:
    """Open a runtime on ``store`` holding the bystander and the victim."""
    providers = {"bystander": bystander_model()}
    if victim_model is not None:
        providers[victim_provider] = victim_model
    providers.update(extra_providers or {})
    async with open_runtime(
        config, store=store, providers=providers, tools=[note, *tools], seed=0, **runtime_kwargs
    ) as rt:
        errors: list[Event] = []
        rt.hooks.on("agent/error", errors.append)
        if rt_setup is not None:
            rt_setup(rt)
        bystander = await rt.agents.create(
            session_id=BYSTANDER_SESSION,
            options=AgentOptions(id=BYSTANDER, provider="bystander", model="m", tools=("note",)),
        )
        victim = await rt.agents.create(
            session_id=VICTIM_SESSION,
            options=AgentOptions(id=VICTIM, provider=victim_provider, model=victim_model_name),
            setup=victim_setup,
        )
        yield Pair(rt, victim, bystander, errors)


async def check_stored(
    store: SessionStore,
    kind: str,
    tmp_path: Path,
    *,
    victim_open_turn: bool = False,
) -> tuple[list[Event], list[Event]]:
    """Read both logs back, check them, check the bystander; return (victim, bystander)."""
    victim = await stored_log(store, kind, tmp_path, VICTIM_SESSION)
    bystander = await stored_log(store, kind, tmp_path, BYSTANDER_SESSION)
    assert_well_formed(victim, allow_open_turn=victim_open_turn)
    assert_well_formed(bystander)
    assert_bystander_ok(bystander)
    return victim, bystander


def scripted_victim(*replies: Any) -> ScriptedModel:
    return ScriptedModel(list(replies))
