"""Tool-call ids: scripted ids never collide with explicit ones; the driver renames repeats."""

from __future__ import annotations

from dsh_agent_loop import AgentOptions, MemoryStore, Reply, ScriptedModel, open_runtime, tool

from .conftest import assert_well_formed, of_type

OPTIONS = AgentOptions(id="main", provider="scripted", model="m")


@tool
async def note(text: str) -> str:
    """Take a note."""
    return f"noted {text}"


async def _run(model: ScriptedModel, prompts: int = 1) -> list:
    async with open_runtime(store=MemoryStore(), providers={"scripted": model}, tools=[note]) as rt:
        h = await rt.agents.create(options=OPTIONS)
        for i in range(prompts):
            h.agent.followup(f"go {i}")
            await h.agent.wait_idle()
        return h.agent.session.events


def _call_ids(events: list) -> list[str]:
    return [
        b["call_id"]
        for e in of_type(events, "assistant/message")
        for b in e.data["message"]["content"]
        if b["type"] == "tool-call"
    ]


async def test_numbered_ids_skip_explicit_ids_in_the_script(autojump_clock):
    # the acceptance script's (tests/test_spec_surface.py): an explicit "call-2" next to numbered
    # ids
    model = ScriptedModel(
        [
            Reply.tool_calls(("note", {"text": "a"}), ("note", {"text": "b"}, "call-2")),
            Reply.max_tokens("cut", tool_calls=[("note", {"text": "c"})]),
            Reply.text("done"),
        ]
    )
    events = await _run(model)
    ids = _call_ids(events)
    assert ids == ["call-1", "call-2", "call-3"]
    assert_well_formed(events)


async def test_a_model_repeating_a_call_id_in_one_turn_gets_it_renamed(autojump_clock):
    model = ScriptedModel(
        [
            Reply.tool_calls(("note", {"text": "a"}, "dup"), ("note", {"text": "b"}, "dup")),
            Reply.tool_calls(("note", {"text": "c"}, "dup")),
            Reply.text("done"),
        ]
    )
    events = await _run(model)
    assert _call_ids(events) == ["dup", "dup~2", "dup~3"]
    results = {
        e.data["message"]["call_id"]: e.data["message"]["content"][0]["text"]
        for e in of_type(events, "tool/result")
    }
    assert results == {"dup": "noted a", "dup~2": "noted b", "dup~3": "noted c"}
    assert_well_formed(events)


async def test_ids_repeated_in_a_later_turn_are_renamed_too(autojump_clock):
    model = ScriptedModel(
        [
            Reply.tool_calls(("note", {"text": "a"}, "x")),
            Reply.text("one"),
            Reply.tool_calls(("note", {"text": "b"}, "x")),
            Reply.text("two"),
        ]
    )
    events = await _run(model, prompts=2)
    # providers reject a request whose tool-call ids repeat anywhere in its history
    assert _call_ids(events) == ["x", "x~2"]
    assert_well_formed(events)
