"""``llm/_http.py``: endpoints, timeouts, the client pool, failure mapping and the SSE pump.

The pump runs against a real HTTP/1.1 server on loopback (``server.py``) with a tiny frame
decoder of its own, so these tests pin the plumbing itself, not an adapter's wire format.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, final

import httpx
import pytest
import trio

from dsh_agent_loop.llm import _http
from dsh_agent_loop.llm._base import (
    Chunk,
    Failure,
    Finish,
    ModelError,
    ModelRequest,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)
from dsh_agent_loop.llm._http import (
    ClientPool,
    endpoint,
    error_message,
    failed_stream,
    make_timeout,
    parse_retry_after,
    post_stream,
    provider_message,
    read_api_key,
    status_failure,
    token_count,
    transport_failure,
    with_defaults,
)
from dsh_agent_loop.llm._sse import SSEEvent
from dsh_agent_loop.llm._stream_limits import DEFAULT_STREAM_LIMITS, StreamLimits

from .server import LoopbackServer, Reply, open_loopback_server, refused_url

# --- a minimal frame decoder --------------------------------------------------------------------


class Decoder:
    """``{"text": ...}`` frames are text deltas, ``{"finish": r}`` a finish, ``[DONE]`` the end.

    ``{"reasoning": ...}`` and ``{"args": ...}`` frames are reasoning and tool-call deltas;
    ``{}`` gives nothing (an empty frame).
    """

    def __init__(self) -> None:
        self.finish: Finish | None = None
        self.done = False
        self.fed: list[str] = []

    def feed(self, event: SSEEvent) -> list[Chunk]:
        self.fed.append(event.data)
        if event.data == "[DONE]":
            self.done = True
            return [self.finish] if self.finish is not None else []
        frame = json.loads(event.data)  # ValueError on a malformed frame
        if "finish" in frame:
            self.finish = Finish(frame["finish"])
            return []
        if "reasoning" in frame:
            return [ReasoningDelta(1, frame["reasoning"])]
        if "args" in frame:
            return [ToolCallDelta(2, frame["args"])]
        if not frame:
            return []
        return [TextDelta(0, frame["text"])]  # KeyError on a frame without text

    def end(self) -> list[Chunk]:
        return [self.finish] if self.finish is not None else []


def sse(*frames: Any) -> bytes:
    out = bytearray()
    for frame in frames:
        data = frame if isinstance(frame, str) else json.dumps(frame)
        out += f"data: {data}\n\n".encode()
    return bytes(out)


HELLO = sse({"text": "hel"}, {"text": "lo"}, {"finish": "stop"}, "[DONE]")


@pytest.fixture
async def server() -> AsyncIterator[LoopbackServer]:
    async with open_loopback_server() as server:
        yield server


async def pump(
    pool: ClientPool,
    url: str,
    body: Any = None,
    *,
    auth: dict[str, str] | None = None,
    decoder: Decoder | None = None,
    key_env: str | None = "TEST_KEY",
    limits: StreamLimits = DEFAULT_STREAM_LIMITS,
) -> list[Chunk]:
    stream = post_stream(
        pool,
        url + "/v1/stream",
        {"q": 1} if body is None else body,
        auth=auth or {},
        decoder=decoder or Decoder(),
        key_env=key_env,
        limits=limits,
    )
    async with aclosing(stream) as chunks:
        return [chunk async for chunk in chunks]


def failure_of(chunks: list[Chunk]) -> Failure:
    last = chunks[-1]
    assert isinstance(last, Finish), chunks
    assert last.reason == "error", chunks
    assert last.failure is not None
    return last.failure


@pytest.fixture
async def pool() -> AsyncIterator[ClientPool]:
    pool = ClientPool(headers={"x-adapter": "test"}, timeout=(5.0, 5.0), transport=None)
    try:
        yield pool
    finally:
        await pool.aclose()


# --- pure helpers -------------------------------------------------------------------------------


def test_endpoint_joins_and_refuses_non_http_urls() -> None:
    assert endpoint("http://h:1/api//", "/v1/x") == "http://h:1/api/v1/x"
    assert endpoint("https://h", "/p") == "https://h/p"
    for bad in ("ftp://h", "h/only", "http://", "http://[::1"):
        with pytest.raises(ValueError, match="base_url"):
            endpoint(bad, "/p")


def test_make_timeout_shapes() -> None:
    one = make_timeout(7)
    assert (one.connect, one.read, one.write, one.pool) == (7.0, 7.0, 7.0, 7.0)
    pair = make_timeout((1.5, 30.0))
    # writing is bounded like reading, waiting for a pool slot like connecting
    assert (pair.connect, pair.read, pair.write, pair.pool) == (1.5, 30.0, 30.0, 1.5)
    partial = make_timeout({"read": 9.0})
    assert (partial.connect, partial.read) == (_http.DEFAULT_TIMEOUT[0], 9.0)
    unbounded = make_timeout({"connect": None, "read": None})
    assert (unbounded.connect, unbounded.read, unbounded.pool) == (None, None, None)


def test_read_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    assert read_api_key(None) is None
    assert read_api_key("") is None
    monkeypatch.setenv("DSH_HTTP_TEST_KEY", "sk-1")
    assert read_api_key("DSH_HTTP_TEST_KEY") == "sk-1"
    monkeypatch.setenv("DSH_HTTP_TEST_KEY", "")
    with pytest.raises(ModelError) as info:
        read_api_key("DSH_HTTP_TEST_KEY")
    assert info.value.code == "AUTH"
    assert "DSH_HTTP_TEST_KEY" in info.value.message
    monkeypatch.delenv("DSH_HTTP_TEST_KEY")
    with pytest.raises(ModelError, match="DSH_HTTP_TEST_KEY is not set"):
        read_api_key("DSH_HTTP_TEST_KEY")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("3", 3.0),
        (" 2.5 ", 2.5),
        ("0", 0.0),
        ("-4", 0.0),  # never negative
        ("3600", 60.0),  # capped
        ("nan", None),
        ("inf", None),
        ("soon", None),
        ("Wed, 21 Oct 2015 07:28:10 GMT", 10.0),  # an HTTP date, 10 s after ``now``
        ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),  # in the past
        ("Wed, 21 Oct 2015 09:28:00 GMT", 60.0),
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    now = 1445412480.0  # Wed, 21 Oct 2015 07:28:00 GMT
    assert parse_retry_after(value, now=now) == expected


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"error": {"message": "bad model", "type": "x"}}', "bad model"),
        (b'{"error": {"detail": "too long"}}', "too long"),
        (b'{"error": "plain"}', "plain"),
        (b'{"detail": "top-level"}', "top-level"),
        (b'{"error": {"code": 3}}', '{"error": {"code": 3}}'),
        (b"[1, 2]", "[1, 2]"),
        (b"  not json  ", "not json"),
        (b"\xff\xfeoops", "\ufffd\ufffdoops"),
        (b"x" * 900, "x" * 500),
    ],
)
def test_provider_message(body: bytes, expected: str) -> None:
    assert provider_message(body) == expected


def test_error_message_prefers_the_providers_text() -> None:
    assert error_message("as is") == "as is"
    assert error_message({"message": "m", "type": "t"}) == "m"
    assert error_message({"msg": "short"}) == "short"
    assert error_message({"message": "", "type": "overloaded_error"}) == "overloaded_error"
    assert error_message({"code": 1}) == '{"code": 1}'
    assert len(error_message(["x" * 1000])) == 500


def test_token_count_accepts_only_non_negative_ints() -> None:
    assert token_count({"n": 4}, "n") == 4
    assert token_count({"n": 0}, "n") == 0
    assert token_count({}, "n") is None
    assert token_count({"n": None}, "n") is None
    for bad in (-1, 1.0, "3", True):
        with pytest.raises(ValueError, match="token count"):
            token_count({"n": bad}, "n")


def test_status_failure_mapping() -> None:
    no = httpx.Headers()
    body = b'{"error": {"message": "nope"}}'
    auth = status_failure(401, no, body, key_env="MY_KEY")
    assert (auth.code, auth.status) == ("AUTH", 401)
    assert "nope" in auth.message
    assert "MY_KEY" in auth.message
    assert "no api_key_env" in status_failure(403, no, b"", key_env=None).message
    limited = status_failure(429, httpx.Headers({"retry-after": "7"}), body, key_env=None)
    assert (limited.code, limited.status, limited.retry_after) == ("HTTP_429", 429, 7.0)
    assert limited.message == "HTTP 429: nope"
    for status in (500, 503, 529):
        failure = status_failure(
            status, httpx.Headers({"retry-after-ms": "1500"}), b"", key_env=None
        )
        assert (failure.code, failure.retry_after) == ("HTTP_5XX", 1.5)
    empty = status_failure(502, no, b"", key_env=None)
    assert empty.message == "HTTP 502: Bad Gateway"  # the reason phrase when no body
    assert empty.retry_after is None
    client = status_failure(400, httpx.Headers({"retry-after": "3"}), body, key_env=None)
    assert (client.code, client.status, client.retry_after) == ("HTTP_4XX", 400, None)
    assert status_failure(302, no, b"", key_env=None).code == "PROVIDER_ERROR"


def test_retry_after_headers_precedence_and_cap() -> None:
    both = httpx.Headers({"retry-after": "2", "retry-after-ms": "9000"})
    assert status_failure(429, both, b"", key_env=None).retry_after == 2.0
    ms = httpx.Headers({"retry-after-ms": "120000"})
    assert status_failure(429, ms, b"", key_env=None).retry_after == 60.0
    for bad in ("soon", "nan", "-5"):
        got = status_failure(429, httpx.Headers({"retry-after-ms": bad}), b"", key_env=None)
        assert got.retry_after == (0.0 if bad == "-5" else None)


def test_transport_failure_mapping() -> None:
    request = httpx.Request("POST", "http://h/")
    assert transport_failure(httpx.ConnectTimeout("slow", request=request), started=False).code == (
        "TIMEOUT"
    )
    assert transport_failure(httpx.ReadTimeout("slow"), started=True).code == "TIMEOUT"
    assert transport_failure(httpx.DecodingError("gzip"), started=True).code == "BAD_STREAM"
    refused = transport_failure(httpx.ConnectError("refused"), started=False)
    assert refused == Failure("CONNECTION", "ConnectError: refused")
    cut = transport_failure(httpx.ReadError(""), started=True)
    assert cut == Failure("STREAM_CUT", "stream cut: ReadError")
    assert transport_failure(httpx.RemoteProtocolError("x"), started=False).code == "CONNECTION"


def test_with_defaults_keeps_explicit_fields() -> None:
    request = ModelRequest({"model": "m", "max_tokens": 5}, ())
    assert with_defaults(request, {"max_tokens": 9}) is request  # nothing to add: same object
    merged = with_defaults(request, {"max_tokens": 9, "temperature": 0.5})
    assert dict(merged.config) == {"model": "m", "max_tokens": 5, "temperature": 0.5}
    assert merged.messages == request.messages


async def test_failed_stream_yields_one_error_finish() -> None:
    failure = Failure("AUTH", "no key")
    async with aclosing(failed_stream(failure)) as stream:
        assert [chunk async for chunk in stream] == [Finish("error", failure=failure)]


# --- the client pool ----------------------------------------------------------------------------


async def test_client_pool_is_lazy_reused_and_reopens_after_aclose() -> None:
    pool = ClientPool(headers={"x-a": "1"}, timeout=(2.0, 8.0), transport=None)
    await pool.aclose()  # nothing opened yet: a no-op
    client = pool.get()
    assert pool.get() is client
    assert client.headers["x-a"] == "1"
    assert (client.timeout.connect, client.timeout.read) == (2.0, 8.0)
    await pool.aclose()
    assert client.is_closed
    again = pool.get()
    assert again is not client
    assert not again.is_closed
    await pool.aclose()


async def test_the_pool_has_no_connection_limit(server: LoopbackServer) -> None:
    """More calls at once than httpx's default limit (100) each get a connection at once."""
    calls = 110
    arrived = trio.Event()

    def count(_request: Any) -> None:
        if len(server.requests) == calls:
            arrived.set()

    server.gate = count
    server.default = Reply.sse(HELLO, hang_after=0)  # holds every connection open
    pool = ClientPool(headers=None, timeout=(5.0, None), transport=None)
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(calls):
                nursery.start_soon(pump, pool, server.url)
            with trio.fail_after(10):  # a bound, not a measurement
                await arrived.wait()
            assert server.connections == calls
            nursery.cancel_scope.cancel()
    finally:
        await pool.aclose()


# --- the pump on loopback -----------------------------------------------------------------------


async def test_a_stream_is_decoded_and_the_request_carries_the_headers(
    server: LoopbackServer, pool: ClientPool
) -> None:
    server.push(Reply.sse(HELLO, piece=3))  # frames split across pieces
    chunks = await pump(pool, server.url, {"text": "é"}, auth={"authorization": "Bearer k"})
    assert chunks == [TextDelta(0, "hel"), TextDelta(0, "lo"), Finish("stop")]
    (request,) = server.requests
    assert (request.method, request.target) == ("POST", "/v1/stream")
    assert request.headers["accept"] == "text/event-stream"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["authorization"] == "Bearer k"
    assert request.headers["x-adapter"] == "test"  # the pool's own headers
    assert request.body == '{"text":"é"}'.encode()  # compact, not ASCII-escaped


async def test_the_connection_is_reused_after_a_finished_stream(
    server: LoopbackServer, pool: ClientPool
) -> None:
    # a keep-alive comment after the end marker: drained, so the connection goes back
    server.push(Reply(pieces=[HELLO, b": trailing\n\n"]), Reply.sse(HELLO))
    for _ in range(2):
        assert (await pump(pool, server.url))[-1] == Finish("stop")
    assert server.connections == 1


async def test_a_finish_without_end_marker_then_a_cut_loses_nothing(
    server: LoopbackServer, pool: ClientPool
) -> None:
    body = sse({"text": "a"}, {"finish": "stop"})
    server.push(Reply(pieces=[body, b'data: {"te'], cut_after=2))
    assert await pump(pool, server.url) == [TextDelta(0, "a"), Finish("stop")]


@pytest.mark.parametrize(
    ("reply", "code", "text"),
    [
        (Reply.sse(sse({"text": "a"})), "STREAM_CUT", "without a finish"),
        (Reply(pieces=[sse({"text": "a"}), b"data: {"]), "STREAM_CUT", "mid-event"),
        (Reply(pieces=[sse({"text": "a"}), b"data: x"], cut_after=2), "STREAM_CUT", "stream cut"),
        (Reply(pieces=[sse({"text": "a"}), b"data"], reset_after=1), "STREAM_CUT", "stream cut"),
    ],
)
async def test_a_cut_stream_keeps_what_was_delivered(
    server: LoopbackServer, pool: ClientPool, reply: Reply, code: str, text: str
) -> None:
    server.push(reply)
    chunks = await pump(pool, server.url)
    assert chunks[0] == TextDelta(0, "a")
    failure = failure_of(chunks)
    assert failure.code == code
    assert text in failure.message


@pytest.mark.parametrize("bad", ['{"text": "b"', '{"no_text": 1}'])
async def test_a_malformed_frame_is_bad_stream_and_stops_the_pump(
    server: LoopbackServer, pool: ClientPool, bad: str
) -> None:
    decoder = Decoder()
    server.push(Reply.sse(sse({"text": "a"}, bad, {"text": "never"}, {"finish": "stop"})))
    chunks = await pump(pool, server.url, decoder=decoder)
    assert chunks[0] == TextDelta(0, "a")
    failure = failure_of(chunks)
    assert failure.code == "BAD_STREAM"
    assert "malformed frame" in failure.message
    assert bad[:10] in failure.message  # the frame is quoted
    assert len(chunks) == 2
    assert decoder.fed == ['{"text": "a"}', bad]  # nothing after the bad frame was fed


@pytest.mark.parametrize(
    ("reply", "code", "status", "retry_after", "text"),
    [
        (Reply.error(401, {"error": {"message": "bad key"}}), "AUTH", 401, None, "TEST_KEY"),
        (Reply.error(429, "slow down", headers=(("retry-after", "4"),)), "HTTP_429", 429, 4.0, ""),
        (
            Reply.error(503, {"error": "busy"}, headers=(("retry-after-ms", "250"),)),
            "HTTP_5XX",
            503,
            0.25,
            "busy",
        ),
        (Reply.error(529, {"error": {"message": "overloaded"}}), "HTTP_5XX", 529, None, ""),
        (Reply.error(404, {"error": {"message": "no model"}}), "HTTP_4XX", 404, None, "no model"),
        (Reply.error(500, "x" * 200_000), "HTTP_5XX", 500, None, "x" * 100),
    ],
)
async def test_error_statuses_on_the_wire(
    server: LoopbackServer,
    pool: ClientPool,
    reply: Reply,
    code: str,
    status: int,
    retry_after: float | None,
    text: str,
) -> None:
    server.push(reply)
    failure = failure_of(await pump(pool, server.url))
    assert (failure.code, failure.status, failure.retry_after) == (code, status, retry_after)
    assert text in failure.message
    assert len(failure.message) < 700  # a huge error body is cut


async def test_a_200_that_is_not_an_event_stream_is_bad_stream(
    server: LoopbackServer, pool: ClientPool
) -> None:
    server.push(
        Reply(pieces=[b'{"error": "gateway page"}'], headers=(("content-type", "text/html"),))
    )
    server.push(Reply(pieces=[b"{}"], headers=()))
    first = failure_of(await pump(pool, server.url))
    assert (first.code, first.status) == ("BAD_STREAM", 200)
    assert "got text/html: gateway page" in first.message
    second = failure_of(await pump(pool, server.url))
    assert "no content type" in second.message


async def test_connection_failures_before_the_response(
    server: LoopbackServer, pool: ClientPool
) -> None:
    refused = failure_of(await pump(pool, refused_url()))
    assert refused.code == "CONNECTION"
    server.push(Reply(reset_before_head=True))
    reset = failure_of(await pump(pool, server.url))
    assert reset.code == "CONNECTION"
    assert not reset.message.startswith("stream cut")


async def test_a_hanging_body_times_out_on_the_read_timeout(
    server: LoopbackServer, autojump_clock: trio.testing.MockClock
) -> None:
    pool = ClientPool(headers=None, timeout=(1.0, 20.0), transport=None)
    server.push(Reply.sse(sse({"text": "a"}), hang_after=1))
    start = trio.current_time()
    chunks = await pump(pool, server.url)
    elapsed = trio.current_time() - start
    await pool.aclose()
    assert chunks[0] == TextDelta(0, "a")
    assert failure_of(chunks).code == "TIMEOUT"
    assert 20.0 <= elapsed < 21.0  # the read timeout, not the connect timeout
    while server.hung_up == 0:  # virtual time: the server sees the client's close
        await trio.sleep(0.001)
    assert server.hung_up == 1  # the timed-out response was closed


async def test_a_consumer_stopping_early_closes_the_response(
    server: LoopbackServer, pool: ClientPool
) -> None:
    server.push(Reply.sse(sse({"text": "a"}), hang_after=1))
    stream = post_stream(pool, server.url + "/s", {}, auth={}, decoder=Decoder(), key_env=None)
    async with aclosing(stream) as chunks:
        assert await anext(chunks) == TextDelta(0, "a")
    with trio.fail_after(5):  # a bound, not a measurement
        while server.hung_up == 0:
            await trio.lowlevel.checkpoint()  # the server sees the client's close
    assert server.hung_up == 1


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (
            400,
            {
                "error": {
                    "message": "This model's maximum context length is 65536 tokens. However, "
                    "you requested 70000 tokens. Please reduce the length of the messages.",
                    "type": "invalid_request_error",
                }
            },
        ),
        (400, {"error": {"message": "too long", "code": "context_length_exceeded"}}),
        (
            400,
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 208310 tokens > 200000 maximum",
                },
            },
        ),
        (413, "request exceeds the model's context window"),
    ],
)
def test_a_context_overflow_answer_is_its_own_code(status: int, body: Any) -> None:
    raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    failure = status_failure(status, httpx.Headers(), raw, key_env=None)
    assert failure.code == "CONTEXT_OVERFLOW"
    assert failure.status == status


def test_other_client_errors_stay_http_4xx() -> None:
    raw = json.dumps({"error": {"message": "Invalid value for temperature"}}).encode()
    assert status_failure(400, httpx.Headers(), raw, key_env=None).code == "HTTP_4XX"
    overflowish = json.dumps({"error": {"message": "context window"}}).encode()
    assert status_failure(500, httpx.Headers(), overflowish, key_env=None).code == "HTTP_5XX"


# --- stream limits --------------------------------------------------------------------------


@final
class CountingTransport(httpx.AsyncBaseTransport):
    """A real HTTP transport that counts the response body bytes the client pulled."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.read = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_Counted(response, self),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


@final
class _Counted(httpx.AsyncByteStream):
    def __init__(self, response: httpx.Response, owner: CountingTransport) -> None:
        self.response = response
        self.owner = owner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for piece in self.response.stream:  # type: ignore[union-attr]
            self.owner.read += len(piece)
            yield piece

    async def aclose(self) -> None:
        await self.response.aclose()


NETWORK_READ = 65_536
"""The most one read of the body can deliver (httpcore's read size)."""


async def test_a_newline_less_flood_is_refused_after_at_most_cap_plus_one_read(
    server: LoopbackServer,
) -> None:
    transport = CountingTransport()
    pool = ClientPool(headers=None, timeout=(5.0, 5.0), transport=transport)
    cap = 256 * 1024
    server.push(Reply(pieces=[b"data: " + b"x" * 65_530] + [b"x" * 65_536] * 400))  # 26 MB
    with trio.fail_after(30):  # a bound on a hang, not a measurement
        chunks = await pump(pool, server.url, limits=StreamLimits(max_line_bytes=cap))
    await pool.aclose()
    failure = failure_of(chunks)
    assert chunks == [Finish("error", failure=failure)]
    assert failure.code == "BAD_STREAM"
    assert failure.message == f"stream limit: an SSE line is longer than max_line_bytes ({cap})"
    assert cap < transport.read <= cap + NETWORK_READ


async def test_a_huge_event_of_short_lines_is_refused(server: LoopbackServer) -> None:
    transport = CountingTransport()
    pool = ClientPool(headers=None, timeout=(5.0, 5.0), transport=transport)
    cap = 100_000
    line = b"data: " + b"x" * 94 + b"\n"  # 101 bytes on the wire, 95 of the event's data
    server.push(Reply.sse(sse({"text": "a"}) + line * 20_000, piece=4096))
    limits = StreamLimits(max_line_bytes=1000, max_event_bytes=cap)
    chunks = await pump(pool, server.url, limits=limits)
    await pool.aclose()
    assert chunks[0] == TextDelta(0, "a")
    failure = failure_of(chunks)
    assert failure.code == "BAD_STREAM"
    assert "max_event_bytes (100000)" in failure.message
    crossing = (cap // 95 + 1) * len(line) + len(sse({"text": "a"}))
    assert transport.read <= crossing + NETWORK_READ


async def test_streamed_output_past_its_cap_is_bad_stream(
    server: LoopbackServer, pool: ClientPool
) -> None:
    frames = [{"text": "x" * 100}, {"reasoning": "r" * 100}, {"args": "a" * 100}] * 10
    server.push(Reply.sse(sse(*frames, {"finish": "stop"}, "[DONE]")))
    chunks = await pump(pool, server.url, limits=StreamLimits(max_output_chars=1000))
    delivered = chunks[:-1]
    assert len(delivered) == 10  # text, reasoning and arguments all count: 10 x 100 = the cap
    assert {type(c) for c in delivered} == {TextDelta, ReasoningDelta, ToolCallDelta}
    failure = failure_of(chunks)
    assert failure.code == "BAD_STREAM"
    assert "max_output_chars (1000)" in failure.message
    # at the cap exactly, the stream completes
    server.push(Reply.sse(sse(*frames[:10], {"finish": "stop"}, "[DONE]")))
    chunks = await pump(pool, server.url, limits=StreamLimits(max_output_chars=1000))
    assert chunks[-1] == Finish("stop")


KEEPALIVE = b": keep-alive\n\n"


async def test_keep_alives_alone_end_in_the_idle_timeout(
    server: LoopbackServer, autojump_clock: trio.testing.MockClock
) -> None:
    pool = ClientPool(headers=None, timeout=(1.0, 20.0), transport=None)
    # Every 5 s a keep-alive comment, a blank line or an empty frame: the read timeout (20 s)
    # never fires, and none of them is progress.
    noise = [KEEPALIVE, b"\n", sse({})] * 400
    server.push(Reply(pieces=[sse({"text": "a"}), *noise], piece_delay=5.0))
    start = trio.current_time()
    chunks = await pump(pool, server.url, limits=StreamLimits(idle_timeout=60.0))
    elapsed = trio.current_time() - start
    await pool.aclose()
    assert chunks[0] == TextDelta(0, "a")
    failure = failure_of(chunks)
    assert failure.code == "TIMEOUT"
    assert failure.message.startswith("idle timeout (60 s) expired")
    assert 60.0 <= elapsed < 61.0  # virtual time: 60 s after the last chunk, not 6,000 s


async def test_progress_restarts_the_idle_timeout(
    server: LoopbackServer, autojump_clock: trio.testing.MockClock
) -> None:
    pool = ClientPool(headers=None, timeout=(1.0, 20.0), transport=None)
    pieces = []
    for n in range(6):  # a chunk every 50 s, keep-alives between: 300 s in all
        pieces += [sse({"text": str(n)}), *([KEEPALIVE] * 4)]
    server.push(Reply(pieces=[*pieces, sse({"finish": "stop"}, "[DONE]")], piece_delay=10.0))
    chunks = await pump(pool, server.url, limits=StreamLimits(idle_timeout=60.0))
    await pool.aclose()
    assert chunks == [*(TextDelta(0, str(n)) for n in range(6)), Finish("stop")]


async def test_the_idle_timeout_defaults_to_the_read_timeout() -> None:
    from dsh_agent_loop.llm._http import resolve_limits

    assert resolve_limits(None, 42.0).idle_timeout == 42.0
    assert resolve_limits(None, None).idle_timeout == 300.0
    assert resolve_limits(StreamLimits(idle_timeout=5), 42.0).idle_timeout == 5
    assert resolve_limits(StreamLimits(max_line_bytes=9), 7.0) == StreamLimits(
        max_line_bytes=9, idle_timeout=7.0
    )
