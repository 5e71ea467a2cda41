"""Commands across processes: ``cancel``, ``approve`` and ``deny`` reach a worker's live agent.

docs/design.md#fleet-clients: commands are numbered with the session's messages and return once
a worker applied them. The worker process registers a tool that needs approval; the scripted
model calls it when asked (``call ...``), the turn ends ``awaiting-approval``, and the client's
decision runs (or refuses) the call in the continuation turn.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from dsh_agent_loop import AgentOptions, Event, TurnAbortedError
from dsh_agent_loop.events import TOOL_RESULT, TURN_START

from .conftest import Fleet, check_log, read_log, turn_ends, wait_log

TOOL = "launch"


def options(agent_id: str, *approval: str) -> AgentOptions:
    return AgentOptions(id=agent_id, provider="scripted", model="m", require_approval=approval)


def result_of(events: list[Event], call_id: str) -> Any:
    found = [
        e.data for e in events if e.type == TOOL_RESULT and e.data["message"]["call_id"] == call_id
    ]
    assert len(found) == 1, found
    return found[0]


async def test_cancel_a_running_turn(fleet: Fleet) -> None:
    await fleet.start_worker("w1", "--latency", "0.05")
    async with fleet.client() as c:
        sid = await c.create(options("a"))
        outcome: list[BaseException] = []

        async def run_slow() -> None:
            try:
                await c.run(sid, "slow 400", timeout=60)  # 20 s of words
            except TurnAbortedError as exc:
                outcome.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_slow)
            await wait_log(c, sid, lambda ev: any(e.type == TURN_START for e in ev), "turn start")
            await c.cancel(sid)  # returns once the worker applied it
        assert len(outcome) == 1, "run did not raise TurnAbortedError"
        events = await read_log(c, sid)
        (reason,) = turn_ends(events).values()
        assert reason["kind"] == "aborted"
        check_log(events)
        # the session goes on
        assert (await c.run(sid, "after", timeout=60)).text == "echo after"


@pytest.mark.parametrize("decision", ["approve", "deny"])
async def test_approval_decided_by_a_client(fleet: Fleet, decision: str) -> None:
    worker = await fleet.start_worker("w1", "--require-approval", TOOL)
    async with fleet.client() as c:
        sid = await c.create(options("a", TOOL))
        waiting = await c.run(sid, "call the launch", timeout=60)
        assert waiting.kind == "awaiting-approval"
        (request,) = waiting.pending_approvals
        assert request.name == TOOL
        call_id = request.call_id
        if decision == "approve":
            await c.approve(sid, call_id)
        else:
            await c.deny(sid, call_id, "not today")
        events = await wait_log(
            c, sid, lambda ev: len(turn_ends(ev)) >= 2, "the continuation", timeout=60
        )
        reasons = turn_ends(events)
        assert reasons[max(reasons)]["kind"] == "completed"
        result = result_of(events, call_id)
        if decision == "approve":
            assert "error" not in result, result
            await worker.wait_line(f"RAN {call_id}")
        else:
            assert result["error"]["code"] == "DENIED"
            assert "not today" in str(result)
            assert not worker.has(f"RAN {call_id}")
        check_log(events)
