"""Fault corpus: outer cancellation and closed agents (docs/design.md#shutdown).

Cancelling the scope around ``open_runtime`` while agents are mid-turn stores every closer
(the interrupted anchor, synthetic results, ``step/end``, ``turn/end {aborted}``) and lets a
plain ``trio.Cancelled`` — never an exception group — reach the enclosing scope. Messages sent to
a disposed agent raise ``AgentClosedError``, an ``AgentLoopError``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import dsh_agent_loop
from dsh_agent_loop import AgentLoopError, AgentOptions, MemoryStore, Reply, ScriptedModel, tool

from ._kit import (
    BYSTANDER,
    BYSTANDER_SESSION,
    LIMIT,
    VICTIM,
    VICTIM_SESSION,
    assert_bystander_ok,
    assert_well_formed,
    bystander_model,
    last_assistant,
    make_store,
    note,
    open_pair,
    plain,
    results,
    stored_log,
    turn_ends,
)

TOOLER = "tooler"
TOOLER_SESSION = "tooler-session"
PARTIAL = "partial answer"


async def _outer_cancel(store: Any) -> BaseException | None:
    """Run three agents; cancel the scope around the runtime with two of them mid-turn."""
    tool_started = trio.Event()
    streamed = trio.Event()

    @tool
    async def wait_forever() -> str:
        """Wait until cancelled."""
        tool_started.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    def on_stream(event: Any) -> None:
        if event.data.get("agent_id") == VICTIM and event.data.get("frame") == "chunk":
            streamed.set()

    providers = {
        "bystander": bystander_model(),
        "victim": ScriptedModel([Reply.hang(after_text=PARTIAL)]),
        "tooler": ScriptedModel([Reply.tool_calls(("wait_forever", {}))]),
    }
    escaped: BaseException | None = None
    with trio.CancelScope() as outer:
        try:
            async with open_runtime_with(store, providers, [note, wait_forever]) as rt:
                rt.hooks.on("agent/assistant-stream", on_stream)
                handles = {}
                for agent_id, session_id in (
                    (BYSTANDER, BYSTANDER_SESSION),
                    (VICTIM, VICTIM_SESSION),
                    (TOOLER, TOOLER_SESSION),
                ):
                    handles[agent_id] = await rt.agents.create(
                        session_id=session_id,
                        options=AgentOptions(id=agent_id, provider=agent_id, model="m"),
                    )
                handles[BYSTANDER].agent.followup("go")
                await handles[BYSTANDER].agent.wait_idle()
                handles[VICTIM].agent.followup("go")
                handles[TOOLER].agent.followup("go")
                await streamed.wait()
                await tool_started.wait()
                await trio.sleep(0.01)  # let the rest of the partial answer stream
                outer.cancel()
                await trio.sleep_forever()
        except BaseException as exc:
            escaped = exc
            raise
    assert outer.cancelled_caught
    return escaped


def open_runtime_with(store: Any, providers: dict[str, Any], tools: list[Any]) -> Any:
    return dsh_agent_loop.open_runtime(store=store, providers=providers, tools=tools, seed=0)


async def _check_outer_cancel_logs(store: Any, kind: str, tmp_path: Path) -> None:
    bystander = await stored_log(store, kind, tmp_path, BYSTANDER_SESSION)
    assert_well_formed(bystander)
    assert_bystander_ok(bystander)

    victim = await stored_log(store, kind, tmp_path, VICTIM_SESSION)
    assert_well_formed(victim)
    (end,) = turn_ends(victim)
    assert end["kind"] == "aborted", end
    anchor = last_assistant(victim)
    assert anchor.get("interrupted") is True, anchor
    text = "".join(b["text"] for b in anchor["message"]["content"] if b["type"] == "text")
    assert text, "the delivered prefix is kept"
    assert PARTIAL.startswith(text), text
    types = [e.type for e in victim]
    assert types[-2:] == ["step/end", "turn/end"], types

    tooler = await stored_log(store, kind, tmp_path, TOOLER_SESSION)
    assert_well_formed(tooler)
    (end,) = turn_ends(tooler)
    assert end["kind"] == "aborted", end
    (result,) = results(tooler)
    assert plain(result)["error"]["code"] == "ABORTED", result
    types = [e.type for e in tooler]
    assert types[-2:] == ["step/end", "turn/end"], types


async def test_outer_cancel_memory(autojump_clock: trio.testing.MockClock) -> None:
    store = MemoryStore()
    with trio.fail_after(LIMIT):
        escaped = await _outer_cancel(store)
    assert type(escaped) is trio.Cancelled, repr(escaped)
    await _check_outer_cancel_logs(store, "memory", Path())


@pytest.mark.parametrize("store_kind", ["sqlite", "jsonl"])
async def test_outer_cancel_file_store(store_kind: str, tmp_path: Path) -> None:
    store = make_store(store_kind, tmp_path)
    with trio.fail_after(LIMIT):
        escaped = await _outer_cancel(store)
    assert type(escaped) is trio.Cancelled, repr(escaped)
    await _check_outer_cancel_logs(store, store_kind, tmp_path)


async def test_move_on_after_around_runtime(autojump_clock: trio.testing.MockClock) -> None:
    """A deadline around the runtime block: same closers, nothing leaks past ``move_on_after``."""
    store = MemoryStore()
    model = ScriptedModel([Reply.hang(after_text=PARTIAL)])
    with trio.fail_after(LIMIT):
        with trio.move_on_after(5) as deadline:
            async with open_pair(model, store=store) as pair:
                pair.bystander.agent.followup("go")
                await pair.bystander.agent.wait_idle()
                pair.victim.agent.followup("go")
                await trio.sleep_forever()
    assert deadline.cancelled_caught
    victim = await stored_log(store, "memory", Path(), VICTIM_SESSION)
    assert_well_formed(victim)
    (end,) = turn_ends(victim)
    assert end["kind"] == "aborted", end
    assert last_assistant(victim).get("interrupted") is True


# --- closed agents ------------------------------------------------------------------------------


def _closed_error() -> type[BaseException]:
    error = getattr(dsh_agent_loop, "AgentClosedError", None)
    assert error is not None, "AgentClosedError is exported from the package root"
    assert issubclass(error, AgentLoopError)
    return error  # type: ignore[no-any-return]


SENDS = {
    "followup": lambda agent: agent.followup("late"),
    "steer": lambda agent: agent.steer("late"),
    "inject": lambda agent: agent.inject("late"),
    "send": lambda agent: agent.send("late"),
    "send_next_step": lambda agent: agent.send("late", "next-step", False),
}


@pytest.mark.parametrize("method", sorted(SENDS))
async def test_send_to_disposed_agent(method: str, autojump_clock: trio.testing.MockClock) -> None:
    closed = _closed_error()
    store = MemoryStore()
    with trio.fail_after(LIMIT):
        async with open_pair(
            ScriptedModel([Reply.text("first"), Reply.text("second")]), store=store
        ) as pair:
            pair.victim.agent.followup("go")
            await pair.victim.agent.wait_idle()
            await pair.victim.dispose()
            with pytest.raises(closed) as info:
                SENDS[method](pair.victim.agent)
            assert info.value.code  # type: ignore[attr-defined]
            # The bystander is untouched by the refused send.
            pair.bystander.agent.followup("go")
            await pair.bystander.agent.wait_idle()
    victim = await stored_log(store, "memory", Path(), VICTIM_SESSION)
    assert_well_formed(victim)
    assert turn_ends(victim) == [{"kind": "completed"}]
    assert not any(
        e.type == "agent/inbox/spliced" and "late" in repr(plain(e.data)) for e in victim
    ), "nothing was queued on the disposed agent"
    bystander = await stored_log(store, "memory", Path(), BYSTANDER_SESSION)
    assert_bystander_ok(bystander)


async def test_send_after_runtime_closed(autojump_clock: trio.testing.MockClock) -> None:
    closed = _closed_error()
    store = MemoryStore()
    with trio.fail_after(LIMIT):
        async with open_pair(ScriptedModel([Reply.text("only")]), store=store) as pair:
            pair.bystander.agent.followup("go")
            await pair.bystander.agent.wait_idle()
            agent = pair.victim.agent
    with pytest.raises(closed):
        agent.followup("after the runtime")
    victim = await stored_log(store, "memory", Path(), VICTIM_SESSION)
    assert_well_formed(victim)
