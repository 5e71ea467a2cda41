"""The shipped pytest plugin: ``runtime`` and ``scripted_model`` fixtures."""

from __future__ import annotations

import trio

from dsh_agent_loop import AgentOptions, MemoryStore, Reply, invariants


async def test_runtime_fixture_runs_a_turn_on_the_scripted_model(
    runtime, scripted_model, autojump_clock
):
    scripted_model.add(Reply.text("hello from the fixture"))
    handle = await runtime.agents.create(
        options=AgentOptions(id="a", provider="scripted", model="m")
    )
    start = trio.current_time()
    handle.agent.followup("hi")
    await handle.agent.wait_idle()
    events = handle.agent.session.events
    assert [e.type for e in events][-3:] == ["assistant/message", "step/end", "turn/end"]
    assert events[-3].data["message"]["content"][0]["text"] == "hello from the fixture"
    assert invariants.check(events, allow_open_turn=False) == []
    # clock=trio.current_time: event times are virtual times of this run
    assert all(start <= e.time <= trio.current_time() for e in events if e.type == "turn/end")
    assert isinstance(runtime.store, MemoryStore)
    assert len(scripted_model.requests) == 1


async def test_runtime_fixture_is_fresh_per_test(runtime):
    assert await runtime.store.list() == []
    assert runtime.agents.list() == []


async def test_scripted_latency_runs_on_virtual_time(runtime, scripted_model, autojump_clock):
    scripted_model.latency = 0.5
    scripted_model.add(Reply.text("one two three"))
    handle = await runtime.agents.create(
        options=AgentOptions(id="a", provider="scripted", model="m")
    )
    start = trio.current_time()
    handle.agent.followup("go")
    await handle.agent.wait_idle()
    # three words, half a second before each: exactly 1.5 virtual seconds
    assert trio.current_time() - start == 1.5
