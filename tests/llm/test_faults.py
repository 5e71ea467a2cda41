"""Fault corpus: every way a provider call can go wrong, normalised to exact chunks and codes.

Most cases run against the loopback server (real sockets, real HTTP framing); error shapes that
need no network (dates, decoding, connect timeouts) use ``httpx.MockTransport``.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

import attrs
import httpx
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh_agent_loop.llm._anthropic import AnthropicAdapter, AnthropicStreamDecoder
from dsh_agent_loop.llm._assemble import Assembler
from dsh_agent_loop.llm._base import (
    BlockEnd,
    BlockStart,
    Chunk,
    Failure,
    Finish,
    ModelRequest,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)
from dsh_agent_loop.llm._http import parse_retry_after
from dsh_agent_loop.llm._openai import OpenAIAdapter, OpenAIStreamDecoder
from dsh_agent_loop.llm._sse import SSEEvent
from dsh_agent_loop.llm._stream_limits import StreamLimits

from .server import (
    USER_HI,
    LoopbackServer,
    Reply,
    assemble,
    closing,
    collect,
    open_loopback_server,
    refused_url,
    transcript,
)

KEY_ENV = "TEST_FAULTS_KEY"
CONFIG = {"provider": "p", "model": "gpt-4o"}
CLAUDE = {"provider": "c", "model": "claude-sonnet-4-20250514"}


@pytest.fixture
async def server() -> AsyncIterator[LoopbackServer]:
    async with open_loopback_server() as srv:
        yield srv


@pytest.fixture(autouse=True)
def _keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")


# --- frames ---------------------------------------------------------------------------------


def frame(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> bytes:
    body: dict[str, Any] = {"id": "c", "object": "chat.completion.chunk", "model": "gpt-4o"}
    body["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
    body.update(extra)
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def usage_frame(prompt: int = 5, completion: int = 2) -> bytes:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    return b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"


HI = frame({"role": "assistant", "content": "Hi"})
CALL_B = {"index": 1, "id": "b", "function": {"name": "now"}}
CALL_A = frame(
    {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": '{"x": 1}'}}]}
)
THERE = frame({"content": " there"})
STOP = frame({}, "stop")
DONE = b"data: [DONE]\n\n"
GOOD = [HI, THERE, STOP, usage_frame(), DONE]
GOOD_CHUNKS: list[Chunk] = [
    BlockStart(0, "text"),
    TextDelta(0, "Hi"),
    TextDelta(0, " there"),
    BlockEnd(0),
    UsageChunk(Usage(5, 2)),
    Finish("stop", stop_reason="stop"),
]
PREFIX: list[Chunk] = [BlockStart(0, "text"), TextDelta(0, "Hi")]


def an(kind: str, **payload: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n".encode()


CLAUDE_START = an(
    "message_start",
    message={
        "id": "m",
        "type": "message",
        "role": "assistant",
        "content": [],
        "usage": {"input_tokens": 9, "output_tokens": 1},
    },
)
CLAUDE_TEXT = [
    CLAUDE_START,
    an("content_block_start", index=0, content_block={"type": "text", "text": ""}),
    an("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hi"}),
]


# --- helpers --------------------------------------------------------------------------------


@attrs.frozen
class Err:
    """An expected error finish: its code, and status / retry_after / message part if given."""

    code: str
    status: int | None = None
    retry_after: float | None = None
    says: str = ""


def check(chunks: list[Chunk], expected: list[Chunk | Err]) -> None:
    """Exact comparison; an ``Err`` matches an error finish by its failure fields."""
    assert len(chunks) == len(expected), chunks
    for got, want in zip(chunks, expected, strict=True):
        if isinstance(want, Err):
            assert isinstance(got, Finish), got
            assert got.reason == "error"
            failure = got.failure
            assert failure is not None
            assert (failure.code, failure.status) == (want.code, want.status), failure
            if want.retry_after is not None:
                assert failure.retry_after == pytest.approx(want.retry_after, abs=1.0)
            assert want.says in failure.message, failure.message
        else:
            assert got == want


def openai(server: LoopbackServer, **kwargs: Any) -> OpenAIAdapter:
    return OpenAIAdapter("p", base_url=server.url, api_key_env=KEY_ENV, **kwargs)


def mock_openai(handler: Callable[[httpx.Request], httpx.Response]) -> OpenAIAdapter:
    return OpenAIAdapter(
        "p",
        base_url="http://mock.invalid/v1",
        api_key_env=KEY_ENV,
        transport=httpx.MockTransport(handler),
    )


async def run_openai(server: LoopbackServer, reply: Reply, **kwargs: Any) -> list[Chunk]:
    server.push(reply)
    async with closing(openai(server, **kwargs)) as adapter:
        return await collect(adapter, CONFIG)


async def run_claude(server: LoopbackServer, reply: Reply) -> list[Chunk]:
    server.push(reply)
    async with closing(AnthropicAdapter("c", base_url=server.url)) as adapter:
        return await collect(adapter, CLAUDE)


# --- stream faults (loopback) ---------------------------------------------------------------

STREAM_CASES: dict[str, tuple[Reply, list[Chunk | Err]]] = {
    "baseline": (Reply(pieces=GOOD), GOOD_CHUNKS),
    "event truncated mid-way, connection closed": (
        Reply(pieces=[HI, THERE[:20]], cut_after=2),
        [*PREFIX, Err("STREAM_CUT")],
    ),
    "event truncated mid-way, body ended": (
        Reply(pieces=[HI, THERE[:20]]),
        [*PREFIX, Err("STREAM_CUT", says="mid-event")],
    ),
    "connection closed between events": (
        Reply(pieces=[HI], cut_after=1),
        [*PREFIX, Err("STREAM_CUT")],
    ),
    "two JSON objects in one event": (
        Reply(pieces=[HI, b'data: {"choices": []}\ndata: {"choices": []}\n\n', STOP, DONE]),
        [*PREFIX, Err("BAD_STREAM", says="malformed frame")],
    ),
    "two JSON objects on one line": (Reply(pieces=[b"data: {}{}\n\n"]), [Err("BAD_STREAM")]),
    "frame is not an object": (
        Reply(pieces=[HI, b"data: [1, 2]\n\n"]),
        [*PREFIX, Err("BAD_STREAM")],
    ),
    "not JSON at all": (Reply(pieces=[b"data: <html>\n\n"]), [Err("BAD_STREAM")]),
    "error frame mid-stream": (
        Reply(pieces=[HI, b'data: {"error": {"message": "boom", "type": "server_error"}}\n\n']),
        [*PREFIX, Err("PROVIDER_ERROR", says="boom")],
    ),
    "overloaded error frame": (
        Reply(pieces=[b'data: {"error": {"message": "busy", "type": "overloaded_error"}}\n\n']),
        [Err("HTTP_5XX", says="busy")],
    ),
    "vLLM error frame": (
        Reply(
            pieces=[
                HI,
                b'data: {"object": "error", "message": "decode failed", "type": "BadRequestError", '
                b'"code": 400}\n\n',
            ]
        ),
        [*PREFIX, Err("PROVIDER_ERROR", says="decode failed")],
    ),
    "SSE error event": (
        Reply(pieces=[HI, b"event: error\ndata: quota gone\n\n"]),
        [*PREFIX, Err("PROVIDER_ERROR")],
    ),
    "connection reset mid-stream": (
        Reply(pieces=[HI, THERE], reset_after=1),
        [*PREFIX, Err("STREAM_CUT")],
    ),
    "connection reset before the response": (Reply(reset_before_head=True), [Err("CONNECTION")]),
    "invalid UTF-8 inside a string": (
        Reply(pieces=[b'data: {"choices": [{"delta": {"content": "a\xffb"}}]}\n\n', STOP, DONE]),
        [
            BlockStart(0, "text"),
            TextDelta(0, "a\ufffdb"),
            BlockEnd(0),
            Finish("stop", stop_reason="stop"),
        ],
    ),
    "invalid UTF-8 in the JSON structure": (
        Reply(pieces=[b"data: {\xff}\n\n"]),
        [Err("BAD_STREAM")],
    ),
    "unknown event types are ignored": (
        Reply(
            pieces=[
                b"event: progress\ndata: {not json\n\n",
                *GOOD[:3],
                b"event: x\ndata: 1\n\n",
                *GOOD[3:],
            ]
        ),
        GOOD_CHUNKS,
    ),
    "unknown fields and keys are ignored": (
        Reply(
            pieces=[
                b"foo: bar\nid: 3\nretry: 10\n" + HI,
                frame({"content": " there", "audio": None}, logprobs=[]),
                *GOOD[2:],
            ]
        ),
        GOOD_CHUNKS,
    ),
    "empty stream": (Reply(pieces=[]), [Err("STREAM_CUT", says="without a finish")]),
    "missing [DONE]": (Reply(pieces=GOOD[:4]), GOOD_CHUNKS),
    "cut after the finish, before usage": (
        Reply(pieces=[HI, THERE, STOP], cut_after=3),
        [*GOOD_CHUNKS[:4], Finish("stop", stop_reason="stop")],
    ),
    "[DONE] without a finish after text": (
        Reply(pieces=[HI, THERE, usage_frame(), DONE]),
        [*GOOD_CHUNKS[:4], UsageChunk(Usage(5, 2)), Finish("stop")],
    ),
    "[DONE] without a finish after tool calls": (
        Reply(pieces=[HI, CALL_A, frame({"tool_calls": [CALL_B]}), DONE]),
        [
            *PREFIX,
            BlockEnd(0),
            BlockStart(1, "tool-call", "a", "f"),
            ToolCallDelta(1, '{"x": 1}'),
            BlockStart(2, "tool-call", "b", "now"),
            BlockEnd(1),
            ToolCallDelta(2, "{}"),
            BlockEnd(2),
            Finish("tool-calls"),
        ],
    ),
    "[DONE] without a finish after a refusal": (
        Reply(pieces=[frame({"refusal": "No."}), DONE]),
        [BlockStart(0, "text"), TextDelta(0, "No."), BlockEnd(0), Finish("stop", "refusal")],
    ),
    "[DONE] before any content": (
        Reply(pieces=[usage_frame(), DONE]),
        [Err("STREAM_CUT", says="before any content")],
    ),
    "refusal text is the answer": (
        Reply(
            pieces=[
                frame({"role": "assistant", "content": None, "refusal": "I can't"}),
                frame({"refusal": " help with that."}),
                STOP,
                usage_frame(),
                DONE,
            ]
        ),
        [
            BlockStart(0, "text"),
            TextDelta(0, "I can't"),
            TextDelta(0, " help with that."),
            BlockEnd(0),
            UsageChunk(Usage(5, 2)),
            Finish("stop", stop_reason="refusal"),
        ],
    ),
    "refusal cut by the content filter keeps that reason": (
        Reply(pieces=[frame({"refusal": "No"}), frame({}, "content_filter"), DONE]),
        [
            BlockStart(0, "text"),
            TextDelta(0, "No"),
            BlockEnd(0),
            Finish("stop", stop_reason="content_filter"),
        ],
    ),
    "content as a list of typed parts": (
        Reply(
            pieces=[
                frame({"role": "assistant", "content": [{"type": "text", "text": "Hi"}]}),
                frame({"content": [{"type": "reference", "ids": [1]}]}),
                frame(
                    {
                        "content": [
                            {"type": "thinking", "thinking": [{"type": "text", "text": "hm"}]},
                            {"type": "text", "text": " th"},
                            {"type": "text", "text": "ere"},
                        ]
                    }
                ),
                STOP,
                usage_frame(),
                DONE,
            ]
        ),
        [
            *PREFIX,
            BlockEnd(0),
            BlockStart(1, "reasoning"),  # Magistral's thinking parts are reasoning, not answer
            ReasoningDelta(1, "hm"),
            BlockEnd(1),
            BlockStart(2, "text"),
            TextDelta(2, " th"),
            TextDelta(2, "ere"),
            BlockEnd(2),
            *GOOD_CHUNKS[4:],
        ],
    ),
    "keep-alive flood": (
        Reply.sse(
            b"".join([HI, b": keep-alive\n\n" * 10_000, THERE, b":\r\n\r\n" * 5_000, *GOOD[2:]]),
            piece=997,
        ),
        GOOD_CHUNKS,
    ),
    "keep-alives in tiny pieces": (
        Reply.sse(b"".join([HI, b": ping\n\n" * 300, *GOOD[1:]]), piece=3),
        GOOD_CHUNKS,
    ),
    "max tokens inside tool arguments": (
        Reply(
            pieces=[
                frame(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "a",
                                "function": {"name": "f", "arguments": '{"x": 1}'},
                            }
                        ]
                    }
                ),
                frame(
                    {
                        "tool_calls": [
                            {
                                "index": 1,
                                "id": "b",
                                "function": {"name": "g", "arguments": '{"y": "tru'},
                            }
                        ]
                    }
                ),
                frame({}, "length"),
                DONE,
            ]
        ),
        [
            BlockStart(0, "tool-call", "a", "f"),
            ToolCallDelta(0, '{"x": 1}'),
            BlockStart(1, "tool-call", "b", "g"),
            ToolCallDelta(1, '{"y": "tru'),
            BlockEnd(0),
            Finish("max-tokens", stop_reason="length"),
        ],
    ),
    "DeepSeek insufficient_system_resource": (
        Reply(pieces=[HI, frame({}, "insufficient_system_resource"), DONE]),
        [*PREFIX, Err("HTTP_5XX", says="insufficient_system_resource")],
    ),
    "non-SSE 200": (
        Reply.error(200, {"choices": [{"message": {"content": "hi"}}]}),
        [Err("BAD_STREAM", 200, says="application/json")],
    ),
    "200 without a content type": (Reply(pieces=GOOD, headers=()), [Err("BAD_STREAM", 200)]),
    "429 with Retry-After seconds": (
        Reply.error(
            429, {"error": {"message": "Rate limit reached"}}, headers=(("retry-after", "7"),)
        ),
        [Err("HTTP_429", 429, retry_after=7.0, says="Rate limit reached")],
    ),
    "429 with a huge Retry-After is capped": (
        Reply.error(429, {"error": {"message": "slow down"}}, headers=(("retry-after", "3600"),)),
        [Err("HTTP_429", 429, retry_after=60.0)],
    ),
    "429 with retry-after-ms": (
        Reply.error(429, {"error": {"message": "x"}}, headers=(("retry-after-ms", "1500"),)),
        [Err("HTTP_429", 429, retry_after=1.5)],
    ),
    "500": (
        Reply.error(500, {"error": {"message": "internal"}}),
        [Err("HTTP_5XX", 500, says="internal")],
    ),
    "502 with an HTML body": (
        Reply.error(502, "<html>Bad Gateway</html>"),
        [Err("HTTP_5XX", 502, says="Bad Gateway")],
    ),
    "503 with Retry-After": (
        Reply.error(503, {"error": {"message": "down"}}, headers=(("retry-after", "2"),)),
        [Err("HTTP_5XX", 503, retry_after=2.0)],
    ),
    "529": (
        Reply.error(
            529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        ),
        [Err("HTTP_5XX", 529, says="Overloaded")],
    ),
    "401": (
        Reply.error(401, {"error": {"message": "Incorrect API key"}}),
        [Err("AUTH", 401, says=KEY_ENV)],
    ),
    "403": (
        Reply.error(403, {"error": {"message": "forbidden"}}),
        [Err("AUTH", 403, says=KEY_ENV)],
    ),
    "404": (
        Reply.error(404, {"error": {"message": "model not found"}}),
        [Err("HTTP_4XX", 404, says="model not found")],
    ),
    "400 context overflow, with the provider's message": (
        Reply.error(
            400,
            {
                "error": {
                    "message": "maximum context length is 128000 tokens",
                    "type": "invalid_request_error",
                }
            },
        ),
        [Err("CONTEXT_OVERFLOW", 400, says="maximum context length is 128000 tokens")],
    ),
    "422 with a text body": (
        Reply.error(422, "unprocessable"),
        [Err("HTTP_4XX", 422, says="unprocessable")],
    ),
    "redirect": (
        Reply(status=307, headers=(("location", "/elsewhere"),)),
        [Err("PROVIDER_ERROR", 307)],
    ),
}


@pytest.mark.parametrize("case", list(STREAM_CASES))
async def test_openai_stream_fault(server: LoopbackServer, case: str) -> None:
    reply, expected = STREAM_CASES[case]
    check(await run_openai(server, reply), expected)


# --- frames that cannot be read ---------------------------------------------------------------


def raw(body: Any) -> bytes:
    """One ``data:`` event holding ``body`` as JSON, whatever its shape."""
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def call(**entry: Any) -> bytes:
    """A frame whose one tool_calls entry is ``entry``."""
    return frame({"tool_calls": [entry]})


F = {"name": "f", "arguments": "{}"}

#: Each frame follows a good first text frame; the attempt ends BAD_STREAM after its prefix.
BAD_OPENAI_FRAMES: dict[str, bytes] = {
    "delta is a string": raw({"choices": [{"index": 0, "delta": "Hi"}]}),
    "delta is a list": raw({"choices": [{"index": 0, "delta": [{"content": "Hi"}]}]}),
    "choices is an object": raw({"choices": {"0": {"delta": {"content": "x"}}}}),
    "choices is a string": raw({"choices": "abc"}),
    "a choice is not an object": raw({"choices": ["x"]}),
    "content is a number": frame({"content": 5}),
    "content is an object": frame({"content": {"text": "x"}}),
    "a content part is a string": frame({"content": ["x"]}),
    "a content part has no type": frame({"content": [{"text": "x"}]}),
    "a text part has no text": frame({"content": [{"type": "text"}]}),
    "a text part's text is a number": frame({"content": [{"type": "text", "text": 1}]}),
    "reasoning is a list": frame({"reasoning_content": ["x"]}),
    "refusal is an object": frame({"refusal": {"text": "no"}}),
    "tool_calls is an object": frame({"tool_calls": {"index": 0, "function": F}}),
    "a tool_calls entry is a string": frame({"tool_calls": ["f"]}),
    "tool call index is a string": call(index="0", id="a", function=F),
    "tool call index is a float": call(index=0.0, id="a", function=F),
    "tool call index is a boolean": call(index=True, id="a", function=F),
    "tool call id is a list": call(index=0, id=["a"], function=F),
    "tool call name is a number": call(index=0, id="a", function={"name": 7}),
    "tool call function is a string": call(index=0, id="a", function="f"),
    "tool call arguments are a list": call(
        index=0, id="a", function={"name": "f", "arguments": [1]}
    ),
    "tool call arguments are a number": call(
        index=0, id="a", function={"name": "f", "arguments": 5}
    ),
    "usage is a string": raw({"choices": [], "usage": "lots"}),
    "usage count is a string": raw({"choices": [], "usage": {"prompt_tokens": "5"}}),
    "usage count is a float": raw({"choices": [], "usage": {"completion_tokens": 2.5}}),
    "usage count is negative": raw({"choices": [], "usage": {"prompt_tokens": -1}}),
    "usage count is a boolean": raw({"choices": [], "usage": {"prompt_tokens": True}}),
    "usage details are a number": raw(
        {"choices": [], "usage": {"prompt_tokens": 1, "prompt_tokens_details": 3}}
    ),
    "finish_reason is a number": raw({"choices": [{"index": 0, "delta": {}, "finish_reason": 1}]}),
    "finish_reason is a list": raw(
        {"choices": [{"index": 0, "delta": {}, "finish_reason": ["stop"]}]}
    ),
    "JSON nested too deep": b"data: " + b"[" * 100_000 + b"\n\n",
}


@pytest.mark.parametrize("case", list(BAD_OPENAI_FRAMES))
async def test_openai_unreadable_frame_is_bad_stream(server: LoopbackServer, case: str) -> None:
    reply = Reply(pieces=[HI, BAD_OPENAI_FRAMES[case], THERE, STOP, usage_frame(), DONE])
    check(await run_openai(server, reply), [*PREFIX, Err("BAD_STREAM", says="malformed frame")])


# --- any frame: a chunk or a malformed-frame error, nothing else --------------------------------

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-1, 3)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=10,
)
_TEXT = st.text(max_size=4) | _JSON
_COUNT = st.integers(0, 9) | _JSON
_INDEX = st.integers(0, 2) | _JSON


def _obj(required: dict[str, Any] | None = None, **optional: Any) -> Any:
    """An object with some of the ``optional`` fields, or (rarely) any JSON value instead."""
    return st.fixed_dictionaries(required or {}, optional=optional) | _JSON


_OPENAI_FRAME = st.fixed_dictionaries(
    {},
    optional={
        "choices": st.lists(
            _obj(
                index=_INDEX,
                finish_reason=st.sampled_from(["stop", "tool_calls", "length"]) | _JSON,
                delta=_obj(
                    content=_TEXT | st.lists(_obj(type=st.just("text") | _TEXT, text=_TEXT)),
                    reasoning_content=_TEXT,
                    refusal=_TEXT,
                    tool_calls=st.lists(
                        _obj(
                            index=_INDEX,
                            id=_TEXT,
                            function=_obj(
                                name=_TEXT,
                                arguments=_TEXT | st.dictionaries(st.text(max_size=2), _JSON),
                            ),
                        ),
                        max_size=2,
                    ),
                ),
            ),
            max_size=2,
        ),
        "usage": _obj(
            prompt_tokens=_COUNT,
            completion_tokens=_COUNT,
            prompt_tokens_details=_obj(cached_tokens=_COUNT),
        ),
    },
)
_BLOCK_TYPES = st.sampled_from(["text", "thinking", "redacted_thinking", "tool_use", "image"])
_DELTA_TYPES = st.sampled_from(
    ["text_delta", "input_json_delta", "thinking_delta", "signature_delta"]
)
_CLAUDE_USAGE = _obj(input_tokens=_COUNT, output_tokens=_COUNT, cache_read_input_tokens=_COUNT)
_CLAUDE_FRAME = st.one_of(
    st.fixed_dictionaries(
        {
            "type": st.just("content_block_start"),
            "index": _INDEX,
            "content_block": _obj(
                {"type": _BLOCK_TYPES},
                text=_TEXT,
                thinking=_TEXT,
                signature=_TEXT,
                data=_TEXT,
                id=_TEXT,
                name=_TEXT,
                input=_JSON,
            ),
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("content_block_delta"),
            "index": _INDEX,
            "delta": _obj(
                {"type": _DELTA_TYPES},
                text=_TEXT,
                partial_json=_TEXT,
                thinking=_TEXT,
                signature=_TEXT,
            ),
        }
    ),
    st.fixed_dictionaries({"type": st.just("content_block_stop"), "index": _INDEX}),
    st.fixed_dictionaries({"type": st.just("message_start"), "message": _obj(usage=_CLAUDE_USAGE)}),
    st.fixed_dictionaries(
        {"type": st.just("message_delta")},
        optional={"delta": _obj(stop_reason=_TEXT), "usage": _CLAUDE_USAGE},
    ),
    st.just({"type": "message_stop"}),
    st.fixed_dictionaries({"type": st.just("error"), "error": _JSON}),
)
#: What a frame decoder may raise for a frame it cannot read (the pump's ``BAD_STREAM``).
MALFORMED = (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError)
_CHUNK_FIELDS: dict[type, dict[str, tuple[type, ...]]] = {
    BlockStart: {
        "index": (int,),
        "kind": (str,),
        "call_id": (str, type(None)),
        "name": (str, type(None)),
    },
    TextDelta: {"index": (int,), "text": (str,)},
    ReasoningDelta: {"index": (int,), "text": (str,)},
    ToolCallDelta: {"index": (int,), "arguments": (str,)},
    BlockEnd: {"index": (int,)},
    Finish: {"reason": (str,), "stop_reason": (str, type(None))},
}


def _well_typed(chunk: Chunk) -> None:
    if isinstance(chunk, UsageChunk):
        fields = attrs.asdict(chunk.usage)
        assert all(type(v) is int or v is None for v in fields.values()), chunk
        return
    for field, types in _CHUNK_FIELDS[type(chunk)].items():
        assert type(getattr(chunk, field)) in types, chunk


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), anthropic=st.booleans())
def test_any_frame_gives_typed_chunks_or_a_malformed_frame(
    data: st.DataObject, anthropic: bool
) -> None:
    frames = data.draw(st.lists(_CLAUDE_FRAME if anthropic else _OPENAI_FRAME, max_size=6))
    decoder: Any = AnthropicStreamDecoder() if anthropic else OpenAIStreamDecoder()
    chunks: list[Chunk] = []
    for frame in frames:
        try:
            chunks += decoder.feed(SSEEvent(json.dumps(frame)))
        except MALFORMED:
            break  # the pump's BAD_STREAM
        if decoder.done:
            break
    else:
        chunks += decoder.end()
    assembler = Assembler()
    for chunk in chunks:
        _well_typed(chunk)
        assembler.feed(chunk)
    assembler.content()
    assembler.delivered_text()


# --- Anthropic stream faults ----------------------------------------------------------------

CLAUDE_CASES: dict[str, tuple[Reply, list[Chunk | Err]]] = {
    "error event after a tool_use started": (
        Reply.sse(transcript("anthropic_overloaded"), piece=50),
        [
            BlockStart(0, "tool-call", "toolu_01Ov", "search"),
            ToolCallDelta(0, '{"q": "tr'),
            Err("HTTP_5XX", says="Overloaded"),
        ],
    ),
    "api_error event after text": (
        Reply(
            pieces=[*CLAUDE_TEXT, an("error", error={"type": "api_error", "message": "Internal"})]
        ),
        [BlockStart(0, "text"), TextDelta(0, "Hi"), Err("PROVIDER_ERROR", says="Internal")],
    ),
    "unknown events, blocks and deltas are ignored": (
        Reply(
            pieces=[
                CLAUDE_START,
                an(
                    "content_block_start",
                    index=0,
                    content_block={
                        "type": "server_tool_use",
                        "id": "s",
                        "name": "web_search",
                        "input": {},
                    },
                ),
                an(
                    "content_block_delta",
                    index=0,
                    delta={"type": "input_json_delta", "partial_json": "{}"},
                ),
                an("content_block_stop", index=0),
                an("brand_new_event", detail=1),
                an("content_block_start", index=1, content_block={"type": "text", "text": ""}),
                an(
                    "content_block_delta",
                    index=1,
                    delta={"type": "citations_delta", "citation": {}},
                ),
                an("content_block_delta", index=1, delta={"type": "text_delta", "text": "Hi"}),
                an("content_block_stop", index=1),
                an("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 3}),
                an("message_stop"),
            ]
        ),
        [
            BlockStart(0, "text"),
            TextDelta(0, "Hi"),
            BlockEnd(0),
            UsageChunk(Usage(9, 3)),
            Finish("stop", stop_reason="end_turn"),
        ],
    ),
    "message_stop without a stop reason": (
        Reply(pieces=[*CLAUDE_TEXT, an("message_stop")]),
        [BlockStart(0, "text"), TextDelta(0, "Hi"), Err("STREAM_CUT")],
    ),
    "cut inside a tool_use": (
        Reply(
            pieces=[
                CLAUDE_START,
                an(
                    "content_block_start",
                    index=0,
                    content_block={"type": "tool_use", "id": "t", "name": "f", "input": {}},
                ),
                an(
                    "content_block_delta",
                    index=0,
                    delta={"type": "input_json_delta", "partial_json": '{"a"'},
                ),
            ],
            cut_after=3,
        ),
        [BlockStart(0, "tool-call", "t", "f"), ToolCallDelta(0, '{"a"'), Err("STREAM_CUT")],
    ),
    "tool_use without arguments": (
        Reply(
            pieces=[
                CLAUDE_START,
                an(
                    "content_block_start",
                    index=0,
                    content_block={"type": "tool_use", "id": "t", "name": "now", "input": {}},
                ),
                an("content_block_stop", index=0),
                an("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 4}),
                an("message_stop"),
            ]
        ),
        [
            BlockStart(0, "tool-call", "t", "now"),
            ToolCallDelta(0, "{}"),
            BlockEnd(0),
            UsageChunk(Usage(9, 4)),
            Finish("tool-calls", stop_reason="tool_use"),
        ],
    ),
    "pause_turn and refusal keep the reason": (
        Reply(
            pieces=[
                *CLAUDE_TEXT,
                an("message_delta", delta={"stop_reason": "refusal"}, usage={"output_tokens": 2}),
                an("message_stop"),
            ]
        ),
        [
            BlockStart(0, "text"),
            TextDelta(0, "Hi"),
            UsageChunk(Usage(9, 2)),
            Finish("stop", stop_reason="refusal"),
        ],
    ),
    "529 overloaded": (
        Reply.error(
            529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        ),
        [Err("HTTP_5XX", 529, says="Overloaded")],
    ),
    "401 names ANTHROPIC_API_KEY": (
        Reply.error(
            401,
            {
                "type": "error",
                "error": {"type": "authentication_error", "message": "invalid x-api-key"},
            },
        ),
        [Err("AUTH", 401, says="ANTHROPIC_API_KEY")],
    ),
}


@pytest.mark.parametrize("case", list(CLAUDE_CASES))
async def test_anthropic_stream_fault(server: LoopbackServer, case: str) -> None:
    reply, expected = CLAUDE_CASES[case]
    check(await run_claude(server, reply), expected)


def tool_use(index: Any = 1, **block: Any) -> bytes:
    """``content_block_start`` of a tool_use block (fields overridable)."""
    content = {"type": "tool_use", "id": "t", "name": "f", "input": {}, **block}
    return an("content_block_start", index=index, content_block=content)


def delta(dtype: str, index: Any = 0, **fields: Any) -> bytes:
    return an("content_block_delta", index=index, delta={"type": dtype, **fields})


def an_end_turn() -> list[bytes]:
    return [
        an("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 3}),
        an("message_stop"),
    ]


TOOL_STARTED: list[Chunk] = [BlockStart(1, "tool-call", "t", "f")]
THINKING_STARTED: list[Chunk] = [BlockStart(1, "reasoning")]
THINKING = an("content_block_start", index=1, content_block={"type": "thinking", "thinking": ""})

#: Events that follow ``CLAUDE_TEXT`` (a text block that delivered "Hi"), with the chunks the
#: events before the bad one produce; the attempt then ends BAD_STREAM.
BAD_CLAUDE_EVENTS: dict[str, tuple[list[bytes], list[Chunk]]] = {
    "text is a number": ([delta("text_delta", text=5)], []),
    "text is missing": ([delta("text_delta")], []),
    "delta is a string": ([an("content_block_delta", index=0, delta="Hi")], []),
    "delta index is a string": ([delta("text_delta", index="0", text="x")], []),
    "delta index is missing": ([an("content_block_delta", delta={"type": "text_delta"})], []),
    "stop index is a float": ([an("content_block_stop", index=0.0)], []),
    "block start index is a boolean": ([tool_use(index=True)], []),
    "content_block is a list": ([an("content_block_start", index=1, content_block=[])], []),
    "text block text is a number": (
        [an("content_block_start", index=1, content_block={"type": "text", "text": 3})],
        [],
    ),
    "tool_use id is a number": ([tool_use(id=1)], []),
    "tool_use name is missing": ([tool_use(name=None)], []),
    "tool_use input is a list": ([tool_use(input=[1])], []),
    "partial_json is a number": (
        [tool_use(), delta("input_json_delta", 1, partial_json=1)],
        TOOL_STARTED,
    ),
    "partial_json is an object": (
        [tool_use(), delta("input_json_delta", 1, partial_json={"a": 1})],
        TOOL_STARTED,
    ),
    "thinking is a list": (
        [THINKING, delta("thinking_delta", 1, thinking=["x"])],
        THINKING_STARTED,
    ),
    "signature is a number": (
        [THINKING, delta("signature_delta", 1, signature=5)],
        THINKING_STARTED,
    ),
    "thinking block signature is a number": (
        [an("content_block_start", index=1, content_block={"type": "thinking", "signature": 2})],
        [],
    ),
    "message_start message is a string": ([an("message_start", message="m")], []),
    "message_start usage count is a string": (
        [an("message_start", message={"usage": {"input_tokens": "9"}})],
        [],
    ),
    "message_delta delta is a list": ([an("message_delta", delta=["end_turn"])], []),
    "stop_reason is a number": ([an("message_delta", delta={"stop_reason": 1})], []),
    "message_delta usage count is a float": (
        [an("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 1.5})],
        [],
    ),
    "message_delta usage is a string": (
        [an("message_delta", delta={"stop_reason": "end_turn"}, usage="3")],
        [],
    ),
}


@pytest.mark.parametrize("case", list(BAD_CLAUDE_EVENTS))
async def test_anthropic_unreadable_event_is_bad_stream(server: LoopbackServer, case: str) -> None:
    events, before = BAD_CLAUDE_EVENTS[case]
    pieces = [*CLAUDE_TEXT, *events, an("content_block_stop", index=0), *an_end_turn()]
    expected = [BlockStart(0, "text"), TextDelta(0, "Hi"), *before]
    check(await run_claude(server, Reply(pieces=pieces)), [*expected, Err("BAD_STREAM")])


#: (adapter, the error event after a text prefix, code, the failure's exact message)
ERROR_EVENTS: dict[str, tuple[str, bytes, str, str]] = {
    "openai: event: error with a nested error": (
        "openai",
        b'event: error\ndata: {"error": {"message": "quota gone", "type": "insufficient_quota"}}'
        b"\n\n",
        "PROVIDER_ERROR",
        "quota gone",
    ),
    "openai: event: error with a bare error": (
        "openai",
        b'event: error\ndata: {"message": "busy", "type": "overloaded_error"}\n\n',
        "HTTP_5XX",
        "busy",
    ),
    "openai: event: error with text": (
        "openai",
        b"event: error\ndata: quota gone\n\n",
        "PROVIDER_ERROR",
        "quota gone",
    ),
    "openai: error frame": (
        "openai",
        b'data: {"error": {"message": "boom", "type": "server_error"}}\n\n',
        "PROVIDER_ERROR",
        "boom",
    ),
    "openai: vLLM error frame": (
        "openai",
        b'data: {"object": "error", "message": "decode failed", "code": 400}\n\n',
        "PROVIDER_ERROR",
        "decode failed",
    ),
    "anthropic: error event": (
        "anthropic",
        an("error", error={"type": "overloaded_error", "message": "Overloaded"}),
        "HTTP_5XX",
        "Overloaded",
    ),
    "anthropic: error event without a message": (
        "anthropic",
        an("error", error={"type": "api_error"}),
        "PROVIDER_ERROR",
        "api_error",
    ),
    "anthropic: error event with text": (
        "anthropic",
        b"event: error\ndata: upstream timed out\n\n",
        "PROVIDER_ERROR",
        "upstream timed out",
    ),
}


@pytest.mark.parametrize("case", list(ERROR_EVENTS))
async def test_error_event_message_is_the_provider_text(server: LoopbackServer, case: str) -> None:
    kind, event, code, message = ERROR_EVENTS[case]
    if kind == "openai":
        chunks = await run_openai(server, Reply(pieces=[HI, event, THERE, STOP, DONE]))
    else:
        chunks = await run_claude(server, Reply(pieces=[*CLAUDE_TEXT, event, *an_end_turn()]))
    assert chunks[:-1] == [BlockStart(0, "text"), TextDelta(0, "Hi")]
    assert chunks[-1] == Finish("error", failure=Failure(code, message))


async def test_max_tokens_inside_tool_arguments_anthropic(server: LoopbackServer) -> None:
    chunks = await run_claude(
        server, Reply.sse(transcript("anthropic_redacted_max_tokens"), piece=17)
    )
    assert not any(isinstance(c, BlockEnd) and c.index == 1 for c in chunks)
    assert chunks[-1] == Finish("max-tokens", stop_reason="max_tokens")
    assert [b["type"] for b in assemble(chunks)] == ["reasoning"]


# --- size, time and transport faults --------------------------------------------------------


async def test_ten_megabyte_arguments(server: LoopbackServer) -> None:
    arguments = json.dumps({"text": "x" * 10_000_000})
    call = {"index": 0, "id": "big", "function": {"name": "write", "arguments": arguments}}
    data = b"".join([frame({"tool_calls": [call]}), frame({}, "tool_calls"), DONE])
    roomy = StreamLimits(
        max_line_bytes=16 << 20, max_event_bytes=16 << 20, max_output_chars=20_000_000
    )  # the defaults refuse a 10 MB line (``test_http.py``)
    chunks = await run_openai(server, Reply.sse(data, piece=65_536), stream_limits=roomy)
    assert chunks == [
        BlockStart(0, "tool-call", "big", "write"),
        ToolCallDelta(0, arguments),
        BlockEnd(0),
        Finish("tool-calls", stop_reason="tool_calls"),
    ]


async def test_read_timeout_mid_stream(server: LoopbackServer) -> None:
    chunks = await run_openai(server, Reply(pieces=GOOD, hang_after=1), timeout=(2.0, 0.3))
    check(chunks, [*PREFIX, Err("TIMEOUT")])


async def test_timeout_before_the_response(server: LoopbackServer) -> None:
    chunks = await run_openai(server, Reply(pieces=GOOD, delay=5.0), timeout=(2.0, 0.3))
    check(chunks, [Err("TIMEOUT")])


async def test_connect_refused() -> None:
    async with closing(OpenAIAdapter("p", base_url=refused_url())) as adapter:
        check(await collect(adapter, CONFIG), [Err("CONNECTION")])


async def test_connect_timeout_mock() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out", request=request)

    async with closing(mock_openai(handler)) as adapter:
        check(await collect(adapter, CONFIG), [Err("TIMEOUT")])


async def test_connect_error_mock() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("name resolution failed", request=request)

    async with closing(mock_openai(handler)) as adapter:
        check(await collect(adapter, CONFIG), [Err("CONNECTION", says="name resolution failed")])


async def test_read_error_mid_stream_mock() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield HI
        raise httpx.ReadError("connection reset by peer")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    async with closing(mock_openai(handler)) as adapter:
        check(await collect(adapter, CONFIG), [*PREFIX, Err("STREAM_CUT", says="connection reset")])


async def test_undecodable_content_encoding_mock() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": "text/event-stream", "content-encoding": "gzip"}
        return httpx.Response(200, headers=headers, content=b"definitely not gzip")

    async with closing(mock_openai(handler)) as adapter:
        check(await collect(adapter, CONFIG), [Err("BAD_STREAM")])


async def test_429_with_http_date_mock() -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            429, headers={"retry-after": when}, json={"error": {"message": "later"}}
        )

    async with closing(mock_openai(handler)) as adapter:
        chunks = await collect(adapter, CONFIG)
    check(chunks, [Err("HTTP_429", 429, says="later")])
    failure = chunks[0].failure  # type: ignore[union-attr]
    assert failure is not None
    assert failure.retry_after is not None
    assert 27.0 <= failure.retry_after <= 30.0


async def test_missing_key_at_the_attempt_is_auth(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(500)

    async with closing(mock_openai(handler)) as adapter:
        prepared = await adapter.prepare_call(CONFIG)
        monkeypatch.delenv(KEY_ENV)
        async with aclosing(prepared.stream(ModelRequest(prepared.config, USER_HI))) as stream:  # type: ignore[type-var]
            chunks = [c async for c in stream]
    check(chunks, [Err("AUTH", says=KEY_ENV)])
    assert calls == []


async def test_cancel_mid_stream_closes_the_response(server: LoopbackServer) -> None:
    server.push(Reply(pieces=GOOD, hang_after=1))
    server.default = Reply(pieces=GOOD)
    got: list[Chunk] = []
    async with closing(openai(server)) as adapter:
        prepared = await adapter.prepare_call(CONFIG)

        async def consume() -> None:
            request = ModelRequest(prepared.config, USER_HI)
            async with aclosing(prepared.stream(request)) as stream:  # type: ignore[type-var]
                async for chunk in stream:
                    got.append(chunk)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            with trio.fail_after(5):
                while len(got) < len(PREFIX):
                    await trio.sleep(0.01)
            await trio.sleep(0.05)  # the stream is now blocked reading
            nursery.cancel_scope.cancel()
        with trio.fail_after(5):
            while server.hung_up == 0:
                await trio.sleep(0.01)
        again = await collect(adapter, CONFIG)
    assert got == PREFIX
    assert again == GOOD_CHUNKS


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("5", 5.0),
        (" 1.5 ", 1.5),
        ("-3", 0.0),
        ("120", 60.0),
        ("nan", None),
        ("soon", None),
        ("Wed, 21 Oct 2015 07:28:30 GMT", 30.0),
        ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),
        ("Wed, 21 Oct 2015 09:28:00 GMT", 60.0),
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    now = email.utils.parsedate_to_datetime("Wed, 21 Oct 2015 07:28:00 GMT").timestamp()
    assert parse_retry_after(value, now=now) == expected


def test_corpus_size() -> None:
    # The brief asks for at least 30 cases; this guards against the tables shrinking.
    assert len(STREAM_CASES) + len(CLAUDE_CASES) >= 40


async def test_consumer_stopping_early_closes_the_response(server: LoopbackServer) -> None:
    server.push(Reply(pieces=GOOD, hang_after=1))
    server.default = Reply(pieces=GOOD)
    async with closing(openai(server)) as adapter:
        prepared = await adapter.prepare_call(CONFIG)
        async with aclosing(prepared.stream(ModelRequest(prepared.config, USER_HI))) as stream:  # type: ignore[type-var]
            async for chunk in stream:
                assert chunk == PREFIX[0]
                break
        with trio.fail_after(5):
            while server.hung_up == 0:
                await trio.sleep(0.01)
        assert await collect(adapter, CONFIG) == GOOD_CHUNKS


async def test_server_keeping_the_body_open_after_done(server: LoopbackServer) -> None:
    # The answer is complete at [DONE]; the adapter waits only briefly for the body's end.
    with trio.fail_after(5):
        chunks = await run_openai(server, Reply(pieces=GOOD, hang_after=len(GOOD)))
    assert chunks == GOOD_CHUNKS
