"""``rt.agents.create`` refuses a provider nobody registered, at once (``_agent/options.py``)."""

from __future__ import annotations

import pytest

from dsh_agent_loop import (
    AgentOptions,
    InvalidOptionError,
    MemoryStore,
    Reply,
    ScriptedModel,
    open_runtime,
)


async def test_an_unregistered_provider_is_refused_at_create_naming_the_known_ones() -> None:
    store = MemoryStore()
    providers = {"scripted": ScriptedModel([Reply.text("hi")]), "other": ScriptedModel([])}
    async with open_runtime(store=store, providers=providers) as rt:
        with pytest.raises(InvalidOptionError) as info:
            await rt.agents.create(
                session_id="s1", options=AgentOptions(id="main", provider="deepsek", model="m")
            )
        assert info.value.code == "INVALID_OPTION"
        assert (
            str(info.value) == "agent 'main': unknown provider 'deepsek' (known: other, scripted)"
        )
        assert rt.agents.get("main") is None
        assert await store.list() == []  # rolled back before anything was stored
        # the same ids work once the provider is right
        handle = await rt.agents.create(
            session_id="s1", options=AgentOptions(id="main", provider="scripted", model="m")
        )
        assert (await handle.agent.run("hello")).text == "hi"


async def test_no_provider_registered_says_so() -> None:
    async with open_runtime() as rt:
        with pytest.raises(
            InvalidOptionError, match=r"unknown provider 'p' \(known: none registered\)"
        ):
            await rt.agents.create(options=AgentOptions(id="main", provider="p", model="m"))
