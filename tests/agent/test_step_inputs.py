"""What a step starts from: the default assembly cache, runtime context, user normalisation."""

from __future__ import annotations

import attrs

from dsh_agent_loop import FrozenDict, Reply, tool
from dsh_agent_loop._agent.step_inputs import (
    NO_RUNTIME_CONTEXT,
    AssemblyCache,
    default_context,
    normalise_users,
    visible_tools,
)
from dsh_agent_loop.testing import actor_of

from .conftest import OPTIONS, harness


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return key


async def test_the_default_assembly_is_reused_until_an_input_changes(autojump_clock):
    async with harness([Reply.text("hi")], tools=[lookup]) as h:
        cache = AssemblyCache()
        first = cache.get(actor_of(h.agent))
        assert cache.get(actor_of(h.agent)) is first
        assert [t.name for t in first.tools] == ["lookup"]
        actor_of(h.agent).scope.persona = "be kind"
        second = cache.get(actor_of(h.agent))
        assert second is not first
        assert [s.text for s in second.sections] == ["be kind"]
        dispose = actor_of(h.agent).scope.add_tool(attrs.evolve(lookup, name="scoped"))
        assert [t.name for t in cache.get(actor_of(h.agent)).tools] == ["lookup", "scoped"]
        dispose()
        assert list(visible_tools(actor_of(h.agent))) == ["lookup"]


async def test_runtime_context_is_admitted_only_when_it_changes(autojump_clock):
    options = attrs.evolve(OPTIONS, cwd="/srv")
    async with harness([Reply.text("hi")], options=options) as h:
        message = default_context(actor_of(h.agent))
        assert message is not None
        assert message["source"] == "runtime-context"
        await h.run()
        assert default_context(actor_of(h.agent)) is None  # the logged text is the same
        actor_of(h.agent).options = attrs.evolve(options, cwd=None)
        cleared = default_context(actor_of(h.agent))
        assert cleared is not None
        assert cleared["content"][0]["text"] == NO_RUNTIME_CONTEXT


async def test_users_keep_inbox_ids_and_new_ones_get_fresh_ids(autojump_clock):
    async with harness([Reply.text("hi")]) as h:
        kept = FrozenDict(role="user", id="m-7", content=())
        users = normalise_users(actor_of(h.agent), [kept, "plain", "again"])
        assert users[0] is kept
        next_id = actor_of(h.agent).log.inbox.max_id + 1
        assert [u["id"] for u in users[1:]] == [f"m-{next_id}", f"m-{next_id + 1}"]
        assert normalise_users(actor_of(h.agent), ()) == ()
