"""Turn spans join the caller's trace (``otel.py``): the span active where a prompt was queued."""

from __future__ import annotations

import pytest
import trio

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dsh_agent_loop import AgentOptions, Reply, ScriptedModel, open_runtime, tool

OPTIONS = AgentOptions(id="main", provider="scripted", model="m")


@tool
async def weather(city: str) -> str:
    """Look up the weather."""
    return f"sunny in {city}"


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def _ids(span: ReadableSpan) -> tuple[int, int]:
    assert span.context is not None
    return span.context.trace_id, span.context.span_id


async def test_a_turn_span_is_a_child_of_the_callers_span(autojump_clock: trio.abc.Clock) -> None:
    provider, exporter = _provider()
    tracer = provider.get_tracer("app")
    model = ScriptedModel([Reply.tool_calls(("weather", {"city": "Oslo"})), Reply.text("sunny")])
    async with open_runtime(
        providers={"scripted": model}, tools=[weather], tracer_provider=provider
    ) as rt:
        handle = await rt.agents.create(options=OPTIONS)
        with tracer.start_as_current_span("request"):
            await handle.agent.run("weather in Oslo?")
    spans = exporter.get_finished_spans()
    (request,) = _named(spans, "request")
    (turn,) = _named(spans, "invoke_agent main")
    assert turn.parent is not None
    assert (turn.parent.trace_id, turn.parent.span_id) == _ids(request)
    # the turn's children stay under the turn, in the caller's trace
    for span in spans:
        if span.name.startswith(("chat", "execute_tool")):
            assert span.parent is not None
            assert span.parent.span_id == _ids(turn)[1]
            assert _ids(span)[0] == _ids(request)[0]


async def test_each_turn_joins_the_trace_its_prompt_came_from(
    autojump_clock: trio.abc.Clock,
) -> None:
    provider, exporter = _provider()
    tracer = provider.get_tracer("app")
    model = ScriptedModel([Reply.text("one"), Reply.text("two"), Reply.text("three")])
    async with open_runtime(providers={"scripted": model}, tracer_provider=provider) as rt:
        agent = (await rt.agents.create(options=OPTIONS)).agent
        with tracer.start_as_current_span("first"):
            await agent.run("1")
        with tracer.start_as_current_span("second"):
            agent.followup("2")  # queued from this span, claimed after the caller left it
        await agent.wait_idle()
        with tracer.start_as_current_span("dropped"):
            dropped = agent.send("never runs", "next-turn", False)
        assert agent.inbox.remove(dropped)  # no turn claims it: its span is nobody's parent
        await agent.run("3")  # no span active: a trace of its own
    spans = exporter.get_finished_spans()
    first, second = _named(spans, "first")[0], _named(spans, "second")[0]
    turns = _named(spans, "invoke_agent main")
    assert len(turns) == 3
    assert turns[0].parent is not None
    assert turns[0].parent.span_id == _ids(first)[1]
    assert turns[1].parent is not None
    assert turns[1].parent.span_id == _ids(second)[1]
    assert turns[2].parent is None
    assert len({_ids(turn)[0] for turn in turns}) == 3
