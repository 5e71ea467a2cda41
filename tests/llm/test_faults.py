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

from dsh_agent_loop.llm._http import parse_retry_after
from dsh_agent_loop.llm.anthropic import AnthropicAdapter
from dsh_agent_loop.llm.base import (
    BlockEnd,
    BlockStart,
    Chunk,
    Finish,
    ModelRequest,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)
from dsh_agent_loop.llm.openai import OpenAIAdapter

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
    "[DONE] without a finish": (Reply(pieces=[HI, DONE]), [*PREFIX, Err("STREAM_CUT")]),
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
    "400 with the provider's message": (
        Reply.error(
            400,
            {
                "error": {
                    "message": "maximum context length is 128000 tokens",
                    "type": "invalid_request_error",
                }
            },
        ),
        [Err("HTTP_4XX", 400, says="maximum context length is 128000 tokens")],
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


# --- Anthropic stream faults ----------------------------------------------------------------

CLAUDE_CASES: dict[str, tuple[Reply, list[Chunk | Err]]] = {
    "error event after a tool_use started": (
        Reply.sse(transcript("anthropic_overloaded"), piece=50),
        [
            BlockStart(0, "tool-call", "toolu_01Ov", "search"),
            ToolCallDelta(0, '{"q": "tr'),
            Err("HTTP_5XX", says="overloaded_error"),
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
    chunks = await run_openai(server, Reply.sse(data, piece=65_536))
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
