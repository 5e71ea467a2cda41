"""Fault corpus: raising hooks and observers (docs/design.md#hooks).

A raising ``on`` observer is logged and isolated: the victim's turn still completes. Raising
middleware, serial hooks and tool-pipeline hooks end the victim's turn ``error`` with code
``HOOK_FAILED`` plus an ``agent/error`` notification; the bystander never notices. A hook that
disposes its own agent completes without deadlock; a vetoing ``session/created`` listener makes
``create`` raise and leaves nothing behind.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio

from dsh_agent_loop import AgentLoopError, AgentOptions, MemoryStore, Reply, ScriptedModel

from ._kit import (
    LIMIT,
    VICTIM,
    answer_text,
    check_stored,
    make_store,
    open_pair,
    results,
    scripted_victim,
    turn_ends,
)

VICTIM_TEXT = "victim done"


class HookBoom(Exception):
    """What the hostile listeners raise."""


def victim_model() -> Any:
    """A tool turn (``note``) then a text answer."""
    return scripted_victim(Reply.tool_calls(("note", {"text": "v"})), Reply.text(VICTIM_TEXT))


def raise_boom(*_: Any) -> None:
    raise HookBoom("listener exploded")


class Raiser:
    """A raising observer that counts its calls (so a case cannot pass without the fault)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, event: Any) -> None:
        self.calls += 1
        raise HookBoom("observer exploded")


async def raise_boom_async(*_: Any) -> Any:
    await trio.lowlevel.checkpoint()
    raise HookBoom("listener exploded")


def _logged(caplog: pytest.LogCaptureFixture) -> bool:
    return any(
        r.levelno >= logging.WARNING and r.exc_info and isinstance(r.exc_info[1], HookBoom)
        for r in caplog.records
    )


OBSERVED = [
    "agent/assistant-stream",
    "session/event",
    "agent/status",
    "agent/inbox/inserted",
    "agent/inbox/claimed",
]


@pytest.mark.parametrize("name", OBSERVED)
async def test_raising_scoped_observer(
    name: str, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    raiser = Raiser()

    async def setup(scope: Any, agent: Any) -> None:
        scope.hooks.on(name, raiser)

    store = MemoryStore()
    with trio.fail_after(LIMIT):
        async with open_pair(victim_model(), store=store, victim_setup=setup) as pair:
            await pair.run_both()
            assert pair.victim_errors() == []
            assert pair.rt.agents.get(VICTIM) is pair.victim.agent
    victim, _ = await check_stored(store, "memory", Path())
    assert turn_ends(victim) == [{"kind": "completed"}]
    assert answer_text(victim) == VICTIM_TEXT
    assert raiser.calls > 0, f"no {name} notification reached the observer"
    assert _logged(caplog), "a raising observer is logged"


RUNTIME_OBSERVED = [
    "agent/created",
    "agent/session-start",
    "agent/status",
    "session/event",
    "agent/assistant-stream",
    "agent/disposed",
    "session/disposed",
]


@pytest.mark.parametrize("name", RUNTIME_OBSERVED)
async def test_raising_runtime_observer(
    name: str, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    """An observer that raises for every agent kills none of them."""
    store = MemoryStore()
    raiser = Raiser()
    with trio.fail_after(LIMIT):
        async with open_pair(
            victim_model(), store=store, rt_setup=lambda rt: rt.hooks.on(name, raiser)
        ) as pair:
            await pair.run_both()
            assert pair.victim_errors() == []
            assert pair.bystander_errors() == []
    victim, _ = await check_stored(store, "memory", Path())
    assert turn_ends(victim) == [{"kind": "completed"}]
    assert answer_text(victim) == VICTIM_TEXT
    # The creation notifications of both agents, or every later one, reached it.
    assert raiser.calls >= 2, f"{name}: {raiser.calls} calls"
    assert _logged(caplog), "a raising observer is logged"


def _waterfall(name: str) -> Any:
    async def setup(scope: Any, agent: Any) -> None:
        scope.hooks.waterfall(name, raise_boom_async)

    return setup


def _serial(name: str) -> Any:
    async def setup(scope: Any, agent: Any) -> None:
        scope.hooks.serial(name, raise_boom_async)

    return setup


FAILING_HOOKS = {
    "pre_step_waterfall": _waterfall("agent/pre-step"),
    "request_waterfall": _waterfall("agent/request"),
    "assemble_waterfall": _waterfall("system-prompt/assemble"),
    "runtime_context_waterfall": _waterfall("runtime-context/collect"),
    "tools_pre_execute_waterfall": _waterfall("tools/pre-execute"),
    "tools_execute_waterfall": _waterfall("tools/execute"),
    "tools_post_execute_waterfall": _waterfall("tools/post-execute"),
    "turn_stopping_serial": _serial("agent/turn-stopping"),
}


@pytest.mark.parametrize("store_kind", ["memory", "sqlite"])
@pytest.mark.parametrize("case", sorted(FAILING_HOOKS))
async def test_raising_hook_ends_turn(case: str, store_kind: str, tmp_path: Path) -> None:
    store = make_store(store_kind, tmp_path)
    with trio.fail_after(LIMIT):
        async with open_pair(victim_model(), store=store, victim_setup=FAILING_HOOKS[case]) as pair:
            await pair.run_both()
            errors = pair.victim_errors()
            assert [e["error"]["code"] for e in errors] == ["HOOK_FAILED"], errors
            assert "listener exploded" in errors[0]["error"]["message"]
            assert pair.bystander_errors() == []
            # The agent survives its failed turn: a later turn runs.
            assert pair.rt.agents.get(VICTIM) is pair.victim.agent
    victim, _ = await check_stored(store, store_kind, tmp_path)
    ends = turn_ends(victim)
    assert len(ends) == 1
    assert ends[0]["kind"] == "error", ends
    assert ends[0]["error"]["code"] == "HOOK_FAILED", ends
    for result in results(victim):  # any dispatched-or-not call got its result
        assert "message" in result


@pytest.mark.parametrize("kind", ["pre_step", "turn_stopping", "request"])
async def test_hook_disposes_own_agent(kind: str, autojump_clock: trio.testing.MockClock) -> None:
    handles: dict[str, Any] = {}
    done = trio.Event()

    async def dispose_self() -> None:
        try:
            await handles["victim"].dispose()
        finally:
            done.set()

    async def waterfall(payload: Any, next: Any) -> Any:
        await dispose_self()
        return await next(payload)

    async def serial(payload: Any) -> None:
        await dispose_self()

    async def setup(scope: Any, agent: Any) -> None:
        if kind == "pre_step":
            scope.hooks.waterfall("agent/pre-step", waterfall)
        elif kind == "request":
            scope.hooks.waterfall("agent/request", waterfall)
        else:
            scope.hooks.serial("agent/turn-stopping", serial)

    store = MemoryStore()
    with trio.fail_after(LIMIT):
        async with open_pair(victim_model(), store=store, victim_setup=setup) as pair:
            handles["victim"] = pair.victim
            pair.bystander.agent.followup("go")
            pair.victim.agent.followup("go")
            await done.wait()
            await pair.victim.dispose()
            await pair.bystander.agent.wait_idle()
            assert pair.rt.agents.get(VICTIM) is None
    victim, _ = await check_stored(store, "memory", Path())
    ends = turn_ends(victim)
    assert len(ends) == 1
    assert ends[0] == {"kind": "aborted", "cause": "disposed"}, ends


async def test_session_created_veto(autojump_clock: trio.testing.MockClock) -> None:
    """A raising ``session/created`` listener vetoes: create raises, nothing is left behind."""
    store = MemoryStore()
    with trio.fail_after(LIMIT):
        # a victim model: create() refuses a provider nobody registered
        async with open_pair(ScriptedModel([]), store=store) as pair:
            pair.bystander.agent.followup("go")
            dispose = pair.rt.hooks.on("session/created", raise_boom)
            with pytest.raises((HookBoom, AgentLoopError)) as info:
                await pair.rt.agents.create(
                    session_id="vetoed-session",
                    options=AgentOptions(id="vetoed", provider="bystander", model="m"),
                )
            if isinstance(info.value, AgentLoopError):
                assert info.value.code
            assert pair.rt.agents.get("vetoed") is None
            assert await store.stat("vetoed-session") is None
            dispose()
            # Same id again: ownership was released, nothing blocks a retry.
            again = await pair.rt.agents.create(
                session_id="vetoed-session",
                options=AgentOptions(id="vetoed", provider="victim", model="m"),
            )
            await again.dispose()
            await pair.bystander.agent.wait_idle()
    await check_stored(store, "memory", Path())
