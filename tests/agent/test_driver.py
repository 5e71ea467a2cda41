"""``_agent/_actor.py``: the agent's task and nursery, and a driver that runs while there is work.

Each agent is one task (its session writer runs in it) with its own nursery; the driver is
started in that nursery by a wake that finds none running, and ends when no wake is left.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from dsh_agent_loop import AgentOptions, Reply, ScriptedModel, open_runtime, tool
from dsh_agent_loop.events import Event
from dsh_agent_loop.testing import actor_of

from .conftest import assert_well_formed, harness, turn_ends

OPTIONS = AgentOptions(id="main", provider="scripted", model="m")


def _agent_nursery(rt: Any, agent: Any) -> trio.Nursery:
    """The nursery of ``agent``'s own task (the one its driver runs in)."""
    nursery = actor_of(agent).nursery
    assert nursery is not None
    assert nursery.parent_task.name.endswith("Agents._run_agent")
    return nursery  # type: ignore[no-any-return]


async def test_an_idle_agent_has_no_driver_task(autojump_clock):
    async with harness([Reply.text("a")]) as h:
        await trio.testing.wait_all_tasks_blocked()
        nursery = _agent_nursery(h.rt, h.agent)
        assert nursery.child_tasks == set()  # created, idle: only the agent's own task
        h.agent.followup("go")
        [driver] = nursery.child_tasks  # started by the wake itself
        assert driver.name.endswith("AgentActor._drive")
        await h.agent.wait_idle()
        await trio.testing.wait_all_tasks_blocked()
        assert nursery.child_tasks == set()  # idle again: the driver ended
        assert turn_ends(h.events) == [{"kind": "completed"}]


async def test_each_agent_is_one_task_under_the_runtime(autojump_clock):
    model = ScriptedModel([Reply.text("a")], loop=True)
    async with open_runtime(providers={"scripted": model}) as rt:
        handles = [
            await rt.agents.create(options=AgentOptions(id=f"a{i}", provider="scripted", model="m"))
            for i in range(3)
        ]
        await trio.testing.wait_all_tasks_blocked()
        parents = {_agent_nursery(rt, h.agent).parent_task for h in handles}
        assert len(parents) == 3  # one task per agent, each with its own nursery
        [agents] = {t.parent_nursery for t in parents}
        assert {t.name for t in agents.child_tasks} == {
            "dsh_agent_loop._agent.lifecycle.Agents._run_agent"
        }


async def test_queued_turns_run_in_one_driver_and_each_idle_burst_gets_a_new_one(autojump_clock):
    started: list[trio.lowlevel.Task] = []
    async with harness([Reply.text("a"), Reply.text("b"), Reply.text("c")]) as h:
        actor_of(h.agent).on_driver_start = lambda agent, task: started.append(task)
        h.agent.followup("one")
        h.agent.followup("two")  # queued while the first is pending: the same driver runs it
        await h.agent.wait_idle()
        assert len(started) == 1
        assert turn_ends(h.events) == [{"kind": "completed"}] * 2
        h.agent.followup("three")
        await h.agent.wait_idle()
        assert len(started) == 2  # the agent went idle in between: a new driver
        assert started[0] is not started[1]
        assert_well_formed(h.events)


async def test_work_queued_before_the_agents_task_runs_is_not_lost(autojump_clock):
    model = ScriptedModel([Reply.text("a")])
    async with open_runtime(providers={"scripted": model}) as rt:
        handle = await rt.agents.create(options=OPTIONS)
        # no checkpoint since create: the agent's task has not run, it has no nursery yet
        assert actor_of(handle.agent).nursery is None
        handle.agent.followup("go")
        assert handle.agent.status.value == "running"
        await handle.agent.wait_idle()
        assert turn_ends(handle.agent.session.events) == [{"kind": "completed"}]


async def test_a_cancelled_wake_before_the_agents_task_runs_leaves_it_idle(autojump_clock):
    model = ScriptedModel([Reply.text("a")])
    async with open_runtime(providers={"scripted": model}) as rt:
        handle = await rt.agents.create(options=OPTIONS)
        handle.agent.followup("go")
        handle.agent.cancel()
        assert handle.agent.status.value == "idle"
        with trio.fail_after(1):
            await handle.agent.wait_idle()
        await trio.sleep(1)
        assert model.requests == []


async def test_a_wake_made_while_the_driver_ends_starts_a_new_one(autojump_clock):
    """A status listener that follows up on ``idle`` runs inside the ending driver's finally."""
    async with harness([Reply.text("a"), Reply.text("b")]) as h:
        sent: list[str] = []

        def on_status(event: Event) -> None:
            if event.data["status"] == "idle" and not sent:
                sent.append(h.agent.followup("again"))

        h.rt.hooks.on("agent/status", on_status)
        h.agent.followup("go")
        await trio.sleep(1)
        await h.agent.wait_idle()
        assert sent
        assert turn_ends(h.events) == [{"kind": "completed"}] * 2


async def test_stop_while_idle_ends_at_once_and_while_running_waits_for_the_driver(
    autojump_clock,
):
    started = trio.Event()

    @tool
    async def slow() -> str:
        """Wait."""
        started.set()
        await trio.sleep(100)
        return "done"

    model = ScriptedModel([Reply.tool_calls(("slow", {}, "c1")), Reply.text("x")])
    async with open_runtime(providers={"scripted": model}, tools=[slow]) as rt:
        idle = await rt.agents.create(options=AgentOptions(id="idle", provider="scripted"))
        await trio.testing.wait_all_tasks_blocked()
        with trio.fail_after(0.001):
            await actor_of(idle.agent).stop()
        assert actor_of(idle.agent).stopped
        busy = await rt.agents.create(options=OPTIONS)
        busy.agent.followup("go")
        await started.wait()
        assert not actor_of(busy.agent).stopped
        await actor_of(busy.agent).stop()
        assert actor_of(busy.agent).stopped
        assert _agent_nursery(rt, busy.agent).child_tasks == set()
        assert turn_ends(busy.agent.session.events) == [{"kind": "aborted", "cause": "disposed"}]


async def test_in_driver_tree_is_true_in_a_tool_and_false_outside(autojump_clock):
    seen: list[bool] = []

    @tool
    async def probe() -> str:
        """Report."""
        seen.append(actor_of(agent_ref[0]).in_driver_tree())
        return "ok"

    agent_ref: list[Any] = []
    async with harness(
        [Reply.tool_calls(("probe", {}, "c1")), Reply.text("x")], tools=[probe]
    ) as h:
        agent_ref.append(h.agent)
        assert not actor_of(h.agent).in_driver_tree()
        await h.run("go")
        assert seen == [True]
        assert not actor_of(h.agent).in_driver_tree()


async def test_an_outer_cancel_reaches_no_agent_until_the_runtime_disposes_it(autojump_clock):
    started = trio.Event()

    @tool
    async def slow() -> str:
        """Wait."""
        started.set()
        await trio.sleep(100)
        return "done"

    model = ScriptedModel([Reply.tool_calls(("slow", {}, "c1"))])
    with trio.CancelScope() as outer:
        async with open_runtime(providers={"scripted": model}, tools=[slow]) as rt:
            handle = await rt.agents.create(options=OPTIONS)
            handle.agent.followup("go")
            await started.wait()
            assert _agent_nursery(rt, handle.agent).cancel_scope.shield
            outer.cancel()
            await trio.sleep(1)
    events = handle.agent.session.events
    assert turn_ends(events) == [{"kind": "aborted", "cause": "disposed"}]
    assert_well_formed(events)
    assert actor_of(handle.agent).stopped
