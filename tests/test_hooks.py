"""The hook bus (docs/design.md#hooks): observers, waterfalls, serial hooks, disposers and
scopes."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio

from dsh_agent_loop import (
    AgentOptions,
    HookBus,
    MemoryStore,
    Reply,
    ScriptedModel,
    open_runtime,
    tool,
)
from dsh_agent_loop._hooks import HookChain, HookScope
from dsh_agent_loop.testing import actor_of

from .agent.conftest import assert_well_formed, harness, turn_ends


async def test_waterfall_runs_in_registration_order_around_the_default():
    bus = HookBus()
    trace = []

    def layer(name):
        async def fn(payload, next):
            trace.append(f"{name} in")
            result = await next([*payload, name])
            trace.append(f"{name} out")
            return result

        return fn

    bus.waterfall("h", layer("a"))
    bus.waterfall("h", layer("b"))

    async def default(payload):
        trace.append("default")
        return payload

    result = await HookChain(bus).waterfall("h", [], default)
    assert result == ["a", "b"]
    assert trace == ["a in", "b in", "default", "b out", "a out"]


async def test_a_listener_that_does_not_call_next_short_circuits():
    bus = HookBus()
    reached = []

    async def stop(payload, next):
        return "stopped"

    async def later(payload, next):
        reached.append("later")
        return await next(payload)

    bus.waterfall("h", stop)
    bus.waterfall("h", later)

    async def default(payload):
        reached.append("default")
        return "default"

    assert await HookChain(bus).waterfall("h", None, default) == "stopped"
    assert reached == []
    # no listener at all: the default answers
    assert await HookChain(bus).waterfall("other", None, default) == "default"


async def test_runtime_listeners_run_before_scoped_ones():
    runtime, scoped = HookBus(), HookBus()
    trace = []

    async def rt_fn(payload, next):
        trace.append("runtime")
        return await next(payload)

    async def scoped_fn(payload, next):
        trace.append("scoped")
        return await next(payload)

    scoped.waterfall("h", scoped_fn)
    runtime.waterfall("h", rt_fn)

    async def default(payload):
        return payload

    chain = HookChain(runtime, scoped)
    await chain.waterfall("h", 1, default)
    assert trace == ["runtime", "scoped"]

    serial = []

    async def s(name):
        async def fn(payload):
            await trio.lowlevel.checkpoint()
            serial.append((name, payload))

        return fn

    scoped.serial("x", await s("scoped"))
    runtime.serial("x", await s("runtime"))
    await chain.serial("x", 7)
    assert serial == [("runtime", 7), ("scoped", 7)]

    seen = []
    scoped.on("e", lambda e: seen.append(("scoped", e)))
    runtime.on("e", lambda e: seen.append(("runtime", e)))
    chain.emit("e", "ev")
    assert seen == [("runtime", "ev"), ("scoped", "ev")]
    assert chain.has("on", "e")
    assert not chain.has("on", "nothing")


def test_disposers_remove_exactly_their_registration():
    bus = HookBus()
    calls = []

    def fn(event):
        calls.append(event)

    first = bus.on("e", fn)
    second = bus.on("e", fn)  # the same function twice is two registrations
    HookChain(bus).emit("e", 1)
    assert calls == [1, 1]
    first()
    first()  # harmless twice
    HookChain(bus).emit("e", 2)
    assert calls == [1, 1, 2]
    second()
    assert not bus.has("on", "e")
    HookChain(bus).emit("e", 3)
    assert calls == [1, 1, 2]


async def test_a_running_chain_keeps_the_listeners_it_started_with():
    bus = HookBus()
    trace = []
    disposers = {}

    async def a(payload, next):
        trace.append("a")
        disposers["b"]()  # removing b while the chain runs
        bus.waterfall("h", c)  # adding c while the chain runs
        return await next(payload)

    async def b(payload, next):
        trace.append("b")
        return await next(payload)

    async def c(payload, next):
        trace.append("c")
        return await next(payload)

    bus.waterfall("h", a)
    disposers["b"] = bus.waterfall("h", b)

    async def default(payload):
        return payload

    await HookChain(bus).waterfall("h", None, default)
    assert trace == ["a", "b"]
    trace.clear()
    await HookChain(bus).waterfall("h", None, default)
    assert trace == ["a", "c"]


def test_a_raising_observer_is_logged_and_the_others_still_run(caplog):
    runtime, scoped = HookBus(), HookBus()
    seen = []

    def boom(event):
        seen.append(("boom", event))
        raise RuntimeError("observer failed")

    runtime.on("e", boom)
    runtime.on("e", lambda e: seen.append(("runtime", e)))
    scoped.on("e", boom)
    scoped.on("e", lambda e: seen.append(("scoped", e)))
    with caplog.at_level(logging.ERROR, logger="dsh_agent_loop._hooks"):
        HookChain(runtime, scoped).emit("e", 1)  # returns: nothing propagates
        runtime.emit("e", 2)  # the bus itself, as the lifecycle uses it
    assert seen == [
        ("boom", 1),
        ("runtime", 1),
        ("boom", 1),
        ("scoped", 1),
        ("boom", 2),
        ("runtime", 2),
    ]
    failures = [r for r in caplog.records if r.name == "dsh_agent_loop._hooks"]
    assert len(failures) == 3
    for record in failures:
        assert record.levelno == logging.ERROR
        assert record.exc_info is not None
        assert record.exc_info[1].args == ("observer failed",)
        assert "'e'" in record.getMessage()


def test_a_scope_forgets_its_registrations_on_close():
    bus = HookBus()
    scope = HookScope(bus)
    outside = bus.on("e", lambda e: None)
    scope.on("e", lambda e: None)

    async def mw(payload, next):
        return await next(payload)

    async def serial(payload):
        pass

    scope.waterfall("w", mw)
    scope.serial("s", serial)
    assert len(bus.listeners("on", "e")) == 2
    scope.close()
    scope.close()
    assert len(bus.listeners("on", "e")) == 1
    assert not bus.has("waterfall", "w")
    assert not bus.has("serial", "s")
    outside()
    assert not bus.has("on", "e")


def test_registering_through_a_closed_scope_fails_and_leaves_nothing_behind():
    bus = HookBus()
    scope = HookScope(bus)
    scope.close()
    with pytest.raises(RuntimeError):
        scope.on("e", lambda e: None)
    # the refused registration must not stay on the bus (nothing could ever dispose it)
    assert not bus.has("on", "e")


async def test_agent_scoped_hooks_apply_to_that_agent_only(autojump_clock):
    seen = []

    async def setup(scope, agent):
        async def pre_step(payload, next):
            seen.append(("scoped", payload["agent"].id))
            return await next(payload)

        scope.hooks.waterfall("agent/pre-step", pre_step)

    async with harness([Reply.text("a"), Reply.text("b")], setup=setup) as h:

        async def runtime_pre_step(payload, next):
            seen.append(("runtime", payload["agent"].id))
            return await next(payload)

        dispose_runtime = h.rt.hooks.waterfall("agent/pre-step", runtime_pre_step)
        other = await h.rt.agents.create(
            options=type(h.agent.options)(id="other", provider="scripted", model="m")
        )
        await h.run("go")
        other.agent.followup("go")
        await other.agent.wait_idle()
        assert seen == [("runtime", "main"), ("scoped", "main"), ("runtime", "other")]
        assert actor_of(h.agent).hooks.has("waterfall", "agent/pre-step")
        await h.handle.dispose()
        dispose_runtime()
        assert not actor_of(h.agent).hooks.has("waterfall", "agent/pre-step")
        assert not actor_of(other.agent).hooks.has("waterfall", "agent/pre-step")


def test_has_and_any_follow_registrations_on_either_bus():
    runtime, scoped = HookBus(), HookBus()
    chain = HookChain(runtime, scoped)
    assert not chain.any("on")
    assert not chain.has("on", "x")

    def observer(event: object) -> None:
        pass

    dispose_scoped = scoped.on("x", observer)
    assert chain.any("on")
    assert chain.has("on", "x")
    assert not chain.any("waterfall")
    assert not chain.has("on", "y")
    dispose_scoped()
    assert not chain.any("on")
    assert not chain.has("on", "x")
    dispose_runtime = runtime.on("y", observer)
    assert chain.any("on")
    assert chain.has("on", "y")
    assert not chain.has("on", "x")
    dispose_runtime()
    assert not chain.any("on")
    three = HookChain(HookBus(), HookBus(), runtime)  # more than two buses still answers
    runtime.serial("z", observer)  # type: ignore[arg-type]
    assert three.has("serial", "z")
    assert three.any("serial")
    assert not HookChain().has("on", "x")
    assert not HookChain().any("on")


# Notifications one agent's observers watch; each observer raises (docs/design.md#hooks).
WATCHED = (
    "agent/status",
    "agent/assistant-stream",
    "agent/inbox/inserted",
    "agent/inbox/claimed",
    "session/event",
    "session/flush",
    "tools/result",
)


async def test_raising_observers_never_stop_an_agent_or_its_neighbours(autojump_clock, caplog):
    @tool
    async def look() -> str:
        """Look around."""
        return "seen"

    called: dict[str, int] = dict.fromkeys(WATCHED, 0)

    def raising(name: str) -> Any:
        def observer(event: Any) -> None:
            called[name] += 1
            raise RuntimeError(f"{name} observer broke")

        return observer

    async def setup(scope: Any, agent: Any) -> None:
        for name in WATCHED:  # main's own observers, all raising
            scope.hooks.on(name, raising(name))

    main_model = ScriptedModel(
        [Reply.tool_calls(("look", {}), ("look", {})), Reply.text("a"), Reply.text("b")]
    )
    other_model = ScriptedModel(
        [Reply.tool_calls(("look", {})), Reply.text("other done")], latency=1.0
    )
    with caplog.at_level(logging.ERROR, logger="dsh_agent_loop._hooks"):
        async with open_runtime(
            store=MemoryStore(),
            providers={"scripted": main_model, "other": other_model},
            tools=[look],
            clock=trio.current_time,
        ) as rt:
            main = await rt.agents.create(
                options=AgentOptions(id="main", provider="scripted", model="m"), setup=setup
            )
            other = await rt.agents.create(
                options=AgentOptions(id="other", provider="other", model="m")
            )
            main.agent.followup("go")
            other.agent.followup("go")
            await main.agent.wait_idle()
            main.agent.followup("again")  # main's loop goes on after its observers raised
            await main.agent.wait_idle()
            await other.agent.wait_idle()
            main_events = main.agent.session.events
            other_events = other.agent.session.events
            assert rt.agents.get("main") is main.agent
    assert all(called[name] > 0 for name in WATCHED), called
    assert turn_ends(main_events) == [{"kind": "completed"}, {"kind": "completed"}]
    assert turn_ends(other_events) == [{"kind": "completed"}]
    assert_well_formed(main_events)
    assert_well_formed(other_events)
    logged = [r for r in caplog.records if r.name == "dsh_agent_loop._hooks"]
    assert len(logged) == sum(called.values())  # every failure logged, none escaped
    assert {r.exc_info[1].args[0] for r in logged if r.exc_info} == {
        f"{name} observer broke" for name in WATCHED
    }


def test_bus_queries_are_public_and_exact():
    bus = HookBus()
    assert not bus.has("on", "e")
    assert not bus.any("waterfall")
    assert bus.listeners("on", "e") == []
    seen = []
    dispose = bus.on("e", seen.append)
    bus.waterfall("w", lambda p, nxt: nxt(p))
    assert bus.has("on", "e")
    assert not bus.has("serial", "e")
    assert bus.any("waterfall")
    assert bus.listeners("on", "e") == [seen.append]
    bus.emit("e", 1)
    assert seen == [1]
    dispose()
    assert not bus.has("on", "e")
    assert bus.listeners("on", "e") == []


def test_a_chain_answers_for_every_shape_of_buses():
    outer, inner, third = HookBus(), HookBus(), HookBus()
    third.serial("s", lambda p: None)
    assert not HookChain().has("serial", "s")
    assert not HookChain(outer, inner).any("serial")
    assert HookChain(outer, inner, third).has("serial", "s")
    assert HookChain(outer, inner, third).any("serial")
    assert HookChain(third).has("serial", "s")
    inner.on("x", lambda e: None)
    assert HookChain(outer, inner).has("on", "x")
    assert not HookChain(outer, inner).has("on", "y")


def test_only_the_bus_reads_its_listener_tables():
    import ast
    import inspect

    import dsh_agent_loop._hooks as hooks_module

    tree = ast.parse(inspect.getsource(hooks_module))
    readers = set()
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and node.attr == "_lists":
                readers.add(cls.name)
    assert readers == {"HookBus"}


async def test_hook_payloads_carry_the_public_agent(autojump_clock):
    """Every hook sees the ``Agent`` users hold (its documented verbs), never the machinery."""
    seen: dict[str, Any] = {}

    def waterfall(name: str) -> Any:
        async def listener(payload: Any, next: Any) -> Any:
            seen[name] = payload["agent"]
            return await next(payload)

        return listener

    async def serial(payload: Any) -> None:
        seen["agent/turn-stopping"] = payload["agent"]

    @tool
    async def noop() -> str:
        """Do nothing."""
        return "ok"

    replies = [Reply.tool_calls(("noop", {})), Reply.text("done")]
    async with harness(replies, tools=[noop]) as h:
        names = (
            "agent/pre-step",
            "agent/request",
            "system-prompt/assemble",
            "tools/pre-execute",
            "tools/execute",
        )
        for name in names:
            h.rt.hooks.waterfall(name, waterfall(name))
        h.rt.hooks.serial("agent/turn-stopping", serial)
        h.rt.hooks.on("tools/result", lambda e: seen.setdefault("tools/result", e.data["agent"]))
        await h.run()
    assert sorted(seen) == sorted([*names, "agent/turn-stopping", "tools/result"])
    for name, agent in seen.items():
        assert agent is h.agent, name
        assert not hasattr(agent, "log"), name  # the façade shows no machinery
