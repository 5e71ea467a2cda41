"""``agent.statistics()`` and ``rt.statistics()`` counters; ``AgentHandle`` as a context manager."""

from __future__ import annotations

import pytest
import trio

from dsh_agent_loop import AgentOptions, MemoryStore, Reply, ScriptedModel, open_runtime, tool
from dsh_agent_loop.llm._base import Usage
from dsh_agent_loop.testing import actor_of

from .conftest import OPTIONS, harness


@tool
async def echo(text: str) -> str:
    """Echo the text."""
    return text


def usage(inp: int, out: int, cache: int | None = None, reasoning: int | None = None) -> Usage:
    return Usage(inp, out, cache_read_tokens=cache, reasoning_tokens=reasoning)


def work(agent: str) -> list[Reply]:
    """One turn of two steps: two tool calls, then an answer (usage given for both steps)."""
    calls = Reply.tool_calls(("echo", {"text": "a"}), ("echo", {"text": "b"}))
    calls = Reply(calls=calls.calls, usage=usage(100, 20, cache=60, reasoning=5))
    return [calls, Reply.text(f"{agent} done", usage=usage(150, 10, cache=100))]


async def test_agent_statistics_count_steps_tool_calls_and_tokens(autojump_clock) -> None:
    async with harness([*work("main"), Reply.text("again", usage=usage(7, 3))], tools=[echo]) as h:
        before = h.agent.statistics()
        assert (before.turns, before.steps, before.tool_calls, before.input_tokens) == (0, 0, 0, 0)
        await h.run()
        stats = h.agent.statistics()
        assert (stats.turns, stats.steps, stats.tool_calls) == (1, 2, 2)
        assert (stats.input_tokens, stats.output_tokens) == (250, 30)
        assert (stats.cache_read_tokens, stats.reasoning_tokens) == (160, 5)
        assert stats.events == len(h.events)
        assert stats.status == "idle"
        await h.run()
        stats = h.agent.statistics()
        assert (stats.turns, stats.steps, stats.tool_calls) == (2, 3, 2)
        assert (stats.input_tokens, stats.output_tokens, stats.cache_read_tokens) == (257, 33, 160)


async def test_a_resumed_agent_counts_its_own_work(autojump_clock) -> None:
    store = MemoryStore()
    model = ScriptedModel([*work("main"), Reply.text("later", usage=usage(9, 1))])
    async with open_runtime(store=store, providers={"scripted": model}, tools=[echo]) as rt:
        handle = await rt.agents.create(session_id="s1", options=OPTIONS)
        handle.agent.followup("go")
        await handle.agent.wait_idle()
        await handle.dispose()
        again = await rt.agents.resume("s1")
        fresh = again.agent.statistics()
        assert (fresh.turns, fresh.steps, fresh.tool_calls, fresh.input_tokens) == (0, 0, 0, 0)
        assert fresh.events > 0  # the log's history is there; its counts are the old instance's
        again.agent.followup("more")
        await again.agent.wait_idle()
        stats = again.agent.statistics()
        assert (stats.turns, stats.steps, stats.input_tokens, stats.output_tokens) == (1, 1, 9, 1)


async def test_runtime_statistics_sum_the_live_agents(autojump_clock) -> None:
    model = ScriptedModel([*work("a"), *work("b")])
    async with open_runtime(providers={"scripted": model}, tools=[echo]) as rt:
        a = await rt.agents.create(options=AgentOptions(id="a", provider="scripted", model="m"))
        b = await rt.agents.create(options=AgentOptions(id="b", provider="scripted", model="m"))
        for handle in (a, b):
            handle.agent.followup("go")
            await handle.agent.wait_idle()
        stats = rt.statistics()
        assert (stats.agents, stats.sessions, stats.start_failures) == (2, 2, 0)
        assert (stats.turns, stats.steps, stats.tool_calls) == (2, 4, 4)
        assert (stats.input_tokens, stats.output_tokens) == (500, 60)
        assert (stats.cache_read_tokens, stats.reasoning_tokens) == (320, 10)
        await b.dispose()
        stats = rt.statistics()
        assert (stats.agents, stats.turns, stats.input_tokens) == (1, 1, 250)


async def test_async_with_handle_disposes_on_exit(autojump_clock) -> None:
    async with open_runtime(providers={"scripted": ScriptedModel([Reply.text("hi")])}) as rt:
        async with await rt.agents.create(options=OPTIONS) as handle:
            assert rt.agents.get("main") is handle.agent
            handle.agent.followup("go")
            await handle.agent.wait_idle()
        assert rt.agents.get("main") is None
        assert handle.agent.closed
        assert actor_of(handle.agent).stopped


async def test_async_with_handle_disposes_on_an_exception(autojump_clock) -> None:
    model = ScriptedModel([Reply.hang("thinking")])
    async with open_runtime(store=MemoryStore(), providers={"scripted": model}) as rt:
        handle = await rt.agents.create(session_id="s1", options=OPTIONS)

        async def fail() -> None:
            async with handle:
                handle.agent.followup("go")
                await trio.sleep(1)
                raise KeyError("boom")

        with pytest.raises(KeyError):
            await fail()
        assert rt.agents.get("main") is None
        events = handle.agent.session.events
        assert events[-1].data["reason"] == {"kind": "aborted", "cause": "disposed"}


async def test_async_with_handle_disposes_when_cancelled(autojump_clock) -> None:
    model = ScriptedModel([Reply.hang("thinking")])
    async with open_runtime(store=MemoryStore(), providers={"scripted": model}) as rt:
        handle = await rt.agents.create(session_id="s1", options=OPTIONS)
        with trio.move_on_after(1) as scope:
            async with handle:
                handle.agent.followup("go")
                await trio.sleep_forever()
        assert scope.cancelled_caught
        # the teardown was shielded: it finished although the block was cancelled
        assert rt.agents.get("main") is None
        assert actor_of(handle.agent).stopped
        stored = await rt.store.open("s1", "write")  # ownership was released
        await stored.close()
