"""``rt.agents.resume(session_id)`` without options restores them from the log
(docs/design.md#resume)."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from dsh_agent_loop import (
    AgentOptions,
    InvalidOptionError,
    MemoryStore,
    Reply,
    ScriptedModel,
    SessionNotFoundError,
    SqliteStore,
    TurnBudget,
    open_runtime,
)
from dsh_agent_loop._session.store import SessionStore

from .conftest import assert_well_formed, turn_ends

PLUGIN = "@deepseek-ai/dsh-agent-loop"
CREATED = AgentOptions(
    id="main",
    provider="scripted",
    model="m-large",
    reasoning_effort="high",
    max_tokens=321,
    cwd="/srv/project",
    persona="You answer in haiku.",
    tools=("echo",),
    turn_budget=TurnBudget(max_steps=7),
    require_approval=frozenset({"echo"}),
)
MODEL_CONFIG = {
    "provider": "scripted",
    "model": "m-large",
    "reasoning_effort": "high",
    "max_tokens": 321,
}


def config_of(request: Any) -> dict[str, Any]:
    return dict(request.config)


def system_text(request: Any) -> str:
    return "\n".join(
        b["text"] for m in request.messages if m["role"] == "system" for b in m["content"]
    )


def user_text(request: Any) -> str:
    return "\n".join(
        b.get("text", "") for m in request.messages if m["role"] == "user" for b in m["content"]
    )


StoreFactory = Callable[[], SessionStore]


@pytest.fixture(params=["memory", "sqlite"])
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """A factory of store objects over the same sessions (a fresh object per runtime)."""
    if request.param == "memory":
        shared = MemoryStore()
        return lambda: shared
    return lambda: SqliteStore(tmp_path / "sessions.db")


@asynccontextmanager
async def runtime(store: SessionStore, model: ScriptedModel, **kwargs: Any) -> AsyncIterator[Any]:
    from dsh_agent_loop import tool

    @tool
    async def echo(text: str) -> str:
        """Echo the text."""
        return text

    providers = {"scripted": model}
    async with open_runtime(store=store, providers=providers, tools=[echo], **kwargs) as rt:
        yield rt


async def run_turn(agent: Any, text: str) -> None:
    agent.followup(text)
    await agent.wait_idle()


async def created_session(new_store: StoreFactory) -> ScriptedModel:
    """Create ``s1`` with every option set, run one turn, leave the runtime."""
    model = ScriptedModel([Reply.text("first")])
    async with runtime(new_store(), model) as rt:
        handle = await rt.agents.create(session_id="s1", options=CREATED)
        await run_turn(handle.agent, "one")
    return model


async def test_resume_without_options_restores_them(new_store: StoreFactory) -> None:
    first = await created_session(new_store)
    model = ScriptedModel([Reply.text("second")])
    async with runtime(new_store(), model) as rt:  # a new runtime, as after a restart
        handle = await rt.agents.resume("s1")
        agent = handle.agent
        assert agent.id == "main"
        assert agent.options == CREATED
        await run_turn(agent, "two")
        assert turn_ends(agent.session.events) == [{"kind": "completed"}] * 2
        assert_well_formed(agent.session.events)
        request = model.requests[-1]
    # the same provider, model, effort and cap; the same persona, tools and working directory
    assert config_of(request) == config_of(first.requests[-1]) == MODEL_CONFIG
    assert "You answer in haiku." in system_text(request)
    assert [t["name"] for t in request.tools] == ["echo"]
    assert "cwd: /srv/project" in user_text(request)
    headers = [e.data["reason"] for e in agent.session.events if e.type == "request/header"]
    assert headers == ["initial", "resume"]


async def test_explicit_options_override_field_by_field(new_store: StoreFactory) -> None:
    await created_session(new_store)
    model = ScriptedModel([Reply.text("second"), Reply.text("third")])
    async with runtime(new_store(), model) as rt:
        handle = await rt.agents.resume(
            "s1", options=AgentOptions(id="main", model="m-small", persona="Be plain.")
        )
        assert handle.agent.options.cwd == "/srv/project"
        await run_turn(handle.agent, "two")
        await handle.dispose()
        assert config_of(model.requests[-1]) == {**MODEL_CONFIG, "model": "m-small"}
        assert "Be plain." in system_text(model.requests[-1])
        # without options again: the latest request config wins over the options at create
        again = await rt.agents.resume("s1")
        await run_turn(again.agent, "three")
        assert config_of(model.requests[-1]) == {**MODEL_CONFIG, "model": "m-small"}
        assert again.agent.options.persona == "You answer in haiku."  # the header's persona


async def test_a_different_agent_id_is_refused_and_releases_the_session(
    new_store: StoreFactory,
) -> None:
    await created_session(new_store)
    model = ScriptedModel([Reply.text("second")])
    async with runtime(new_store(), model) as rt:
        with pytest.raises(InvalidOptionError, match="'other' is not the agent of this session"):
            await rt.agents.resume("s1", options=AgentOptions(id="other"))
        assert rt.agents.get("other") is None
        handle = await rt.agents.resume("s1")  # ownership was released: the session resumes
        assert handle.agent.id == "main"


async def test_a_session_that_never_made_a_request_resumes_from_its_header() -> None:
    store = MemoryStore()
    async with runtime(store, ScriptedModel()) as rt:
        handle = await rt.agents.create(session_id="s1", options=CREATED)
        handle.agent.send("queued", wake=False)
    model = ScriptedModel([Reply.text("done")])
    async with runtime(store, model) as rt:
        handle = await rt.agents.resume("s1")  # the queued prompt starts at once
        await handle.agent.wait_idle()
        assert turn_ends(handle.agent.session.events) == [{"kind": "completed"}]
    assert config_of(model.requests[0]) == MODEL_CONFIG


async def test_an_old_header_without_options_still_resumes() -> None:
    written, store = MemoryStore(), MemoryStore()
    model = ScriptedModel([Reply.text("a"), Reply.text("b")])
    options = AgentOptions(id="main", provider="scripted", model="m")
    async with runtime(written, model) as rt:
        handle = await rt.agents.create(session_id="s1", options=options)
        await run_turn(handle.agent, "one")
        header = dict(handle.agent.session.header)
        events = handle.agent.session.events
    assert header.pop("options") == {"provider": "scripted", "model": "m"}
    old = await store.create(header)  # as written before the header carried options
    await old.append(events)
    await old.flush()
    await old.close()
    async with runtime(store, model) as rt:
        handle = await rt.agents.resume("s1")
        assert handle.agent.options == options  # provider and model from the request config
        await run_turn(handle.agent, "two")
        assert turn_ends(handle.agent.session.events)[-1] == {"kind": "completed"}


async def test_resume_without_options_cannot_create() -> None:
    async with runtime(MemoryStore(), ScriptedModel()) as rt:
        with pytest.raises(SessionNotFoundError):
            await rt.agents.resume("nope")
        with pytest.raises(TypeError, match="create_if_missing=True"):
            await rt.agents.resume("nope", create_if_missing=True)


async def test_a_live_agent_id_is_refused_after_reading_the_header() -> None:
    from dsh_agent_loop import AgentAlreadyExistsError

    store = MemoryStore()
    await created_session(lambda: store)
    async with runtime(store, ScriptedModel()) as rt:
        await rt.agents.create(options=AgentOptions(id="main", provider="scripted", model="m"))
        with pytest.raises(AgentAlreadyExistsError):
            await rt.agents.resume("s1")
        assert await rt.store.stat("s1") is not None
        rt.agents.get("main")  # the live one is untouched


@pytest.mark.parametrize("key", ["resumeSessionId", "sessionId"])
async def test_a_declared_agent_resumes_with_remembered_options(key: str) -> None:
    store = MemoryStore()
    await created_session(lambda: store)
    model = ScriptedModel([Reply.text("again")])
    config = {"plugins": [{"name": PLUGIN, "config": {"agents": [{"id": "main", key: "s1"}]}}]}
    async with runtime(store, model, config=config) as rt:
        assert rt.start_failures == []
        agent = rt.agents.get("main")
        assert agent is not None
        await run_turn(agent, "two")
    assert config_of(model.requests[-1]) == MODEL_CONFIG


_CHILD = textwrap.dedent(
    """
    import json, sys
    import trio
    from dsh_agent_loop import Reply, ScriptedModel, SqliteStore, open_runtime, tool

    @tool
    async def echo(text: str) -> str:
        '''Echo the text.'''
        return text

    async def main():
        model = ScriptedModel([Reply.text("from another process")])
        store = SqliteStore(sys.argv[1])
        async with open_runtime(store=store, providers={"scripted": model}, tools=[echo]) as rt:
            handle = await rt.agents.resume("s1")
            handle.agent.followup("two")
            await handle.agent.wait_idle()
        request = model.requests[-1]
        print(json.dumps({"config": dict(request.config),
                          "tools": [t["name"] for t in request.tools]}))

    trio.run(main)
    """
)


async def test_a_new_process_resumes_with_remembered_options(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    await created_session(lambda: SqliteStore(path))
    done = await trio.run_process(
        [sys.executable, "-c", _CHILD, str(path)], capture_stdout=True, capture_stderr=True
    )
    assert json.loads(done.stdout) == {"config": MODEL_CONFIG, "tools": ["echo"]}
    store = SqliteStore(path)
    async with runtime(store, ScriptedModel()) as rt:
        reader = await rt.store.open("s1", "read")
        events = await reader.read()
        await reader.close()
    assert turn_ends(events) == [{"kind": "completed"}] * 2
