"""OpenTelemetry tracing (``otel.py``): the span tree of turns, attempts and tool calls."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import trio

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from dsh_agent_loop import AgentOptions, Reply, Retry, ScriptedModel, open_runtime, tool
from dsh_agent_loop.otel import trace_runtime

from .llm.agent_helpers import CLAUDE_KEY_ENV, KEY_ENV, MODELS, live_agent, plain
from .llm.server import Reply as HttpReply
from .llm.server import transcript

OPTIONS = AgentOptions(id="main", provider="scripted", model="m")


@tool
async def weather(city: str) -> str:
    """Look up the weather."""
    if city == "Atlantis":
        raise LookupError("no such city")
    return f"sunny in {city}"


@tool
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await trio.sleep(seconds)
    return "done"


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        out.setdefault(span.name, []).append(span)
    return out


def _parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def _span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    span_id: int = span.context.span_id
    return span_id


def _int(span: ReadableSpan, key: str) -> int:
    value = (span.attributes or {})[key]
    assert isinstance(value, int)
    return value


async def _run_turn(
    model: ScriptedModel, provider: TracerProvider, *, capture_content: bool = False
) -> str:
    async with open_runtime(
        providers={"scripted": model},
        tools=[weather],
        tracer_provider=provider,
        otel_capture_content=capture_content,
    ) as rt:
        handle = await rt.agents.create(options=OPTIONS)
        handle.agent.followup("Weather in Oslo and Atlantis?")
        await handle.agent.wait_idle()
        return handle.session_id


async def test_a_tool_turn_yields_the_span_tree(autojump_clock: trio.abc.Clock) -> None:
    provider, exporter = _provider()
    model = ScriptedModel(
        [
            Reply.tool_calls(("weather", {"city": "Oslo"}), ("weather", {"city": "Atlantis"})),
            Reply.text("Oslo is sunny; Atlantis does not exist."),
        ]
    )
    session_id = await _run_turn(model, provider)

    spans = _by_name(exporter.get_finished_spans())
    assert sorted(spans) == ["chat m", "execute_tool weather", "invoke_agent main"]
    (turn,) = spans["invoke_agent main"]
    assert turn.parent is None
    assert turn.kind is SpanKind.INTERNAL
    assert turn.status.status_code is StatusCode.UNSET
    assert turn.attributes is not None
    assert dict(turn.attributes) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "main",
        "gen_ai.conversation.id": session_id,
        "gen_ai.provider.name": "scripted",
        "gen_ai.request.model": "m",
        "gen_ai.usage.input_tokens": turn.attributes["gen_ai.usage.input_tokens"],
        "gen_ai.usage.output_tokens": turn.attributes["gen_ai.usage.output_tokens"],
        "dsh_agent_loop.turn.end": "completed",
    }

    chats = spans["chat m"]
    assert len(chats) == 2
    assert all(_parent_id(c) == _span_id(turn) for c in chats)
    assert all(c.kind is SpanKind.CLIENT for c in chats)
    first, second = chats
    assert first.attributes is not None
    assert second.attributes is not None
    assert first.attributes["gen_ai.operation.name"] == "chat"
    assert first.attributes["gen_ai.provider.name"] == "scripted"
    assert first.attributes["gen_ai.request.model"] == "m"
    assert first.attributes["gen_ai.conversation.id"] == session_id
    assert first.attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert second.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    total_in = sum(_int(c, "gen_ai.usage.input_tokens") for c in chats)
    total_out = sum(_int(c, "gen_ai.usage.output_tokens") for c in chats)
    assert total_in > 0
    assert total_out > 0
    assert turn.attributes["gen_ai.usage.input_tokens"] == total_in
    assert turn.attributes["gen_ai.usage.output_tokens"] == total_out

    ok, failed = spans["execute_tool weather"]
    assert all(_parent_id(t) == _span_id(turn) for t in (ok, failed))
    assert ok.attributes is not None
    assert failed.attributes is not None
    assert ok.attributes["gen_ai.operation.name"] == "execute_tool"
    assert ok.attributes["gen_ai.tool.name"] == "weather"
    assert (ok.attributes["gen_ai.tool.call.id"], failed.attributes["gen_ai.tool.call.id"]) == (
        "call-1",
        "call-2",
    )
    assert ok.status.status_code is StatusCode.UNSET
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["error.type"] == "TOOL_ERROR"

    # Times nest: the turn holds its attempts and calls, in log order.
    assert turn.start_time is not None
    assert turn.end_time is not None
    assert turn.start_time <= first.start_time <= first.end_time <= ok.start_time  # type: ignore[operator]
    assert ok.end_time <= second.start_time <= second.end_time <= turn.end_time  # type: ignore[operator]

    # Content is absent unless asked for.
    for span in exporter.get_finished_spans():
        assert span.attributes is not None
        assert not {k for k in span.attributes if "messages" in k or "call.arguments" in k}
        assert "gen_ai.tool.call.result" not in span.attributes


async def test_a_retried_attempt_yields_two_chat_spans(autojump_clock: trio.abc.Clock) -> None:
    provider, exporter = _provider()
    model = ScriptedModel(
        [Reply.error("HTTP_5XX", "overloaded", after_text="Hm"), Reply.text("hi")]
    )
    await _run_turn(model, provider)

    spans = _by_name(exporter.get_finished_spans())
    (turn,) = spans["invoke_agent main"]
    failed, ok = spans["chat m"]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "HTTP_5XX"  # the provider's message is content
    assert failed.attributes is not None
    assert failed.attributes["error.type"] == "HTTP_5XX"
    assert failed.attributes["dsh_agent_loop.attempt"] == 1
    assert ok.status.status_code is StatusCode.UNSET
    assert ok.attributes is not None
    assert ok.attributes["dsh_agent_loop.attempt"] == 2
    assert failed.end_time <= ok.start_time  # type: ignore[operator]
    assert turn.status.status_code is StatusCode.UNSET


async def test_a_retried_attempts_chat_span_starts_after_the_backoff(
    autojump_clock: trio.abc.Clock,
) -> None:
    provider, exporter = _provider()
    model = ScriptedModel(
        [Reply.error("HTTP_5XX", "overloaded", after_text="Hm"), Reply.text("hi there")],
        latency=0.5,
    )

    async def retry_later(payload: object, next: object) -> Retry:
        return Retry(delay=30.0)

    async with open_runtime(
        providers={"scripted": model}, tracer_provider=provider, clock=trio.current_time
    ) as rt:
        rt.hooks.waterfall("agent/request-error", retry_later)
        handle = await rt.agents.create(options=OPTIONS)
        handle.agent.followup("hello")
        await handle.agent.wait_idle()

    spans = _by_name(exporter.get_finished_spans())
    (turn,) = spans["invoke_agent main"]
    failed, ok = spans["chat m"]
    second = 1_000_000_000
    assert turn.start_time <= failed.start_time < failed.end_time  # type: ignore[operator]
    # The retried attempt's span starts when it began, 30 s of backoff after the failure ...
    assert ok.start_time - failed.end_time >= 30 * second  # type: ignore[operator]
    # ... so it spans the attempt alone (its stream, half a second a chunk).
    assert 0 < ok.end_time - ok.start_time < 5 * second  # type: ignore[operator]
    assert ok.end_time <= turn.end_time  # type: ignore[operator]


async def test_a_failed_turn_carries_its_code(autojump_clock: trio.abc.Clock) -> None:
    provider, exporter = _provider()
    model = ScriptedModel([Reply.error("HTTP_4XX", "model not found", status=404)])
    await _run_turn(model, provider)

    spans = _by_name(exporter.get_finished_spans())
    (turn,) = spans["invoke_agent main"]
    (chat,) = spans["chat m"]
    for span in (turn, chat):
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes is not None
        assert span.attributes["error.type"] == "HTTP_4XX"


async def test_a_cancelled_turn_ends_its_spans_with_an_error(
    autojump_clock: trio.abc.Clock,
) -> None:
    provider, exporter = _provider()
    model = ScriptedModel([Reply.tool_calls(("slow", {"seconds": 60})), Reply.text("never")])
    async with open_runtime(
        providers={"scripted": model}, tools=[slow], tracer_provider=provider
    ) as rt:
        handle = await rt.agents.create(options=OPTIONS)
        handle.agent.followup("wait")
        await trio.sleep(1)
        assert [s.name for s in exporter.get_finished_spans()] == ["chat m"]  # the rest are open
        handle.agent.cancel()
        await handle.agent.wait_idle()

    spans = _by_name(exporter.get_finished_spans())
    (turn,) = spans["invoke_agent main"]
    (call,) = spans["execute_tool slow"]
    for span in (turn, call):
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes is not None
        assert span.attributes["error.type"] == "ABORTED"
    assert turn.status.description == "ABORTED: cancelled (user)"


async def test_leaving_the_runtime_mid_turn_ends_every_span(
    autojump_clock: trio.abc.Clock,
) -> None:
    provider, exporter = _provider()
    model = ScriptedModel([Reply.tool_calls(("slow", {"seconds": 60})), Reply.text("never")])
    with trio.move_on_after(5):
        async with open_runtime(
            providers={"scripted": model}, tools=[slow], tracer_provider=provider
        ) as rt:
            handle = await rt.agents.create(options=OPTIONS)
            handle.agent.followup("wait")
            await trio.sleep_forever()

    spans = _by_name(exporter.get_finished_spans())
    (turn,) = spans["invoke_agent main"]
    (call,) = spans["execute_tool slow"]
    assert turn.status.status_code is StatusCode.ERROR
    assert turn.status.description == "ABORTED: cancelled (disposed)"
    assert call.status.status_code is StatusCode.ERROR


async def test_content_is_recorded_when_asked(autojump_clock: trio.abc.Clock) -> None:
    provider, exporter = _provider()
    model = ScriptedModel(
        [Reply.tool_calls(("weather", {"city": "Oslo"})), Reply.text("Oslo is sunny.")]
    )
    await _run_turn(model, provider, capture_content=True)

    spans = _by_name(exporter.get_finished_spans())
    first, second = spans["chat m"]
    assert first.attributes is not None
    assert second.attributes is not None
    sent = json.loads(str(first.attributes["gen_ai.input.messages"]))
    assert sent[-1]["role"] == "user"
    assert sent[-1]["parts"] == [{"type": "text", "content": "Weather in Oslo and Atlantis?"}]
    out = json.loads(str(first.attributes["gen_ai.output.messages"]))
    assert out[0]["parts"][0]["type"] == "tool_call"
    assert out[0]["parts"][0]["name"] == "weather"
    resent = json.loads(str(second.attributes["gen_ai.input.messages"]))
    assert resent[-1] == {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": "call-1", "response": "sunny in Oslo"}],
    }
    answer = json.loads(str(second.attributes["gen_ai.output.messages"]))
    assert answer == [
        {"role": "assistant", "parts": [{"type": "text", "content": "Oslo is sunny."}]}
    ]
    (call,) = spans["execute_tool weather"]
    assert call.attributes is not None
    assert json.loads(str(call.attributes["gen_ai.tool.call.arguments"])) == {"city": "Oslo"}
    assert call.attributes["gen_ai.tool.call.result"] == "sunny in Oslo"


async def test_without_a_provider_nothing_listens(autojump_clock: trio.abc.Clock) -> None:
    async with open_runtime(providers={"scripted": ScriptedModel([])}) as rt:
        assert not rt.hooks.any("on")


async def test_trace_runtime_disposer_stops_tracing(autojump_clock: trio.abc.Clock) -> None:
    provider, exporter = _provider()
    model = ScriptedModel([Reply.text("one"), Reply.text("two")])
    async with open_runtime(providers={"scripted": model}) as rt:
        dispose = trace_runtime(rt, provider)
        handle = await rt.agents.create(options=OPTIONS)
        handle.agent.followup("hi")
        await handle.agent.wait_idle()
        dispose()
        assert not rt.hooks.any("on")
        handle.agent.followup("again")
        await handle.agent.wait_idle()
    assert [s.name for s in exporter.get_finished_spans()] == ["chat m", "invoke_agent main"]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_importing_the_package_does_not_import_opentelemetry() -> None:
    done = _python(
        """
        import sys
        import dsh_agent_loop, dsh_agent_loop.config, dsh_agent_loop._runtime
        loaded = [m for m in sys.modules if m.startswith("opentelemetry")]
        assert not loaded, loaded
        """
    )
    assert done.returncode == 0, done.stderr


def test_config_otel_true_uses_the_global_provider() -> None:
    # A subprocess: the global tracer provider can be set once per process.
    done = _python(
        """
        import trio
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from dsh_agent_loop import AgentOptions, Reply, ScriptedModel, open_runtime

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        PLUGIN = "@deepseek-ai/dsh-agent-loop"

        async def turn(otel):
            config = {"plugins": [{"name": PLUGIN, "config": {"otel": otel}}]}
            model = ScriptedModel([Reply.text("hi")])
            async with open_runtime(config, providers={"scripted": model}) as rt:
                handle = await rt.agents.create(
                    options=AgentOptions(id="main", provider="scripted", model="m")
                )
                handle.agent.followup("hello")
                await handle.agent.wait_idle()
            spans = exporter.get_finished_spans()
            exporter.clear()
            return spans

        async def main():
            assert await turn(False) == ()
            spans = await turn(True)
            assert sorted(s.name for s in spans) == ["chat m", "invoke_agent main"], spans
            assert all("gen_ai.input.messages" not in s.attributes for s in spans)
            spans = await turn({"captureContent": True})
            (chat,) = [s for s in spans if s.name == "chat m"]
            assert "hello" in chat.attributes["gen_ai.input.messages"]
            print("ok")

        trio.run(main)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


async def test_a_call_awaiting_approval_gets_a_span_in_each_turn(
    autojump_clock: trio.abc.Clock,
) -> None:
    provider, exporter = _provider()
    model = ScriptedModel([Reply.tool_calls(("weather", {"city": "Oslo"})), Reply.text("Sunny.")])
    options = AgentOptions(id="main", provider="scripted", model="m", require_approval={"weather"})
    async with open_runtime(
        providers={"scripted": model}, tools=[weather], tracer_provider=provider
    ) as rt:
        agent = (await rt.agents.create(options=options)).agent
        agent.followup("Weather in Oslo?")
        await agent.wait_idle()
        (waiting,) = _by_name(exporter.get_finished_spans())["execute_tool weather"]
        assert waiting.attributes is not None
        assert waiting.status.status_code is StatusCode.UNSET
        await agent.resolve_approvals({"call-1": True})

    spans = _by_name(exporter.get_finished_spans())
    first, second = spans["invoke_agent main"]
    assert first.attributes is not None
    assert first.attributes["dsh_agent_loop.turn.end"] == "awaiting-approval"
    assert first.status.status_code is StatusCode.UNSET
    deferred, run = spans["execute_tool weather"]
    assert _parent_id(deferred) == _span_id(first)
    assert _parent_id(run) == _span_id(second)
    assert run.attributes is not None
    assert run.attributes["gen_ai.tool.call.id"] == "call-1"
    assert run.status.status_code is StatusCode.UNSET


def test_the_bench_table_reports_the_cost_of_tracing() -> None:
    from dsh_agent_loop.cli._bench import DEFAULT_TARGETS, _loop_rows

    result = {
        "w1_us_per_step": 40.0,
        "w1_ref_us_per_step": 10.0,
        "w1_growth_100_vs_10": 1.0,
        "w2_us_per_step": 90.0,
        "w2_ref_us_per_step": 20.0,
        "w3": [],
    }
    assert "w1_traced" not in {row.key for row in _loop_rows(result, DEFAULT_TARGETS)}
    traced = {**result, "w1_traced_us_per_step": 70.0, "w1_traced_baseline_us_per_step": 35.0}
    rows = {row.key: row for row in _loop_rows(traced, DEFAULT_TARGETS)}
    row = rows["w1_traced"]
    assert row.workload == "W1 µs/step with tracing"
    assert row.ratio == 2.0
    assert row.target is None


@pytest.mark.parametrize(
    ("kind", "name", "model", "response_id"),
    [
        ("openai", "openai_text", "gpt-4o-2024-08-06", "chatcmpl-B7xQ2mKp9"),
        (
            "anthropic",
            "anthropic_text",
            "claude-3-5-haiku-20241022",
            "msg_01XFDUDYJgAACzvnptvVoYEL",
        ),
    ],
)
async def test_the_response_model_and_id_are_stored_and_traced(
    monkeypatch: pytest.MonkeyPatch, kind: str, name: str, model: str, response_id: str
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test")
    monkeypatch.setenv(CLAUDE_KEY_ENV, "sk-ant-test")
    provider, exporter = _provider()
    reply = HttpReply.sse(transcript(name), piece=64)
    async with live_agent(kind, default=reply, tracer_provider=provider) as live:
        await live.run("hi")
        (message,) = live.of_type("assistant/message")
        assert plain(message.data["response"]) == {"model": model, "id": response_id}

    (chat,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    assert chat.name == f"chat {MODELS[kind]}"
    assert chat.attributes is not None
    assert chat.attributes["gen_ai.request.model"] == MODELS[kind]
    assert chat.attributes["gen_ai.response.model"] == model
    assert chat.attributes["gen_ai.response.id"] == response_id


async def test_a_scripted_reply_stores_no_response(autojump_clock: trio.abc.Clock) -> None:
    provider, exporter = _provider()
    model = ScriptedModel([Reply.text("hi")])
    async with open_runtime(providers={"scripted": model}, tracer_provider=provider) as rt:
        agent = (await rt.agents.create(options=OPTIONS)).agent
        agent.followup("hello")
        await agent.wait_idle()
        (message,) = [e for e in agent.session.events if e.type == "assistant/message"]
        assert set(message.data) == {"turn", "step", "message", "stream", "usage"}
    (chat,) = _by_name(exporter.get_finished_spans())["chat m"]
    assert chat.attributes is not None
    assert not {
        k for k in chat.attributes if k.startswith("gen_ai.response.") and "finish" not in k
    }


@pytest.mark.parametrize(
    ("otel", "enabled", "capture"),
    [
        (True, True, False),
        (False, False, False),
        ({"captureContent": True}, True, True),
        ({"capture_content": True}, True, True),
        ({}, True, False),
    ],
)
def test_the_config_otel_key(otel: object, enabled: bool, capture: bool) -> None:
    from dsh_agent_loop.config import load_config

    plugin = {"name": "@deepseek-ai/dsh-agent-loop", "config": {"otel": otel}}
    config = load_config({"plugins": [plugin]}).plugin.otel
    assert config is not None
    assert (config.enabled, config.capture_content) == (enabled, capture)


def test_tracing_is_off_without_the_config_otel_key() -> None:
    from dsh_agent_loop import ConfigError
    from dsh_agent_loop.config import load_config

    plugin: dict[str, object] = {"name": "@deepseek-ai/dsh-agent-loop", "config": {}}
    assert load_config({"plugins": [plugin]}).plugin.otel is None
    plugin["config"] = {"otel": {"captureContnt": True}}
    with pytest.raises(ConfigError, match=r"otel\.captureContnt: unknown key"):
        load_config({"plugins": [plugin]})


SECRET = "sk-live-SECRET-4f1d9a"
TOOL_OUTPUT = "TOOL-OUTPUT-MARKER-77c2"
PROVIDER_BODY = "PROVIDER-BODY-MARKER-0b5e"
FATAL_BODY = "FATAL-BODY-MARKER-a913"
ABORT_NOTE = "ABORT-NOTE-MARKER-51aa"
MARKERS = (SECRET, TOOL_OUTPUT, PROVIDER_BODY, FATAL_BODY, ABORT_NOTE)


@tool
async def leaky() -> str:
    """Fail with a message that embeds a secret."""
    raise RuntimeError(f"connect failed: password={SECRET}")


@tool
async def echo() -> str:
    """Answer with output that must not reach a span."""
    return TOOL_OUTPUT


async def _run_hostile_turns(provider: TracerProvider, *, capture_content: bool) -> None:
    """A retried provider failure, a failing and a plain tool, a failed turn, a cancelled turn."""
    model = ScriptedModel(
        [
            Reply.error("HTTP_5XX", f"upstream said: {PROVIDER_BODY}"),  # retried
            Reply.tool_calls(("leaky", {}), ("echo", {})),
            Reply.text("done"),
            Reply.error("HTTP_4XX", f"400 Bad Request: {FATAL_BODY}", status=400),
            Reply.hang(),
        ]
    )
    async with open_runtime(
        providers={"scripted": model},
        tools=[leaky, echo],
        tracer_provider=provider,
        otel_capture_content=capture_content,
    ) as rt:
        agent = (await rt.agents.create(options=OPTIONS)).agent
        for text in ("one", "two"):
            agent.followup(text)
            await agent.wait_idle()
        agent.followup("three")
        await trio.sleep(1)
        agent.cancel(message=f"stopped: {ABORT_NOTE}")
        await agent.wait_idle()


def _exported_text(span: ReadableSpan) -> str:
    """Everything a span exports that could carry text: attributes, events, status."""
    parts = [repr(dict(span.attributes or {})), str(span.status.description)]
    for event in span.events:
        parts.append(event.name)
        parts.append(repr(dict(event.attributes or {})))
    return "\n".join(parts)


async def test_only_captured_content_reaches_spans_without_it_codes_do(
    autojump_clock: trio.abc.Clock,
) -> None:
    provider, exporter = _provider()
    await _run_hostile_turns(provider, capture_content=False)

    finished = exporter.get_finished_spans()
    for span in finished:
        text = _exported_text(span)
        assert not [m for m in MARKERS if m in text], (span.name, text)
    spans = _by_name(finished)
    failed_tool, plain_tool = spans["execute_tool leaky"][0], spans["execute_tool echo"][0]
    assert failed_tool.status.status_code is StatusCode.ERROR
    assert failed_tool.status.description == "TOOL_ERROR"
    assert (failed_tool.attributes or {})["error.type"] == "TOOL_ERROR"
    assert (failed_tool.attributes or {})["gen_ai.tool.name"] == "leaky"
    assert plain_tool.status.status_code is StatusCode.UNSET
    chats = spans["chat m"]
    assert [c.status.description for c in chats if c.status.description] == [
        "HTTP_5XX",
        "HTTP_4XX",
        "ABORTED",
    ]
    ok, failed, cancelled = spans["invoke_agent main"]
    assert ok.status.status_code is StatusCode.UNSET
    assert (failed.attributes or {})["error.type"] == "HTTP_4XX"
    assert failed.status.description == "HTTP_4XX"
    assert cancelled.status.description == "ABORTED: cancelled (user)"

    # with content capture on, the same turns carry the messages, as the option promises
    provider, exporter = _provider()
    await _run_hostile_turns(provider, capture_content=True)

    spans = _by_name(exporter.get_finished_spans())
    (failed_tool,) = spans["execute_tool leaky"]
    assert SECRET in str(failed_tool.status.description)
    (plain_tool,) = spans["execute_tool echo"]
    assert (plain_tool.attributes or {})["gen_ai.tool.call.result"] == TOOL_OUTPUT
    descriptions = [str(c.status.description) for c in spans["chat m"]]
    assert any(PROVIDER_BODY in d for d in descriptions)
    _, failed, cancelled = spans["invoke_agent main"]
    assert FATAL_BODY in str(failed.status.description)
    assert cancelled.status.description == f"ABORTED: stopped: {ABORT_NOTE}"
