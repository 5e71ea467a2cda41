"""``Turn`` as an object: it owns its state and cancel scope; the agent façade holds none."""

from __future__ import annotations

import trio

from dsh_agent_loop import Agent, Reply
from dsh_agent_loop._agent._actor import AgentActor
from dsh_agent_loop._agent.turn import Turn
from dsh_agent_loop.testing import actor_of

from .conftest import harness, turn_ends

STEP_STATE = {"step", "attempt", "batch", "pending_users", "cancel_cause", "assembly_cache"}


def test_the_agent_facade_holds_no_step_state() -> None:
    assert Agent.__slots__ == ("_actor",)  # the façade holds its actor, nothing else
    assert not STEP_STATE & set(AgentActor.__slots__)
    assert {"step", "attempt", "batch", "pending_users", "cancel_cause"} <= set(Turn.__slots__)


async def test_the_first_cause_wins_and_a_cancel_after_turn_end_is_too_late(autojump_clock):
    async with harness([Reply.text("hi")]) as h:
        turn = Turn(actor_of(h.agent), 7)
        assert turn.scope is not None
        turn.cancel("user", None)
        turn.cancel("hook", "later")
        assert (turn.cancel_cause, turn.cancel_message) == ("user", None)
        assert turn.winding_down
        assert turn.scope.cancel_called
        ended = Turn(actor_of(h.agent), 8)
        ended.scope = None  # as after its turn/end
        ended.cancel("user", None)
        assert ended.cancel_cause is None
        assert not ended.winding_down


async def test_a_turn_exists_only_while_it_runs(autojump_clock):
    seen: list[object] = []

    async with harness([Reply.text("hi there")], latency=1.0) as h:
        h.agent.followup("go")
        await trio.sleep(0.5)
        seen.append(actor_of(h.agent).running_turn)
        await h.agent.wait_idle()
        assert isinstance(seen[0], Turn)
        assert seen[0].number == 1
        assert seen[0].scope is None  # dropped once turn/end was appended
        assert actor_of(h.agent).running_turn is None
        assert turn_ends(h.events) == [{"kind": "completed"}]


async def test_close_open_work_ends_an_open_step(autojump_clock):
    async with harness([Reply.text("hi")]) as h:
        turn = Turn(actor_of(h.agent), 1)
        turn.step, turn.step_open = 1, True
        turn.step_data = actor_of(h.agent).services.records.step_data(1, 1)
        size = len(h.agent.session)
        turn.close_open_work()
        turn.close_open_work()  # idempotent
        assert [e.type for e in h.events[size:]] == ["step/end"]
        assert not turn.step_open
