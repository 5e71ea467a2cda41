"""The fault corpus at the agent level: every way a provider call goes wrong, through a whole turn.

Each case serves one or more faulty responses from the loopback server (real sockets, real HTTP
framing) to a running agent, then a good response. Whatever the fault, the turn is either closed
by a coded error (``turn/end {kind: error, error: {code}}``) or recovered by a retry (one
``assistant/message``, an ``assistant/attempt`` per failure), what the failed stream delivered is
kept in the attempt and never reaches the model, an incomplete tool call is never stored, the next
turn runs, and ``invariants.check`` finds nothing.

Transient failures are retried at once by an ``agent/request-error`` listener (real HTTP runs in
real time); the default policy's own retries are checked separately with ``Retry-After: 0``.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
import trio

from dsh_agent_loop import tool
from dsh_agent_loop.llm._base import ReasoningDelta, TextDelta
from dsh_agent_loop.llm._stream_limits import StreamLimits

from .agent_helpers import (
    CLAUDE_KEY_ENV,
    DONE,
    KEY_ENV,
    an,
    an_end,
    an_start,
    an_text,
    an_text_block,
    assert_well_formed,
    call_ids,
    fast_transient_retry,
    make_adapter,
    oai,
    oai_call,
    oai_text,
    oai_usage,
    of_type,
    plain,
    sse_events,
    turn_ends,
    types,
)
from .agent_helpers import live_agent as live
from .server import Reply, refused_url, transcript


@pytest.fixture(autouse=True)
def _keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-agent-test")
    monkeypatch.setenv(CLAUDE_KEY_ENV, "sk-ant-agent-test")


@tool
async def write_file(path: str, text: str) -> str:
    """Write a file."""
    return f"wrote {len(text)} characters to {path}"


@tool
async def write(text: str) -> str:
    """Write text."""
    return f"wrote {len(text)} characters"


TOOLS = [write_file, write]

# --- responses ------------------------------------------------------------------------------

HI = oai({"role": "assistant", "content": "Hi"})
THERE = oai({"content": " there"})
STOP = oai({}, "stop")
GOOD = oai_text("Hi", " there")
GOOD_OPENAI = oai_text("All", " good.")
GOOD_CLAUDE = an_text("All", " good.")
GOOD_CONTENT = [{"type": "text", "text": "All good."}]
GOOD_USAGE = {
    "openai": {"input_tokens": 10, "output_tokens": 2},
    "anthropic": {"input_tokens": 9, "output_tokens": 3},
}

DEEPSEEK = sse_events(transcript("deepseek_reasoner_tools"))
DS_REASONING = "The user wants the weather in Oslo. I should call the tool."
THINKING = sse_events(transcript("anthropic_thinking_tools"))

CLAUDE_HI = [an_start(), *an_text_block(0, "Hi")]


def claude_tool(index: int, call_id: str, *parts: Any, stop: bool = True) -> list[bytes]:
    """A ``write_file`` tool_use block streamed as ``parts`` (JSON text, or bad values)."""
    block = {"type": "tool_use", "id": call_id, "name": "write_file", "input": {}}
    out = [an("content_block_start", index=index, content_block=block)]
    out += [
        an(
            "content_block_delta",
            index=index,
            delta={"type": "input_json_delta", "partial_json": p},
        )
        for p in parts
    ]
    if stop:
        out.append(an("content_block_stop", index=index))
    return out


def bad_tool_use() -> bytes:
    """A tool_use block start whose input is a list, not an object."""
    block = {"type": "tool_use", "id": "toolu_bad", "name": "write_file", "input": ["x"]}
    return an("content_block_start", index=1, content_block=block)


def oai_finish(reason: Any) -> bytes:
    """A finish frame with any ``finish_reason`` value."""
    body = {"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def error_reply(status: int, body: Any, *headers: tuple[str, str]) -> Reply:
    return Reply.error(status, body, headers=headers)


OPENAI_ERROR = {"error": {"message": "internal", "type": "server_error"}}
COMPLETE_ARGS = '{"path": "a.txt", "text": "hi"}'

# --- the corpus -----------------------------------------------------------------------------


@attrs.frozen
class Case:
    """One fault, served to the first turn; then the good response is the default."""

    replies: tuple[Reply, ...]
    outcome: str
    """``error`` | ``recovered`` (failed attempts, then the good response) | ``completed`` |
    ``max-tokens`` | ``truncated`` (a call cut by the output cap)."""
    code: str | None = None
    """The failure code of every failed attempt."""
    kind: str = "openai"
    text: str = ""
    """What the (first) failed attempt delivered: its ``stream.text``."""
    reasoning: str = ""
    says: str = ""
    """Part of the failure message."""
    status: int | None = None
    dropped: tuple[str, ...] = ()
    """Call ids that started streaming but never completed: never stored, never sent back."""
    aborted: tuple[str, ...] = ()
    """Complete calls settled ``ABORTED_BEFORE_DISPATCH`` (cut-by-cap cases)."""
    content: Any = None
    """The stored content of the first ``assistant/message`` when the stream did not fail."""
    tools_ran: int = 0
    """Calls of the first message that ran (then a second step answers)."""
    timeout: tuple[float, float] | None = None
    limits: StreamLimits | None = None
    """The adapter's ``stream_limits`` (None: the defaults)."""
    refused_until: int = 0
    """The agent starts on a route whose port refuses connections; ``agent/request`` moves it to
    the live route from this attempt on (0: no dead route; the next turn is always live)."""

    @property
    def attempts(self) -> int:
        """How many attempts fail in the first turn."""
        if self.outcome not in ("error", "recovered"):
            return 0
        if self.refused_until:  # every attempt on the dead route fails; the cap is 5
            return (self.refused_until - 1) if self.outcome == "recovered" else 5
        return len(self.replies)  # one failed attempt per faulty response


def err(*replies: Reply, code: str, **kwargs: Any) -> Case:
    return Case(tuple(replies), "error", code, **kwargs)


def rec(*replies: Reply, code: str, **kwargs: Any) -> Case:
    return Case(tuple(replies), "recovered", code, **kwargs)


def ok(*replies: Reply, outcome: str = "completed", **kwargs: Any) -> Case:
    return Case(tuple(replies), outcome, **kwargs)


HUGE_ARGS = json.dumps({"text": "x" * 10_000_000})
ROOMY = StreamLimits(max_line_bytes=16 << 20, max_event_bytes=16 << 20, max_output_chars=20 << 20)
"""Stream limits above the 10 MB frame (the defaults refuse it)."""
KEEPALIVE = b": keep-alive\n\n"

CASES: dict[str, Case] = {
    # --- framing and stream faults (openai) ---
    "event truncated mid-way, connection closed": rec(
        Reply(pieces=[HI, THERE[:20]], cut_after=2), code="STREAM_CUT", text="Hi"
    ),
    "event truncated mid-way, body ended": rec(
        Reply(pieces=[HI, THERE[:20]]), code="STREAM_CUT", text="Hi", says="mid-event"
    ),
    "connection closed between events": rec(
        Reply(pieces=[HI], cut_after=1), code="STREAM_CUT", text="Hi"
    ),
    "two JSON objects in one event": err(
        Reply(pieces=[HI, b'data: {"choices": []}\ndata: {"choices": []}\n\n', STOP, DONE]),
        code="BAD_STREAM",
        text="Hi",
        says="malformed frame",
    ),
    "not JSON at all": err(Reply(pieces=[b"data: <html>\n\n"]), code="BAD_STREAM"),
    "error frame after text": err(
        Reply(pieces=[HI, b'data: {"error": {"message": "boom", "type": "server_error"}}\n\n']),
        code="PROVIDER_ERROR",
        text="Hi",
        says="boom",
    ),
    "error frame after a tool call started": err(
        Reply(
            pieces=[
                oai_call(0, "call_err", "write_file", '{"path": "a.t'),
                b'data: {"error": {"message": "boom", "type": "server_error"}}\n\n',
            ]
        ),
        code="PROVIDER_ERROR",
        dropped=("call_err",),
    ),
    "overloaded error frame": rec(
        Reply(pieces=[b'data: {"error": {"message": "busy", "type": "overloaded_error"}}\n\n']),
        code="HTTP_5XX",
        says="busy",
    ),
    "connection reset mid-stream": rec(
        Reply(pieces=[HI, THERE], reset_after=1), code="STREAM_CUT", text="Hi"
    ),
    "connection reset before the response": rec(Reply(reset_before_head=True), code="CONNECTION"),
    "connection cut inside tool arguments": rec(
        Reply(pieces=[HI, oai_call(0, "call_cut", "write_file", '{"path": "a')], cut_after=2),
        code="STREAM_CUT",
        text="Hi",
        dropped=("call_cut",),
    ),
    "invalid UTF-8 inside a string": ok(
        Reply(pieces=[b'data: {"choices": [{"delta": {"content": "a\xffb"}}]}\n\n', STOP, DONE]),
        content=[{"type": "text", "text": "a\ufffdb"}],
    ),
    "invalid UTF-8 in the JSON structure": err(
        Reply(pieces=[HI, b"data: {\xff}\n\n"]), code="BAD_STREAM", text="Hi"
    ),
    "unknown event types are ignored": ok(
        Reply(
            pieces=[
                b"event: progress\ndata: {not json\n\n",
                *GOOD[:3],
                b"event: x\ndata: 1\n\n",
                *GOOD[3:],
            ]
        ),
        content=[{"type": "text", "text": "Hi there"}],
    ),
    "empty stream": rec(Reply(pieces=[]), code="STREAM_CUT", says="without a finish"),
    "missing [DONE]": ok(Reply(pieces=GOOD[:4]), content=[{"type": "text", "text": "Hi there"}]),
    "[DONE] without a finish": ok(
        Reply(pieces=[HI, THERE, oai_usage(), DONE]),
        content=[{"type": "text", "text": "Hi there"}],
    ),
    "[DONE] without a finish after a tool call": ok(
        Reply(pieces=[oai_call(0, "call_done", "write", '{"text": "hi"}'), DONE]),
        content=[
            {
                "type": "tool-call",
                "call_id": "call_done",
                "name": "write",
                "arguments": '{"text": "hi"}',
            }
        ],
        tools_ran=1,
    ),
    "[DONE] before any content": rec(Reply(pieces=[DONE]), code="STREAM_CUT"),
    "keep-alive flood": ok(
        Reply.sse(
            b"".join([HI, b": keep-alive\n\n" * 10_000, THERE, b":\r\n\r\n" * 5_000, *GOOD[2:]]),
            piece=997,
        ),
        content=[{"type": "text", "text": "Hi there"}],
    ),
    "keep-alives in tiny pieces": ok(
        Reply.sse(b"".join([HI, b": ping\n\n" * 300, *GOOD[1:]]), piece=3),
        content=[{"type": "text", "text": "Hi there"}],
    ),
    "DeepSeek insufficient_system_resource": rec(
        Reply(pieces=[HI, oai({}, "insufficient_system_resource"), DONE]),
        code="HTTP_5XX",
        text="Hi",
        says="insufficient_system_resource",
    ),
    "DeepSeek cut inside the reasoning": rec(
        Reply(pieces=DEEPSEEK[:8], cut_after=8),
        code="STREAM_CUT",
        reasoning="The user wants the weather in Oslo",
    ),
    "DeepSeek reset after reasoning and some text": rec(
        Reply(pieces=DEEPSEEK[:18], reset_after=18),
        code="STREAM_CUT",
        reasoning=DS_REASONING,
        text="Let me check",
    ),
    "DeepSeek cut inside the tool arguments": rec(
        Reply(pieces=DEEPSEEK[:22], cut_after=22),
        code="STREAM_CUT",
        reasoning=DS_REASONING,
        text="Let me check Oslo.",
        dropped=("call_00_kT3xQw9Lm",),
    ),
    "refusal text is the answer": ok(
        Reply(pieces=[oai({"refusal": "I can't"}), oai({"refusal": " help."}), STOP, DONE]),
        content=[{"type": "text", "text": "I can't help."}],
    ),
    "content as a list of typed parts": ok(
        Reply(
            pieces=[
                oai({"content": [{"type": "text", "text": "Hi"}, {"type": "image_url"}]}),
                oai({"content": [{"type": "text", "text": " there"}]}),
                STOP,
                oai_usage(),
                DONE,
            ]
        ),
        content=[{"type": "text", "text": "Hi there"}],
    ),
    # --- deltas that cannot be read: the attempt fails in the adapter, never the turn machine ---
    "delta content is a number": err(
        Reply(pieces=[HI, oai({"content": 5}), STOP, DONE]),
        code="BAD_STREAM",
        text="Hi",
        says="malformed frame",
    ),
    "a content part is malformed": err(
        Reply(pieces=[HI, oai({"content": [{"type": "text", "text": None}]}), STOP, DONE]),
        code="BAD_STREAM",
        text="Hi",
    ),
    "reasoning is not a string": err(
        Reply(pieces=[oai({"reasoning_content": {"text": "x"}}), STOP, DONE]), code="BAD_STREAM"
    ),
    "tool call name is a number": err(
        Reply(
            pieces=[
                HI,
                oai({"tool_calls": [{"index": 0, "id": "c", "function": {"name": 7}}]}),
                oai({}, "tool_calls"),
                DONE,
            ]
        ),
        code="BAD_STREAM",
        text="Hi",
    ),
    "tool call arguments are a list": err(
        Reply(
            pieces=[
                oai_call(0, "call_list", "write", ""),
                oai({"tool_calls": [{"index": 0, "function": {"arguments": ["x"]}}]}),
                oai({}, "tool_calls"),
                DONE,
            ]
        ),
        code="BAD_STREAM",
        dropped=("call_list",),
    ),
    "usage count is a string": err(
        Reply(pieces=[HI, STOP, oai({}, usage={"prompt_tokens": "10"}), DONE]),
        code="BAD_STREAM",
        text="Hi",
    ),
    "finish_reason is a number": err(
        Reply(pieces=[HI, oai_finish(7), DONE]), code="BAD_STREAM", text="Hi"
    ),
    # --- the output cap ---
    "max tokens inside tool arguments": ok(
        Reply.sse(transcript("openai_length_tool"), piece=200),
        outcome="truncated",
        content=[
            {
                "type": "tool-call",
                "call_id": "call_Aa1",
                "name": "write_file",
                "arguments": '{"path":"a.txt","text":"hi"}',
            }
        ],
        aborted=("call_Aa1",),
        dropped=("call_Bb2",),
    ),
    "max tokens after complete tool calls": ok(
        Reply(
            pieces=[oai_call(0, "call_ok", "write_file", COMPLETE_ARGS), oai({}, "length"), DONE]
        ),
        outcome="max-tokens",
        content=[
            {
                "type": "tool-call",
                "call_id": "call_ok",
                "name": "write_file",
                "arguments": COMPLETE_ARGS,
            }
        ],
        tools_ran=1,
    ),
    "max tokens inside text": ok(
        Reply(pieces=[HI, oai({}, "length"), oai_usage(), DONE]),
        outcome="max-tokens",
        content=[{"type": "text", "text": "Hi"}],
    ),
    # --- HTTP statuses ---
    "429 with Retry-After": rec(
        error_reply(429, {"error": {"message": "Rate limit reached"}}, ("retry-after", "7")),
        code="HTTP_429",
        status=429,
        says="Rate limit reached",
    ),
    "500": rec(error_reply(500, OPENAI_ERROR), code="HTTP_5XX", status=500, says="internal"),
    "502 with an HTML body": rec(
        error_reply(502, "<html>Bad Gateway</html>"), code="HTTP_5XX", status=502
    ),
    "503 three times, then success": rec(
        *[error_reply(503, {"error": {"message": "down"}})] * 3, code="HTTP_5XX", status=503
    ),
    "500 on all five attempts": err(
        *[error_reply(500, OPENAI_ERROR)] * 5, code="HTTP_5XX", status=500
    ),
    "401": err(
        error_reply(401, {"error": {"message": "Incorrect API key"}}),
        code="AUTH",
        status=401,
        says=KEY_ENV,
    ),
    "403": err(
        error_reply(403, {"error": {"message": "forbidden"}}), code="AUTH", status=403, says=KEY_ENV
    ),
    "404": err(
        error_reply(404, {"error": {"message": "model not found"}}),
        code="HTTP_4XX",
        status=404,
        says="model not found",
    ),
    "400 context overflow, with the provider's message": err(
        error_reply(400, {"error": {"message": "maximum context length is 128000 tokens"}}),
        code="CONTEXT_OVERFLOW",
        status=400,
        says="maximum context length is 128000 tokens",
    ),
    "non-SSE 200": err(
        error_reply(200, {"choices": [{"message": {"content": "hi"}}]}),
        code="BAD_STREAM",
        status=200,
        says="application/json",
    ),
    "200 without a content type": err(Reply(pieces=GOOD, headers=()), code="BAD_STREAM"),
    "redirect": err(
        Reply(status=307, headers=(("location", "/elsewhere"),)), code="PROVIDER_ERROR", status=307
    ),
    # --- size, time and transport ---
    "10 MB arguments": ok(
        Reply.sse(
            b"".join(
                [oai_call(0, "big", "write", HUGE_ARGS), oai({}, "tool_calls"), oai_usage(), DONE]
            ),
            piece=65_536,
        ),
        content=[{"type": "tool-call", "call_id": "big", "name": "write", "arguments": HUGE_ARGS}],
        tools_ran=1,
        limits=ROOMY,
    ),
    "10 MB arguments past the default line cap": err(
        Reply.sse(
            b"".join(
                [oai_call(0, "big", "write", HUGE_ARGS), oai({}, "tool_calls"), oai_usage(), DONE]
            ),
            piece=65_536,
        ),
        code="BAD_STREAM",
        says="max_line_bytes (4194304)",
    ),
    "output past max_output_chars": err(
        Reply(pieces=[oai({"content": "x" * 600}) for _ in range(4)] + [STOP, DONE]),
        code="BAD_STREAM",
        says="max_output_chars (2000)",
        text="x" * 1800,
        limits=StreamLimits(max_output_chars=2000),
    ),
    "keep-alives only, then the idle limit": rec(
        Reply(pieces=[HI] + [KEEPALIVE] * 200, piece_delay=0.05),
        code="TIMEOUT",
        text="Hi",
        says="idle timeout (0.5 s)",
        limits=StreamLimits(idle_timeout=0.5),
    ),
    "read timeout mid-stream": rec(
        Reply(pieces=GOOD, hang_after=1), code="TIMEOUT", text="Hi", timeout=(2.0, 0.5)
    ),
    "read timeout before the response": rec(
        Reply(pieces=GOOD, delay=1.0), code="TIMEOUT", timeout=(2.0, 0.5)
    ),
    "connect refused, retried on a live route": rec(code="CONNECTION", refused_until=3),
    "connect refused on every attempt": err(code="CONNECTION", refused_until=99),
    # --- Anthropic ---
    "anthropic: error event after a tool_use started": rec(
        Reply.sse(transcript("anthropic_overloaded"), piece=50),
        code="HTTP_5XX",
        kind="anthropic",
        says="Overloaded",
        dropped=("toolu_01Ov",),
    ),
    "anthropic: api_error event after text": err(
        Reply(pieces=[*CLAUDE_HI, an("error", error={"type": "api_error", "message": "Internal"})]),
        code="PROVIDER_ERROR",
        kind="anthropic",
        text="Hi",
        says="Internal",
    ),
    "anthropic: unknown events, blocks and deltas are ignored": ok(
        Reply(
            pieces=[
                an_start(),
                an(
                    "content_block_start",
                    index=0,
                    content_block={
                        "type": "server_tool_use",
                        "id": "s",
                        "name": "web",
                        "input": {},
                    },
                ),
                an("content_block_stop", index=0),
                an("brand_new_event", detail=1),
                *an_text_block(1, "Hi"),
                an("content_block_delta", index=1, delta={"type": "citations_delta", "c": {}}),
                an("content_block_stop", index=1),
                *an_end(),
            ]
        ),
        kind="anthropic",
        content=[{"type": "text", "text": "Hi"}],
    ),
    "anthropic: message_stop without a stop reason": rec(
        Reply(pieces=[*CLAUDE_HI, an("message_stop")]),
        code="STREAM_CUT",
        kind="anthropic",
        text="Hi",
    ),
    "anthropic: cut inside a tool_use": rec(
        Reply(pieces=[*CLAUDE_HI, *claude_tool(1, "toolu_cut", '{"pa', stop=False)], cut_after=5),
        code="STREAM_CUT",
        kind="anthropic",
        text="Hi",
        dropped=("toolu_cut",),
    ),
    "anthropic: thinking cut by a reset": rec(
        Reply(pieces=THINKING[:5], reset_after=5),
        code="STREAM_CUT",
        kind="anthropic",
        reasoning="I need the weather for both cities,",
    ),
    "anthropic: cut between two tool_use blocks": rec(
        Reply(pieces=THINKING[:20], cut_after=20),
        code="STREAM_CUT",
        kind="anthropic",
        reasoning="I need the weather for both cities, so two tool calls.",
        text="Checking both cities.",
        dropped=("toolu_01T1x1fJ34qAmk2tNTrN7Up6", "toolu_01Vb8pQ2rL9wXyZaBcDeFgHi"),
    ),
    "anthropic: max_tokens inside a tool_use": ok(
        Reply.sse(transcript("anthropic_redacted_max_tokens"), piece=17),
        kind="anthropic",
        outcome="truncated",
        content=[
            {
                "type": "reasoning",
                "text": "",
                "metadata": {
                    "redacted": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"
                },
            }
        ],
        dropped=("toolu_01Zz",),
    ),
    "anthropic: max_tokens after a complete tool_use": ok(
        Reply(
            pieces=[
                an_start(),
                *claude_tool(0, "toolu_ok", COMPLETE_ARGS),
                *claude_tool(1, "toolu_cut", '{"path": "b.txt", "text": "lo'),
                *an_end("max_tokens", 64),
            ]
        ),
        kind="anthropic",
        outcome="truncated",
        content=[
            {
                "type": "tool-call",
                "call_id": "toolu_ok",
                "name": "write_file",
                "arguments": COMPLETE_ARGS,
            }
        ],
        aborted=("toolu_ok",),
        dropped=("toolu_cut",),
    ),
    "anthropic: text delta is a number": err(
        Reply(
            pieces=[
                *CLAUDE_HI,
                an("content_block_delta", index=0, delta={"type": "text_delta", "text": 5}),
                *an_end(),
            ]
        ),
        code="BAD_STREAM",
        kind="anthropic",
        text="Hi",
    ),
    "anthropic: tool_use input is a list": err(
        Reply(pieces=[*CLAUDE_HI, bad_tool_use(), *an_end()]),
        code="BAD_STREAM",
        kind="anthropic",
        text="Hi",
    ),
    "anthropic: partial_json is an object": err(
        Reply(pieces=[*CLAUDE_HI, *claude_tool(1, "toolu_obj", {"path": "a"}), *an_end()]),
        code="BAD_STREAM",
        kind="anthropic",
        text="Hi",
        dropped=("toolu_obj",),
    ),
    "anthropic: 529 overloaded": rec(
        error_reply(
            529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        ),
        code="HTTP_5XX",
        kind="anthropic",
        status=529,
        says="Overloaded",
    ),
    "anthropic: 401 names the key's env var": err(
        error_reply(
            401,
            {"type": "error", "error": {"type": "authentication_error", "message": "invalid key"}},
        ),
        code="AUTH",
        kind="anthropic",
        status=401,
        says=CLAUDE_KEY_ENV,
    ),
}


def test_corpus_size() -> None:
    assert len(CASES) >= 30


# --- running a case -------------------------------------------------------------------------

STRUCTURE = {
    "step/start",
    "step/end",
    "assistant/attempt",
    "assistant/message",
    "tool/call",
    "tool/result",
    "turn/end",
}


def structure(events: Any) -> list[str]:
    return [t for t in types(events) if t in STRUCTURE]


def expected_structure(case: Case) -> list[str]:
    failed = ["assistant/attempt"] * case.attempts
    if case.outcome == "error":
        return ["step/start", *failed, "step/end", "turn/end"]
    if case.outcome == "recovered":
        return ["step/start", *failed, "assistant/message", "step/end", "turn/end"]
    if case.outcome == "truncated":
        settled = ["tool/call", "tool/result"] * len(case.aborted)
        return ["step/start", "assistant/message", *settled, "step/end", "turn/end"]
    ran = ["tool/call", "tool/result"] * case.tools_ran
    second = ["step/start", "assistant/message", "step/end"] if case.tools_ran else []
    return ["step/start", "assistant/message", *ran, "step/end", *second, "turn/end"]


def reroute(case: Case) -> Any:
    """``agent/request`` listener: leave the dead route from attempt ``refused_until`` on."""

    async def listener(payload: Any, next: Any) -> Any:
        if payload["attempt"] >= case.refused_until or payload["turn"] >= 2:
            payload = {**payload, "config": {**payload["config"], "provider": "live"}}
        return await next(payload)

    return listener


@pytest.mark.parametrize("name", list(CASES))
async def test_fault_through_a_whole_turn(name: str) -> None:
    case = CASES[name]
    good = GOOD_OPENAI if case.kind == "openai" else GOOD_CLAUDE
    adapter_kwargs: dict[str, Any] = {} if case.timeout is None else {"timeout": case.timeout}
    if case.limits is not None:
        adapter_kwargs["stream_limits"] = case.limits
    extra: dict[str, Any] = {}
    if case.refused_until:
        extra["dead"] = make_adapter(case.kind, refused_url())
    async with live(
        case.kind,
        default=Reply(pieces=good),
        tools=TOOLS,
        adapter_kwargs=adapter_kwargs,
        extra_providers=extra,
        provider="dead" if case.refused_until else "live",
    ) as h:
        h.server.push(*case.replies)
        frames: list[Any] = []
        h.rt.hooks.on("agent/assistant-stream", lambda event: frames.append(event.data))
        errors: list[Any] = []
        h.rt.hooks.on("agent/error", lambda event: errors.append(plain(event.data)))
        h.rt.hooks.waterfall("agent/request-error", fast_transient_retry)
        if case.refused_until:
            h.rt.hooks.waterfall("agent/request", reroute(case))
        await h.run("go")
        assert h.server.queue == []  # every faulty response was served
        turn1 = h.turn(1)
        assert structure(turn1) == expected_structure(case)
        (end,) = turn_ends(turn1)

        # failed attempts: coded, and keeping exactly what was delivered
        attempts = of_type(turn1, "assistant/attempt")
        for n, attempt in enumerate(attempts, 1):
            failure = attempt.data["failure"]
            assert failure["code"] == case.code, plain(failure)
            assert attempt.data["stream"]["attempt"] == n
            if case.status is not None:
                assert failure["status"] == case.status
            assert case.says in failure["message"]
        if attempts:
            stream = attempts[0].data["stream"]
            assert stream.get("text", "") == case.text
            assert stream.get("reasoning", "") == case.reasoning

        # a turn that ends error says so once on agent/error, with the same error (docs/events.md)
        if end["kind"] == "error":
            assert errors == [{"agent_id": "main", "turn": 1, "step": 1, "error": end["error"]}]
        else:
            assert errors == []

        messages = of_type(turn1, "assistant/message")
        if case.outcome == "error":
            assert end["kind"] == "error"
            assert end["error"]["code"] == case.code
            assert case.says in end["error"]["message"]
        elif case.outcome == "recovered":
            assert end == {"kind": "completed"}
            (answer,) = messages
            assert answer.data["stream"]["attempt"] == case.attempts + 1
            assert plain(answer.data["message"]["content"]) == GOOD_CONTENT
            assert plain(answer.data["usage"]) == GOOD_USAGE[case.kind]
            # the failed attempts' deliveries never reached the model: the retry asked the same
            bodies = h.bodies()
            assert bodies[-1] == bodies[0]
        elif case.outcome == "truncated":
            assert end["kind"] == "error"
            assert end["error"]["code"] == "TRUNCATED_TOOL_CALL"
            results = of_type(turn1, "tool/result")
            assert [r.data["message"]["call_id"] for r in results] == list(case.aborted)
            for result in results:
                assert plain(result.data["error"]) == {
                    "name": "AbortedBeforeDispatch",
                    "code": "ABORTED_BEFORE_DISPATCH",
                }
        else:
            assert end == {"kind": case.outcome}
        if case.content is not None:
            assert plain(messages[0].data["message"]["content"]) == case.content
            assert messages[0].data["stream"]["attempt"] == 1

        # stream frames: each attempt opened one stream, abandoned unless it was committed
        step1 = [f for f in frames if (f["turn"], f["step"]) == (1, 1)]
        expected_frames: list[Any] = []
        for n in range(1, case.attempts + 1):
            expected_frames += [(n, "start", None), (n, "end", "abandoned")]
        if messages and messages[0].data["step"] == 1:
            n = case.attempts + 1
            expected_frames += [(n, "start", None), (n, "end", "committed")]
            assert step1[-1]["seq"] == messages[0].seq
        assert [
            (f["attempt"], f["frame"], f.get("outcome")) for f in step1 if f["frame"] != "chunk"
        ] == expected_frames
        if attempts:  # what the user saw streaming is what the attempt kept
            shown = [f["chunk"] for f in step1 if f["frame"] == "chunk" and f["attempt"] == 1]
            assert "".join(c.text for c in shown if isinstance(c, TextDelta)) == case.text
            assert "".join(c.text for c in shown if isinstance(c, ReasoningDelta)) == case.reasoning

        # an incomplete tool call is never stored, never sent back
        stored = call_ids(h.events)
        for call_id in case.dropped:
            assert call_id not in stored
            assert all(call_id not in r.body.decode("utf-8", "replace") for r in h.server.requests)

        # the next turn runs
        h.server.default = Reply(pieces=good)
        await h.run("next")
        turn2 = h.turn(2)
        assert structure(turn2) == ["step/start", "assistant/message", "step/end", "turn/end"]
        (answer,) = of_type(turn2, "assistant/message")
        assert plain(answer.data["message"]["content"]) == GOOD_CONTENT
        assert turn_ends(turn2) == [{"kind": "completed"}]
        assert_well_formed(h.events)


# --- the default policy retries without a listener ------------------------------------------


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        (error_reply(429, {"error": {"message": "slow"}}, ("retry-after", "0")), "HTTP_429"),
        (error_reply(503, {"error": {"message": "down"}}, ("retry-after", "0")), "HTTP_5XX"),
        (error_reply(529, {"error": {"message": "busy"}}, ("retry-after-ms", "0")), "HTTP_5XX"),
    ],
)
async def test_default_policy_retries_with_retry_after_zero(reply: Reply, code: str) -> None:
    async with live("openai", default=Reply(pieces=GOOD_OPENAI)) as h:
        h.server.push(reply, reply)
        with trio.fail_after(5):
            await h.run("go")
        assert structure(h.events) == [
            "step/start",
            "assistant/attempt",
            "assistant/attempt",
            "assistant/message",
            "step/end",
            "turn/end",
        ]
        attempts = of_type(h.events, "assistant/attempt")
        assert [a.data["failure"]["code"] for a in attempts] == [code, code]
        assert [a.data["failure"]["retry_after"] for a in attempts] == [0.0, 0.0]
        assert turn_ends(h.events) == [{"kind": "completed"}]
        assert len(h.server.requests) == 3
        assert_well_formed(h.events)


async def test_default_policy_backs_off_before_retrying_a_cut_stream() -> None:
    async with live("openai", default=Reply(pieces=GOOD_OPENAI)) as h:
        h.server.push(Reply(pieces=[HI], cut_after=1))
        started = trio.current_time()
        await h.run("go")
        elapsed = trio.current_time() - started
        (attempt,) = of_type(h.events, "assistant/attempt")
        assert attempt.data["failure"]["code"] == "STREAM_CUT"
        assert plain(attempt.data["stream"]) == {"attempt": 1, "text": "Hi"}
        assert turn_ends(h.events) == [{"kind": "completed"}]
        assert elapsed >= 0.5  # min(8, 0.5 * 2**0) * (1 + 0.25 * u)
        assert_well_formed(h.events)


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        (error_reply(400, {"error": {"message": "bad"}}), "HTTP_4XX"),
        (error_reply(401, {"error": {"message": "who"}}), "AUTH"),
        (Reply(pieces=[b"data: nope\n\n"]), "BAD_STREAM"),
        (Reply(pieces=[HI, b'data: {"error": {"message": "x"}}\n\n']), "PROVIDER_ERROR"),
    ],
)
async def test_default_policy_does_not_retry(reply: Reply, code: str) -> None:
    async with live("openai", default=Reply(pieces=GOOD_OPENAI)) as h:
        h.server.push(reply)
        await h.run("go")
        assert len(h.server.requests) == 1
        (attempt,) = of_type(h.events, "assistant/attempt")
        assert attempt.data["failure"]["code"] == code
        (end,) = turn_ends(h.events)
        assert end["kind"] == "error"
        assert end["error"]["code"] == code
        assert_well_formed(h.events)
