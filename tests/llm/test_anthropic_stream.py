"""Unit tests of ``llm/_anthropic_stream.py``: the Messages stream event decoder on its own.

The adapter-level tests (``test_anthropic.py``, ``test_faults.py``) drive the decoder through a
loopback server; these feed it events directly and pin each normalisation rule.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from dsh_agent_loop.llm._anthropic_stream import AnthropicStreamDecoder
from dsh_agent_loop.llm._base import (
    BlockEnd,
    BlockStart,
    Chunk,
    Failure,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)
from dsh_agent_loop.llm._sse import SSEEvent, SSEParser

from .server import transcript


def ev(kind: str, **fields: Any) -> SSEEvent:
    """An SSE event named ``kind`` whose data is ``{"type": kind, **fields}``."""
    return SSEEvent(json.dumps({"type": kind, **fields}), event=kind)


def start(index: int, block: dict[str, Any]) -> SSEEvent:
    return ev("content_block_start", index=index, content_block=block)


def delta(index: int, **body: Any) -> SSEEvent:
    return ev("content_block_delta", index=index, delta=body)


def stop(index: int) -> SSEEvent:
    return ev("content_block_stop", index=index)


def message_start(**usage: int) -> SSEEvent:
    return ev("message_start", message={"id": "msg_1", "role": "assistant", "usage": usage})


def message_delta(stop_reason: str | None = None, **usage: int) -> SSEEvent:
    return ev("message_delta", delta={"stop_reason": stop_reason}, usage=usage)


def feed(decoder: AnthropicStreamDecoder, *events: SSEEvent) -> list[Chunk]:
    out: list[Chunk] = []
    for event in events:
        out += decoder.feed(event)
    return out


def tool_use(call_id: str = "toolu_1", name: str = "search", **extra: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": {}, **extra}


# --- content blocks -----------------------------------------------------------------------


def test_text_block_with_initial_text_and_deltas() -> None:
    decoder = AnthropicStreamDecoder()
    chunks = feed(
        decoder,
        start(0, {"type": "text", "text": "He"}),
        delta(0, type="text_delta", text="llo"),
        delta(0, type="text_delta", text=""),  # empty: no chunk
        stop(0),
    )
    assert chunks == [BlockStart(0, "text"), TextDelta(0, "He"), TextDelta(0, "llo"), BlockEnd(0)]


def test_thinking_block_carries_the_accumulated_signature() -> None:
    decoder = AnthropicStreamDecoder()
    chunks = feed(
        decoder,
        start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, type="thinking_delta", thinking="Hmm"),
        delta(0, type="thinking_delta", thinking=""),
        delta(0, type="signature_delta", signature="Eq"),
        delta(0, type="signature_delta", signature="Qb=="),
        stop(0),
    )
    assert chunks == [
        BlockStart(0, "reasoning"),
        ReasoningDelta(0, "Hmm"),
        BlockEnd(0, {"signature": "EqQb=="}),
    ]


def test_thinking_with_text_and_signature_up_front() -> None:
    decoder = AnthropicStreamDecoder()
    chunks = feed(
        decoder,
        start(0, {"type": "thinking", "thinking": "All at once", "signature": "S"}),
        stop(0),
    )
    assert chunks == [
        BlockStart(0, "reasoning"),
        ReasoningDelta(0, "All at once"),
        BlockEnd(0, {"signature": "S"}),
    ]


def test_thinking_without_signature_ends_without_metadata() -> None:
    decoder = AnthropicStreamDecoder()
    chunks = feed(decoder, start(0, {"type": "thinking", "thinking": ""}), stop(0))
    assert chunks == [BlockStart(0, "reasoning"), BlockEnd(0)]


def test_redacted_thinking_keeps_its_data() -> None:
    decoder = AnthropicStreamDecoder()
    chunks = feed(decoder, start(0, {"type": "redacted_thinking", "data": "opaque=="}), stop(0))
    assert chunks == [BlockStart(0, "reasoning"), BlockEnd(0, {"redacted": "opaque=="})]


def test_tool_use_input_json_fragments() -> None:
    decoder = AnthropicStreamDecoder()
    chunks = feed(
        decoder,
        start(0, tool_use()),
        delta(0, type="input_json_delta", partial_json=""),
        delta(0, type="input_json_delta", partial_json='{"q": "tr'),
        delta(0, type="input_json_delta", partial_json='io"}'),
        stop(0),
    )
    assert chunks == [
        BlockStart(0, "tool-call", "toolu_1", "search"),
        ToolCallDelta(0, '{"q": "tr'),
        ToolCallDelta(0, 'io"}'),
        BlockEnd(0),
    ]


def test_tool_use_without_deltas_gets_an_empty_object() -> None:
    decoder = AnthropicStreamDecoder()
    chunks = feed(decoder, start(0, tool_use(name="now")), stop(0))
    assert chunks == [
        BlockStart(0, "tool-call", "toolu_1", "now"),
        ToolCallDelta(0, "{}"),
        BlockEnd(0),
    ]


def test_tool_use_with_whole_input_up_front() -> None:
    decoder = AnthropicStreamDecoder()
    chunks = feed(decoder, start(0, tool_use(input={"q": "café"})), stop(0))
    assert chunks == [
        BlockStart(0, "tool-call", "toolu_1", "search"),
        ToolCallDelta(0, '{"q": "café"}'),
        BlockEnd(0),
    ]


def test_tool_use_with_cut_arguments_is_left_open_at_its_stop() -> None:
    decoder = AnthropicStreamDecoder()
    chunks = feed(
        decoder,
        start(0, tool_use()),
        delta(0, type="input_json_delta", partial_json='{"q": "unfin'),
        stop(0),
        message_delta("max_tokens", output_tokens=5),
    )
    assert chunks == [
        BlockStart(0, "tool-call", "toolu_1", "search"),
        ToolCallDelta(0, '{"q": "unfin'),
    ]
    assert decoder.end() == [
        UsageChunk(Usage(input_tokens=0, output_tokens=5)),
        Finish("max-tokens", stop_reason="max_tokens"),
    ]


def test_blocks_are_renumbered_and_unsurfaced_blocks_skipped() -> None:
    decoder = AnthropicStreamDecoder()
    chunks = feed(
        decoder,
        start(0, {"type": "server_tool_use", "id": "srv", "name": "web_search"}),
        delta(0, type="input_json_delta", partial_json='{"query": "x"}'),
        stop(0),
        start(1, {"type": "web_search_tool_result", "content": []}),
        stop(1),
        start(2, {"type": "text", "text": ""}),
        delta(2, type="citations_delta", citation={"cited_text": "c"}),
        delta(2, type="text_delta", text="found"),
        delta(2, type="unknown_delta", text="ignored"),
        stop(2),
        start(3, tool_use()),
        stop(3),
    )
    assert chunks == [
        BlockStart(0, "text"),
        TextDelta(0, "found"),
        BlockEnd(0),
        BlockStart(1, "tool-call", "toolu_1", "search"),
        ToolCallDelta(1, "{}"),
        BlockEnd(1),
    ]


def test_delta_and_stop_for_an_unknown_index_are_ignored() -> None:
    decoder = AnthropicStreamDecoder()
    assert feed(decoder, delta(5, type="text_delta", text="x"), stop(5)) == []


def test_type_falls_back_to_the_event_name() -> None:
    decoder = AnthropicStreamDecoder()
    chunks = feed(
        decoder,
        SSEEvent(
            json.dumps({"index": 0, "content_block": {"type": "text"}}), "content_block_start"
        ),
        SSEEvent(
            json.dumps({"index": 0, "delta": {"type": "text_delta", "text": "x"}}),
            "content_block_delta",
        ),
    )
    assert chunks == [BlockStart(0, "text"), TextDelta(0, "x")]


def test_feed_frame_takes_a_decoded_frame_and_event_name() -> None:
    decoder = AnthropicStreamDecoder()
    assert decoder.feed_frame(
        {"index": 0, "content_block": {"type": "text"}}, "content_block_start"
    ) == [BlockStart(0, "text")]


# --- message events, usage and stop reasons -----------------------------------------------


def test_full_message_usage_and_finish() -> None:
    decoder = AnthropicStreamDecoder()
    chunks = feed(
        decoder,
        message_start(
            input_tokens=10,
            cache_read_input_tokens=100,
            cache_creation_input_tokens=5,
            output_tokens=1,
        ),
        ev("ping"),
        start(0, {"type": "text", "text": ""}),
        delta(0, type="text_delta", text="Hi"),
        stop(0),
        message_delta("end_turn", output_tokens=12),
    )
    assert decoder.done is False
    assert chunks == [BlockStart(0, "text"), TextDelta(0, "Hi"), BlockEnd(0)]
    assert feed(decoder, ev("message_stop")) == [
        UsageChunk(Usage(input_tokens=115, output_tokens=12, cache_read_tokens=100)),
        Finish("stop", stop_reason="end_turn"),
    ]
    assert decoder.done is True


def test_message_delta_usage_with_input_counts_replaces_them() -> None:
    decoder = AnthropicStreamDecoder()
    feed(
        decoder,
        message_start(input_tokens=10, cache_read_input_tokens=4, output_tokens=1),
        message_delta("end_turn", input_tokens=20, output_tokens=3),
    )
    assert decoder.end()[0] == UsageChunk(
        Usage(input_tokens=20, output_tokens=3, cache_read_tokens=4)
    )


def test_message_delta_without_usage_keeps_the_start_usage() -> None:
    decoder = AnthropicStreamDecoder()
    feed(
        decoder,
        message_start(input_tokens=8, output_tokens=2),
        ev("message_delta", delta={"stop_reason": "end_turn"}),
    )
    assert decoder.end()[0] == UsageChunk(Usage(input_tokens=8, output_tokens=2))


def test_finish_without_any_usage_is_alone() -> None:
    decoder = AnthropicStreamDecoder()
    feed(decoder, ev("message_delta", delta={"stop_reason": "end_turn"}))
    assert decoder.end() == [Finish("stop", stop_reason="end_turn")]


@pytest.mark.parametrize(
    ("reason", "mapped"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("refusal", "stop"),
        ("pause_turn", "stop"),
        ("tool_use", "tool-calls"),
        ("max_tokens", "max-tokens"),
        ("model_context_window_exceeded", "max-tokens"),
        ("something_new", "stop"),
    ],
)
def test_stop_reason_mapping(reason: str, mapped: str) -> None:
    decoder = AnthropicStreamDecoder()
    feed(decoder, message_delta(reason))  # an empty usage object leaves usage unknown
    assert decoder.end() == [Finish(mapped, stop_reason=reason)]  # type: ignore[arg-type]


def test_only_the_first_stop_reason_counts() -> None:
    decoder = AnthropicStreamDecoder()
    feed(decoder, message_delta("tool_use"), message_delta("end_turn"), message_delta(None))
    assert decoder.end()[-1] == Finish("tool-calls", stop_reason="tool_use")


def test_message_delta_with_null_delta_only_updates_usage() -> None:
    decoder = AnthropicStreamDecoder()
    assert feed(decoder, ev("message_delta", delta=None, usage={"output_tokens": 4})) == []
    assert decoder.end() == []


def test_message_stop_without_stop_reason_is_a_stream_cut() -> None:
    decoder = AnthropicStreamDecoder()
    feed(decoder, message_start(input_tokens=1), start(0, {"type": "text"}))
    [finish] = feed(decoder, ev("message_stop"))
    assert isinstance(finish, Finish)
    assert finish.reason == "error"
    assert finish.failure is not None
    assert finish.failure.code == "STREAM_CUT"
    assert decoder.done is True


def test_end_before_a_stop_reason_gives_nothing() -> None:
    decoder = AnthropicStreamDecoder()
    feed(decoder, message_start(input_tokens=1), start(0, {"type": "text", "text": "x"}))
    assert decoder.end() == []  # the pump's STREAM_CUT
    assert decoder.done is False


def test_ping_and_unknown_events_are_ignored() -> None:
    decoder = AnthropicStreamDecoder()
    assert feed(decoder, ev("ping"), ev("vendor_extension", payload=[1])) == []
    assert decoder.done is False


# --- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "code", "message"),
    [
        ({"type": "overloaded_error", "message": "Overloaded"}, "HTTP_5XX", "Overloaded"),
        ({"type": "api_error", "message": "Internal"}, "PROVIDER_ERROR", "Internal"),
        ({"type": "rate_limit_error"}, "PROVIDER_ERROR", "rate_limit_error"),
    ],
)
def test_error_event_finishes_the_stream(error: dict[str, Any], code: str, message: str) -> None:
    decoder = AnthropicStreamDecoder()
    feed(decoder, message_start(input_tokens=1), message_delta("end_turn"))
    assert feed(decoder, ev("error", error=error)) == [
        Finish("error", failure=Failure(code, message))
    ]
    assert decoder.done is True


def test_error_frame_under_another_event_name() -> None:
    decoder = AnthropicStreamDecoder()
    error = {"type": "overloaded_error", "message": "busy"}
    assert decoder.feed(SSEEvent(json.dumps({"type": "error", "error": error}))) == [
        Finish("error", failure=Failure("HTTP_5XX", "busy"))
    ]
    assert decoder.done is True


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("upstream connect error", "upstream connect error"),  # proxies send text
        ('{"message": "bare error object"}', "bare error object"),
        ("not { json", "not { json"),
    ],
)
def test_error_event_with_unusual_data(data: str, message: str) -> None:
    decoder = AnthropicStreamDecoder()
    assert decoder.feed(SSEEvent(data, event="error")) == [
        Finish("error", failure=Failure("PROVIDER_ERROR", message))
    ]
    assert decoder.done is True


# --- unreadable events (the pump's BAD_STREAM) --------------------------------------------


@pytest.mark.parametrize(
    ("data", "match"), [("{oops", "Expecting"), ("[]", "not a JSON object"), ("3", "not a JSON")]
)
def test_undecodable_data_raises(data: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AnthropicStreamDecoder().feed(SSEEvent(data, event="content_block_delta"))


TEXT0 = start(0, {"type": "text"})
TOOL0 = start(0, tool_use())
THINK0 = start(0, {"type": "thinking"})

BAD_EVENTS: dict[str, tuple[list[SSEEvent], str]] = {
    "start index not an int": (
        [ev("content_block_start", index="0", content_block={"type": "text"})],
        "index",
    ),
    "start index missing": ([ev("content_block_start", content_block={"type": "text"})], "index"),
    "content_block not an object": (
        [ev("content_block_start", index=0, content_block="text")],
        "content_block",
    ),
    "initial text not a string": ([start(0, {"type": "text", "text": 1})], "text"),
    "initial thinking not a string": ([start(0, {"type": "thinking", "thinking": []})], "thinking"),
    "signature not a string": ([start(0, {"type": "thinking", "signature": 5})], "signature"),
    "redacted data not a string": ([start(0, {"type": "redacted_thinking", "data": {}})], "data"),
    "tool id missing": ([start(0, {"type": "tool_use", "name": "f"})], "id"),
    "tool name not a string": ([start(0, {**tool_use(), "name": None})], "name"),
    "tool input a list": ([start(0, tool_use(input=[1]))], "input"),
    "delta index not an int": ([TEXT0, ev("content_block_delta", index=0.0, delta={})], "index"),
    "delta not an object": ([TEXT0, ev("content_block_delta", index=0, delta="x")], "delta"),
    "text_delta without text": ([TEXT0, delta(0, type="text_delta")], "text"),
    "partial_json not a string": (
        [TOOL0, delta(0, type="input_json_delta", partial_json={})],
        "partial_json",
    ),
    "thinking not a string": ([THINK0, delta(0, type="thinking_delta", thinking=1)], "thinking"),
    "signature_delta not a string": ([THINK0, delta(0, type="signature_delta")], "signature"),
    "stop index not an int": ([TEXT0, ev("content_block_stop", index=None)], "index"),
    "message not an object": ([ev("message_start", message=[])], "message"),
    "usage not an object": ([ev("message_start", message={"usage": 3})], "usage"),
    "negative tokens": ([message_start(input_tokens=-1)], "token count"),
    "delta usage a string count": (
        [ev("message_delta", usage={"output_tokens": "2"})],
        "token count",
    ),
    "message_delta delta not an object": ([ev("message_delta", delta=["end_turn"])], "delta"),
    "stop_reason not a string": ([message_delta(3)], "stop_reason"),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("case", BAD_EVENTS)
def test_unreadable_event_raises_value_error(case: str) -> None:
    events, match = BAD_EVENTS[case]
    decoder = AnthropicStreamDecoder()
    *before, last = events
    feed(decoder, *before)
    with pytest.raises(ValueError, match=match):
        decoder.feed(last)


# --- recorded transcripts -----------------------------------------------------------------


def _decode(name: str) -> tuple[AnthropicStreamDecoder, list[Chunk]]:
    decoder = AnthropicStreamDecoder()
    chunks: list[Chunk] = []
    for event in SSEParser().feed(transcript(name)):
        if not decoder.done:
            chunks += decoder.feed(event)
    return decoder, chunks


def test_recorded_thinking_and_tools_stream() -> None:
    decoder, chunks = _decode("anthropic_thinking_tools")
    assert decoder.done is True
    starts = [c for c in chunks if isinstance(c, BlockStart)]
    assert [(s.index, s.kind) for s in starts] == [
        (0, "reasoning"),
        (1, "text"),
        (2, "tool-call"),
        (3, "tool-call"),
    ]
    ends = {c.index: c for c in chunks if isinstance(c, BlockEnd)}
    assert sorted(ends) == [0, 1, 2, 3]
    assert ends[0].metadata is not None
    assert ends[0].metadata["signature"].startswith("EqQB")
    arguments = {2: "", 3: ""}
    for chunk in chunks:
        if isinstance(chunk, ToolCallDelta):
            arguments[chunk.index] += chunk.arguments
    assert json.loads(arguments[2]) == {"city": "San Francisco", "unit": "f"}
    assert json.loads(arguments[3]) == {"city": "New York"}
    usage, finish = chunks[-2:]
    assert isinstance(usage, UsageChunk)
    assert usage.usage.input_tokens == 480 + 1024
    assert usage.usage.cache_read_tokens == 1024
    assert finish == Finish("tool-calls", stop_reason="tool_use")


def test_recorded_overloaded_stream_ends_in_a_transient_error() -> None:
    decoder, chunks = _decode("anthropic_overloaded")
    assert decoder.done is True
    finish = chunks[-1]
    assert isinstance(finish, Finish)
    assert finish.failure is not None
    assert finish.failure.code == "HTTP_5XX"


def test_the_finish_carries_the_message_model_and_id() -> None:
    decoder = AnthropicStreamDecoder()
    message = {"id": "msg_01", "model": "claude-x", "role": "assistant", "usage": {}}
    feed(decoder, ev("message_start", message=message), message_delta("end_turn"))
    (finish,) = decoder.end()[-1:]
    assert isinstance(finish, Finish)
    assert (finish.model, finish.response_id) == ("claude-x", "msg_01")
    odd = AnthropicStreamDecoder()
    message = {"id": 5, "model": None, "role": "assistant", "usage": {}}
    feed(odd, ev("message_start", message=message), message_delta("end_turn"))
    (finish,) = odd.end()[-1:]
    assert isinstance(finish, Finish)
    assert (finish.model, finish.response_id) == (None, None)  # wrong types are ignored
