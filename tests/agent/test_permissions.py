"""Permission policies on real agents: defaults, modes, rules, "always" across a resume, sub-agents.

The built-in file tools do real I/O (worker threads), so these tests run on the real clock; none
of them sleeps or times anything.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import attrs
import pytest

from dsh_agent_loop import (
    AgentOptions,
    MemoryStore,
    Reply,
    ScriptedModel,
    SqliteStore,
    open_runtime,
    tool,
)
from dsh_agent_loop._permissions import Permissions
from dsh_agent_loop._sandbox import Sandbox
from dsh_agent_loop.testing import actor_of

from .conftest import assert_well_formed, parent_child_runtime, plain, turn_ends

BUILTINS = ("read_file", "write_file", "edit_file", "run_command")
RAN: list[str] = []


@tool
async def fetch(url: str) -> str:
    """Fetch a URL."""
    RAN.append(url)
    return f"fetched {url}"


@tool(requires_approval=True)
async def guarded(x: int) -> str:
    """A tool of the user's that always needs approval."""
    RAN.append(f"guarded {x}")
    return "guarded"


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()


def options(cwd: Path, **kwargs: Any) -> AgentOptions:
    return AgentOptions(
        id="main",
        provider="scripted",
        model="m",
        cwd=str(cwd),
        tools=(*BUILTINS, "fetch", "guarded"),
        **kwargs,
    )


def write(path: str, call_id: str, content: str = "x") -> tuple[str, dict[str, Any], str]:
    return ("write_file", {"path": path, "content": content}, call_id)


def results(events: list[Any]) -> dict[str, tuple[str, str | None]]:
    """call_id -> (text, error code) of every tool/result."""
    out = {}
    for e in events:
        if e.type == "tool/result":
            block = e.data["message"]["content"][0]
            error = e.data.get("error")
            out[e.data["message"]["call_id"]] = (block["text"], error and error["code"])
    return out


def codes(events: list[Any]) -> dict[str, str | None]:
    """call_id -> error code (None: success) of every tool/result."""
    return {k: code for k, (_, code) in results(events).items()}


def denials(events: list[Any]) -> dict[str, str]:
    """call_id -> text of every ``DENIED`` result."""
    return {k: text for k, (text, code) in results(events).items() if code == "DENIED"}


async def run_once(
    tmp_path: Path, calls: list[Any], *, agent_options: AgentOptions | None = None, **rt: Any
) -> Any:
    """One turn of ``calls`` then "done"; returns the agent's events."""
    model = ScriptedModel([Reply.tool_calls(*calls), Reply.text("done")])
    rt.setdefault("store", MemoryStore())
    rt.setdefault("tools", [fetch, guarded])
    async with open_runtime(providers={"scripted": model}, **rt) as runtime:
        handle = await runtime.agents.create(options=agent_options or options(tmp_path))
        handle.agent.followup("go")
        await handle.agent.wait_idle()
        return handle.agent.session.events


async def test_with_nothing_configured_builtin_writes_and_commands_ask(tmp_path: Path) -> None:
    (tmp_path / "r.txt").write_text("read me")
    calls = [
        ("read_file", {"path": "r.txt"}, "c1"),
        write("w.txt", "c2"),
        ("edit_file", {"path": "r.txt", "old": "read", "new": "edit"}, "c3"),
        ("run_command", {"command": "touch ran"}, "c4"),
        ("fetch", {"url": "u"}, "c5"),
    ]
    events = await run_once(tmp_path, calls)
    assert turn_ends(events) == [{"kind": "awaiting-approval", "call_ids": ["c2", "c3", "c4"]}]
    assert codes(events) == {"c1": None, "c5": None}
    assert "read me" in results(events)["c1"][0]
    assert os.listdir(tmp_path) == ["r.txt"]  # nothing written, nothing ran
    assert (tmp_path / "r.txt").read_text() == "read me"
    assert [e.data["name"] for e in events if e.type == "tool/approval-requested"] == [
        "write_file",
        "edit_file",
        "run_command",
    ]
    assert_well_formed(events)


async def test_a_deny_rule_refuses_the_call_naming_the_rule(tmp_path: Path) -> None:
    policy = Permissions(mode="allow-all", deny=("write_file(**/*.env)", "run_command(rm *)"))
    calls = [
        write("a/.env", "c1"),
        ("run_command", {"command": "make && rm -rf ."}, "c2"),
        write("ok.txt", "c3"),
    ]
    events = await run_once(tmp_path, calls, permissions=policy, sandbox=Sandbox(mode="off"))
    assert codes(events) == {"c1": "DENIED", "c2": "DENIED", "c3": None}
    assert denials(events) == {
        "c1": "Error: tool call denied by rule 'write_file(**/*.env)'",
        "c2": "Error: tool call denied by rule 'run_command(rm *)'",
    }
    assert not (tmp_path / "a").exists()
    assert (tmp_path / "ok.txt").read_text() == "x"
    assert turn_ends(events) == [{"kind": "completed"}]
    assert not [e for e in events if e.type == "tool/approval-requested"]
    assert_well_formed(events)


DENY_ASKS = "Error: tool call denied by permission mode 'deny-asks' (the call needs approval)"


@pytest.mark.parametrize(
    ("mode", "outcome"),
    [
        ("ask", {"c1": "ask", "c2": "ask", "c3": None, "c4": "ask"}),
        ("accept-edits", {"c1": None, "c2": "ask", "c3": None, "c4": "ask"}),
        ("allow-all", {"c1": None, "c2": None, "c3": None, "c4": None}),
        ("deny-asks", {"c1": "DENIED", "c2": "DENIED", "c3": None, "c4": "DENIED"}),
    ],
)
async def test_each_mode(tmp_path: Path, mode: str, outcome: dict[str, str | None]) -> None:
    calls = [write("in.txt", "c1"), ("run_command", {"command": "touch ran"}, "c2")]
    calls += [("fetch", {"url": "u"}, "c3"), ("guarded", {"x": 1}, "c4")]
    policy = Permissions(mode=mode)  # type: ignore[arg-type]
    events = await run_once(tmp_path, calls, permissions=policy, sandbox=Sandbox(mode="off"))
    assert codes(events) == {k: v for k, v in outcome.items() if v != "ask"}
    assert set(denials(events).values()) <= {DENY_ASKS}
    assert (tmp_path / "in.txt").exists() == (outcome["c1"] is None)
    assert (tmp_path / "ran").exists() == (outcome["c2"] is None)
    asked = [k for k, v in outcome.items() if v == "ask"]
    ends = turn_ends(events)
    assert ends == (
        [{"kind": "awaiting-approval", "call_ids": asked}] if asked else [{"kind": "completed"}]
    )
    assert_well_formed(events)


async def test_the_agents_policy_wins_over_the_runtimes(tmp_path: Path) -> None:
    own = options(tmp_path, permissions=Permissions(mode="allow-all"))
    events = await run_once(
        tmp_path,
        [write("a.txt", "c1")],
        agent_options=own,
        permissions=Permissions(mode="deny-asks"),
    )
    assert codes(events) == {"c1": None}
    own = options(tmp_path, permissions=Permissions(deny=("write_file",)))
    events = await run_once(
        tmp_path,
        [write("b.txt", "c1")],
        agent_options=own,
        permissions=Permissions(mode="allow-all"),
    )
    assert denials(events) == {"c1": "Error: tool call denied by rule 'write_file'"}


async def test_a_config_policy_reaches_the_agent(tmp_path: Path) -> None:
    config = {
        "plugins": [
            {
                "name": "@deepseek-ai/dsh-agent-loop",
                "config": {"permissions": {"mode": "ask", "allow": ["write_file(docs/**)"]}},
            }
        ]
    }
    events = await run_once(
        tmp_path, [write("docs/a.md", "c1"), write("src/a.py", "c2")], config=config
    )
    assert codes(events) == {"c1": None}
    assert turn_ends(events) == [{"kind": "awaiting-approval", "call_ids": ["c2"]}]


async def test_always_is_remembered_across_a_resume(tmp_path: Path) -> None:
    store_path = tmp_path / "sessions.db"
    work = tmp_path / "work"
    work.mkdir()
    first = ScriptedModel([Reply.tool_calls(write("a.txt", "c1", "one")), Reply.text("ok")])
    async with open_runtime(
        store=SqliteStore(store_path), providers={"scripted": first}, tools=[fetch, guarded]
    ) as rt:
        agent = (await rt.agents.create(session_id="s1", options=options(work))).agent
        agent.followup("go")
        await agent.wait_idle()
        with pytest.raises(ValueError, match="no pending approval"):
            agent.approve("nope", always=True)
        assert agent.approve("c1", always=True) == "write_file(a.txt)"
        await agent.wait_idle()
        assert (work / "a.txt").read_text() == "one"
        assert actor_of(agent).log.state.granted == ("write_file(a.txt)",)

    second = ScriptedModel(
        [
            Reply.tool_calls(write("./b/../a.txt", "c2", "two"), write("b.txt", "c3")),
            Reply.text("later"),
        ]
    )
    async with open_runtime(
        store=SqliteStore(store_path), providers={"scripted": second}, tools=[fetch, guarded]
    ) as rt:
        agent = (await rt.agents.resume("s1", options=options(work))).agent
        agent.followup("again")
        await agent.wait_idle()
        assert (work / "a.txt").read_text() == "two"  # ran without asking
        assert [r.call_id for r in agent.pending_approvals()] == ["c3"]  # another path asks
        reader = await rt.store.open("s1", "read")
        stored = await reader.read()
        await reader.close()
    granted = [e for e in stored if e.type == "permissions/allowed"]
    assert [plain(e.data) for e in granted] == [{"rule": "write_file(a.txt)", "call_id": "c1"}]
    assert granted[0].ignorable
    approval = next(e for e in stored if e.type == "tool/approval")
    assert granted[0].seq < approval.seq  # recorded before the decision it came with
    assert_well_formed(stored)


async def test_always_for_a_command_allows_that_exact_command_only(tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            Reply.tool_calls(("run_command", {"command": "echo a*"}, "c1")),
            Reply.text("ok"),
            Reply.tool_calls(
                ("run_command", {"command": "echo a*"}, "c2"),
                ("run_command", {"command": "echo ab"}, "c3"),
            ),
            Reply.text("ok"),
        ]
    )
    async with open_runtime(
        store=MemoryStore(),
        providers={"scripted": model},
        tools=[fetch, guarded],
        sandbox=Sandbox(mode="off"),
    ) as rt:
        agent = (await rt.agents.create(options=options(tmp_path))).agent
        agent.followup("go")
        await agent.wait_idle()
        assert agent.approve("c1", always=True) == r"run_command(echo a\*)"
        await agent.wait_idle()
        agent.followup("again")
        await agent.wait_idle()
        assert [r.call_id for r in agent.pending_approvals()] == ["c3"]
        assert "c2" in results(agent.session.events)
        # approving the same command "always" again records nothing new
        assert agent.approve("c3") is None
        await agent.wait_idle()
        assert actor_of(agent).log.state.granted == (r"run_command(echo a\*)",)


async def test_always_for_a_path_outside_the_cwd_records_no_rule(tmp_path: Path) -> None:
    model = ScriptedModel([Reply.tool_calls(write("../out.txt", "c1")), Reply.text("ok")])
    async with open_runtime(
        store=MemoryStore(), providers={"scripted": model}, tools=[fetch, guarded]
    ) as rt:
        agent = (await rt.agents.create(options=options(tmp_path / "w"))).agent
        (tmp_path / "w").mkdir()
        agent.followup("go")
        await agent.wait_idle()
        assert agent.approve("c1", always=True) is None
        await agent.wait_idle()
        events = agent.session.events
    assert not [e for e in events if e.type == "permissions/allowed"]
    assert codes(events)["c1"] is not None  # the tool refuses it anyway
    assert not (tmp_path / "out.txt").exists()


CHILD = AgentOptions(id="child", provider="c", model="m", tools=("write_file",))


async def test_a_sub_agent_inherits_its_parents_policy_unless_it_sets_its_own(
    tmp_path: Path,
) -> None:
    child_calls = [Reply.tool_calls(write("c.txt", "k1")), Reply.text("child done")] * 2
    async with parent_child_runtime(child=child_calls) as rt:
        parent_options = AgentOptions(
            id="parent", provider="p", model="m", permissions=Permissions(mode="allow-all")
        )
        parent = (await rt.agents.create(options=parent_options)).agent
        inherits = attrs.evolve(CHILD, cwd=str(tmp_path))
        child = (await rt.agents.create(options=inherits, parent_agent=parent)).agent
        child.followup("go")
        await child.wait_idle()
        assert codes(child.session.events) == {"k1": None}
        assert (tmp_path / "c.txt").exists()

        own = attrs.evolve(inherits, id="child2", permissions=Permissions(mode="ask"))
        child2 = (await rt.agents.create(options=own, parent_agent=parent)).agent
        child2.followup("go")
        await child2.wait_idle()
        assert [r.call_id for r in child2.pending_approvals()] == ["k1"]


async def test_a_sub_agent_does_not_inherit_its_parents_granted_rules(tmp_path: Path) -> None:
    async with parent_child_runtime(
        parent=[Reply.tool_calls(write("p.txt", "p1")), Reply.text("ok")],
        child=[Reply.tool_calls(write("p.txt", "k1")), Reply.text("ok")],
    ) as rt:
        parent_options = AgentOptions(
            id="parent", provider="p", model="m", cwd=str(tmp_path), tools=("write_file",)
        )
        parent = (await rt.agents.create(options=parent_options)).agent
        parent.followup("go")
        await parent.wait_idle()
        parent.approve("p1", always=True)
        await parent.wait_idle()
        child_options = attrs.evolve(CHILD, cwd=str(tmp_path))
        child = (await rt.agents.create(options=child_options, parent_agent=parent)).agent
        child.followup("go")
        await child.wait_idle()
        assert [r.call_id for r in child.pending_approvals()] == ["k1"]


async def test_the_policy_judges_the_arguments_a_pre_execute_hook_returns(tmp_path: Path) -> None:
    async def redirect(payload: Any, call_next: Any) -> Any:
        if payload["name"] == "write_file":
            payload = {**payload, "arguments": {**payload["arguments"], "path": "secret/x"}}
        return await call_next(payload)

    async def setup(scope: Any, agent: Any) -> None:
        scope.hooks.waterfall("tools/pre-execute", redirect)

    model = ScriptedModel([Reply.tool_calls(write("public/x", "c1")), Reply.text("ok")])
    policy = Permissions(mode="allow-all", deny=("write_file(secret/**)",))
    async with open_runtime(
        store=MemoryStore(),
        providers={"scripted": model},
        tools=[fetch, guarded],
        permissions=policy,
    ) as rt:
        agent = (await rt.agents.create(options=options(tmp_path), setup=setup)).agent
        agent.followup("go")
        await agent.wait_idle()
        events = agent.session.events
    assert denials(events) == {"c1": "Error: tool call denied by rule 'write_file(secret/**)'"}


async def test_alike_agents_share_one_gate_and_its_cache(tmp_path: Path) -> None:
    """A gate (and its cache of free tools) is made once per alike agents, not per agent."""
    model = ScriptedModel([Reply.tool_calls(("fetch", {"url": "u"})), Reply.text("ok")], loop=True)
    async with open_runtime(providers={"scripted": model}, tools=[fetch, guarded]) as rt:
        made = [
            (await rt.agents.create(options=attrs.evolve(options(cwd), id=name))).agent
            for name, cwd in (("a", tmp_path), ("b", tmp_path), ("c", tmp_path / "other"))
        ]
        for agent in made:
            agent.followup("go")
            await agent.wait_idle()
        a, b, c = (actor_of(agent).permission_gate for agent in made)
        assert a is not None
        assert a is b  # same policy, require_approval and cwd
        assert c is not a  # another cwd: its own gate
        ran = [list(codes(agent.session.events).values()) for agent in made]
        assert ran == [[None]] * 3  # each agent's fetch ran
