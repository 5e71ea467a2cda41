"""The surface acceptance checks use (docs/design.md#public-surface): the example script and the
names around it."""

from __future__ import annotations

import inspect

import pytest
import trio

from dsh_agent_loop import (
    AgentOptions,
    Event,
    JsonlStore,
    MemoryStore,
    PreStepDecision,
    PromptAssembly,
    PromptSection,
    Reply,
    Retry,
    ScriptedModel,
    SequenceConflictError,
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionNotFoundError,
    SessionOwnershipLostError,
    SqliteStore,
    invariants,
    open_runtime,
    tool,
)
from dsh_agent_loop.testing import explore_cancellation


@tool(execution_mode="exclusive")
async def set_note(text: str) -> str:
    """Store a note."""
    return f"noted {text}"


@tool
async def weather(city: str) -> str:
    """Look up the weather."""
    return f"sunny in {city}"


def spec_model() -> ScriptedModel:
    return ScriptedModel(
        [
            Reply.text("Hello", reasoning="think"),
            Reply.tool_calls(("set_note", {"text": "a"}), ("weather", {"city": "Paris"}, "call-2")),
            Reply.error("HTTP_5XX", "bad gateway", after_text="par"),
            Reply.max_tokens("cut", tool_calls=[("set_note", {"text": "b"})]),
            Reply.hang(after_text="partial"),
            lambda request: Reply.text(str(len(request.messages))),
        ],
        latency=0.0,
        system_prompt_update=None,
    )


async def test_the_spec_script_runs_well_formed(autojump_clock):
    model = spec_model()
    async with open_runtime(
        store=MemoryStore(),
        providers={"scripted": model},
        tools=[set_note, weather],
        max_parallel_tool_calls=2,
    ) as rt:

        async def retry(payload, next):
            return Retry(delay=0)

        rt.hooks.waterfall("agent/request-error", retry)
        h = await rt.agents.create(options=AgentOptions(id="main", provider="scripted", model="m"))
        h.agent.followup("go")
        await h.agent.wait_idle()
        h.agent.followup(
            "tools"
        )  # tools, a retried 5XX, max-tokens with a complete call, then a hang
        with trio.move_on_after(5):
            await h.agent.wait_idle()
        assert h.agent.status.value == "running"
        h.agent.cancel()
        await h.agent.wait_idle()
        h.agent.followup("count")
        await h.agent.wait_idle()
        events = h.agent.session.events
        assert invariants.check(events) == []
        ends = [e.data["reason"]["kind"] for e in events if e.type == "turn/end"]
        assert ends == ["completed", "aborted", "completed"]
        texts = [
            b["text"]
            for e in events
            if e.type == "assistant/message"
            for b in e.data["message"]["content"]
            if b["type"] == "text"
        ]
        assert texts[:3] == ["Hello", "cut", "partial"]
        assert texts[3] == str(len(model.requests[-1].messages))
        assert len(model.requests) == 6
        event = events[0]
        assert isinstance(event, Event)
        assert (
            event.type,
            event.seq,
            event.ignorable,
            event.surface_op,
            event.source_event_seqs,
        ) == (
            "session/end-seed",
            0,
            False,
            None,
            None,
        )
        with pytest.raises(TypeError):
            event.data["x"] = 1  # type: ignore[index]
        sid = h.agent.session_id
        await h.dispose()
        again = await rt.agents.resume(
            sid, options=AgentOptions(id="main", provider="scripted", model="m")
        )
        assert again.agent.session.events[: len(events)] == events
        assert rt.store is not None


async def test_hook_forms_of_section_19(autojump_clock):
    seen = []

    async def pre_step(payload, next):
        seen.append(("pre-step", payload["turn"], payload["step"]))
        decision = await next(payload)
        assert isinstance(decision, PreStepDecision)
        return PreStepDecision.enter(decision.messages, starts_request_series=False)

    async def assemble(payload, next):
        assembly = await next(payload)
        assert isinstance(assembly, PromptAssembly)
        return PromptAssembly(
            (*assembly.sections, PromptSection("persona", "Be brief.")), assembly.tools
        )

    async def stopping(payload):
        seen.append(("turn-stopping", payload["turn"]))

    model = ScriptedModel([Reply.text("ok")])
    async with open_runtime(store=MemoryStore(), providers={"scripted": model}) as rt:
        rt.hooks.waterfall("agent/pre-step", pre_step)
        rt.hooks.waterfall("system-prompt/assemble", assemble)
        rt.hooks.serial("agent/turn-stopping", stopping)
        frames = []
        rt.hooks.on("agent/assistant-stream", lambda e: frames.append(e.data["frame"]))
        h = await rt.agents.create(options=AgentOptions(id="main", provider="scripted", model="m"))
        h.agent.followup("hi")
        await h.agent.wait_idle()
    assert seen == [("pre-step", 1, 1), ("turn-stopping", 1)]
    assert model.requests[0].messages[0]["content"][0]["text"] == "Be brief."
    assert frames[0] == "start"
    assert frames[-1] == "end"
    assert "chunk" in frames


def test_explore_cancellation_signature_and_report():
    params = inspect.signature(explore_cancellation).parameters
    assert list(params)[:5] == ["scenario", "providers", "tools", "store_factory", "seed"]
    assert params["store_factory"].default is MemoryStore
    assert params["seed"].default == 0

    async def scenario(rt):
        h = await rt.agents.create(options=AgentOptions(id="main", provider="scripted", model="m"))
        h.agent.followup("go")
        await h.agent.wait_idle()

    report = explore_cancellation(
        scenario, providers=lambda: {"scripted": spec_model()}, tools=(set_note, weather)
    )
    assert report.checkpoints > 0
    assert report.runs == report.checkpoints
    assert report.failures == []


def test_store_names_are_importable_from_their_places():
    from dsh_agent_loop.stores.postgres import PostgresStore

    assert PostgresStore.__name__ == "PostgresStore"
    assert all(
        issubclass(e, Exception)
        for e in (
            SessionAlreadyExistsError,
            SessionNotFoundError,
            SessionAlreadyOwnedError,
            SessionOwnershipLostError,
            SequenceConflictError,
        )
    )
    assert callable(SqliteStore)
    assert callable(JsonlStore)


def test_agent_closed_error_is_a_root_export():
    import dsh_agent_loop
    from dsh_agent_loop import AgentClosedError, AgentLoopError

    assert "AgentClosedError" in dsh_agent_loop.__all__
    assert issubclass(AgentClosedError, AgentLoopError)
    assert AgentClosedError("closed").code == "AGENT_CLOSED"
