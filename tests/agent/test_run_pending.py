"""``run()``/``run_stream()`` on an agent whose tool calls wait for approval: a coded error naming
them, nothing queued, unless the caller asks to wait (docs/design.md#approvals)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from dsh_agent_loop import (
    AgentClosedError,
    AgentLoopError,
    AgentOptions,
    ApprovalPendingError,
    MemoryStore,
    Reply,
    ScriptedModel,
    delegate_tool,
    open_runtime,
    tool,
)

OPTIONS = AgentOptions(id="main", provider="scripted", model="m")


@tool(requires_approval=True)
async def delete(path: str) -> str:
    """Delete a file."""
    return f"deleted {path}"


def _runtime(replies: list[Any]) -> Any:
    model = ScriptedModel(replies)
    return open_runtime(
        providers={"scripted": model}, store=MemoryStore(), tools=[delete], clock=trio.current_time
    )


TWO_CALLS = Reply.tool_calls(("delete", {"path": "a"}, "c1"), ("delete", {"path": "b"}, "c2"))


async def test_run_behind_pending_calls_raises_naming_them_and_queues_nothing(
    autojump_clock: Any,
) -> None:
    async with _runtime([TWO_CALLS, Reply.text("done"), Reply.text("second")]) as rt:
        agent = (await rt.agents.create(options=OPTIONS)).agent
        first = await agent.run("delete both")
        assert first.reason["kind"] == "awaiting-approval"
        before = len(agent.session.events)
        with pytest.raises(ApprovalPendingError) as raised:
            await agent.run("and then this")
        error = raised.value
        assert isinstance(error, AgentLoopError)
        assert error.code == "APPROVAL_PENDING"
        assert error.call_ids == ("c1", "c2")
        assert "c1 (delete)" in str(error)
        assert "c2 (delete)" in str(error)
        assert "wait_for_approvals=True" in str(error)
        assert len(agent.session.events) == before  # nothing appended
        assert agent.inbox.next_turn == ()
        with pytest.raises(ApprovalPendingError):
            async with agent.run_stream("streamed"):
                raise AssertionError("the block must not run")  # pragma: no cover
        assert len(agent.session.events) == before
        # Decided: the message no longer waits behind anything.
        agent.approve("c1")
        agent.deny("c2", "no")
        await agent.wait_idle()
        result = await agent.run("now")
        assert result.text == "second"


async def test_one_decided_call_of_two_still_refuses(autojump_clock: Any) -> None:
    async with _runtime([TWO_CALLS, Reply.text("done")]) as rt:
        agent = (await rt.agents.create(options=OPTIONS)).agent
        await agent.run("delete both")
        agent.approve("c1")
        with pytest.raises(ApprovalPendingError) as raised:
            await agent.run("more")
        assert raised.value.call_ids == ("c2",)


async def test_wait_for_approvals_queues_behind_them_and_runs_after_the_continuation(
    autojump_clock: Any,
) -> None:
    replies = [TWO_CALLS, Reply.text("continued"), Reply.text("queued ran")]
    async with _runtime(replies) as rt, trio.open_nursery() as nursery:
        agent = (await rt.agents.create(options=OPTIONS)).agent
        await agent.run("delete both")
        got: list[str] = []

        async def waiter() -> None:
            got.append((await agent.run("after", wait_for_approvals=True)).text)

        nursery.start_soon(waiter)
        await trio.sleep(5)
        assert got == []  # it waits behind the calls
        assert len(agent.inbox.next_turn) == 1
        await agent.resolve_approvals({"c1": True, "c2": "not b"})
        await agent.wait_idle()
        await trio.sleep(1)
        assert got == ["queued ran"]


async def test_run_stream_waits_too_when_asked(autojump_clock: Any) -> None:
    replies = [TWO_CALLS, Reply.text("continued"), Reply.text("streamed")]
    async with _runtime(replies) as rt:
        agent = (await rt.agents.create(options=OPTIONS)).agent
        await agent.run("delete both")
        async with agent.run_stream("after", wait_for_approvals=True) as stream:
            agent.approve("c1")
            agent.approve("c2")
            result = await stream.result()
        assert result.text == "streamed"


async def test_a_disposed_agent_still_raises_agent_closed(autojump_clock: Any) -> None:
    async with _runtime([TWO_CALLS]) as rt:
        handle = await rt.agents.create(options=OPTIONS)
        agent = handle.agent
        await agent.run("delete both")
        await handle.dispose()
        with pytest.raises(AgentClosedError):
            await agent.run("late")


async def test_a_second_task_for_a_waiting_sub_agent_is_a_tool_error_not_a_hang(
    autojump_clock: Any,
) -> None:
    models = {
        "p": ScriptedModel(
            [
                Reply.tool_calls(("delegate", {"task": "Clean up"}, "d1")),
                Reply.tool_calls(("delegate", {"task": "And more"}, "d2")),
                Reply.text("the helper is busy"),
            ]
        ),
        "c": ScriptedModel([Reply.tool_calls(("delete", {"path": "a"}, "e1"))]),
    }
    async with open_runtime(
        providers=models, store=MemoryStore(), tools=[delete], clock=trio.current_time
    ) as rt:
        rt.add_tool(delegate_tool(rt, AgentOptions(id="helper", provider="c", model="m")))
        parent = (
            await rt.agents.create(options=AgentOptions(id="main", provider="p", model="m"))
        ).agent
        with trio.fail_after(60):  # before, the second delegate waited behind the child's call
            result = await parent.run("go")
        assert result.text == "the helper is busy"
        first, second = result.tool_calls
        assert first.error is None
        assert second.error == "TOOL_ERROR"
        assert "APPROVAL_PENDING" in second.content
        assert "e1 (delete)" in second.content
