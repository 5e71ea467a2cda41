"""Unit tests of ``llm/_openai_stream.py``: the chat-completion frame decoder on its own.

The adapter-level tests (``test_openai.py``, ``test_faults.py``) drive the decoder through a
loopback server; these feed it frames directly and pin each normalisation rule.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

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
from dsh_agent_loop.llm._openai_stream import OpenAIStreamDecoder
from dsh_agent_loop.llm._sse import SSEEvent, SSEParser

from .server import assemble, transcript

DONE = SSEEvent("[DONE]")


def frame(
    delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A ``chat.completion.chunk`` frame with one choice."""
    choice: dict[str, Any] = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return {"object": "chat.completion.chunk", "choices": [choice], **extra}


def call(
    index: int | None,
    arguments: Any = None,
    *,
    call_id: str | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """One ``tool_calls`` entry (fields left out when None)."""
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    entry: dict[str, Any] = {"type": "function", "function": function}
    if index is not None:
        entry["index"] = index
    if call_id is not None:
        entry["id"] = call_id
    return entry


def feed(decoder: OpenAIStreamDecoder, *frames: dict[str, Any] | SSEEvent) -> list[Chunk]:
    """The chunks for ``frames`` (dicts are sent as ``data:`` JSON, events as they are)."""
    out: list[Chunk] = []
    for item in frames:
        event = item if isinstance(item, SSEEvent) else SSEEvent(json.dumps(item))
        out += decoder.feed(event)
    return out


# --- text and reasoning --------------------------------------------------------------------


def test_text_deltas_share_one_block_and_finish_after_usage() -> None:
    decoder = OpenAIStreamDecoder()
    usage = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    chunks = feed(
        decoder,
        frame({"role": "assistant", "content": ""}),
        frame({"content": "Hel"}),
        frame({"content": "lo"}),
        frame(finish="stop"),
    )
    assert chunks == [
        BlockStart(0, "text"),
        TextDelta(0, "Hel"),
        TextDelta(0, "lo"),
        BlockEnd(0),
    ]
    assert decoder.done is False
    assert feed(decoder, {"choices": [], "usage": usage}) == []
    assert feed(decoder, DONE) == [
        UsageChunk(Usage(input_tokens=7, output_tokens=2)),
        Finish("stop", stop_reason="stop"),
    ]
    assert decoder.done is True


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
def test_reasoning_then_text_are_two_blocks(key: str) -> None:
    decoder = OpenAIStreamDecoder()
    chunks = feed(
        decoder,
        frame({key: "Let me"}),
        frame({key: " think"}),
        frame({"content": "Answer"}),
        frame(finish="stop"),
    )
    assert chunks == [
        BlockStart(0, "reasoning"),
        ReasoningDelta(0, "Let me"),
        ReasoningDelta(0, " think"),
        BlockEnd(0),
        BlockStart(1, "text"),
        TextDelta(1, "Answer"),
        BlockEnd(1),
    ]


def test_reasoning_and_content_in_one_delta_reasoning_first() -> None:
    chunks = feed(OpenAIStreamDecoder(), frame({"reasoning_content": "r", "content": "t"}))
    assert chunks == [
        BlockStart(0, "reasoning"),
        ReasoningDelta(0, "r"),
        BlockEnd(0),
        BlockStart(1, "text"),
        TextDelta(1, "t"),
    ]


def test_role_only_null_and_empty_deltas_give_nothing() -> None:
    decoder = OpenAIStreamDecoder()
    chunks = feed(
        decoder,
        frame({"role": "assistant", "content": None, "refusal": None, "tool_calls": None}),
        frame({"content": ""}),
        frame({}),
        {"choices": []},
        {"id": "x"},
    )
    assert chunks == []
    assert decoder.end() == []  # no finish reason yet: the pump's STREAM_CUT


def test_list_valued_content_keeps_text_parts_and_skips_unknown_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    content = [
        {"type": "text", "text": "a"},
        {"type": "image_url", "image_url": {"url": "data:"}},
        {"type": "text", "text": "b"},
    ]
    decoder = OpenAIStreamDecoder()
    with caplog.at_level(logging.DEBUG, logger="dsh_agent_loop.llm._openai"):
        chunks = feed(decoder, frame({"content": content}))
    assert chunks == [BlockStart(0, "text"), TextDelta(0, "a"), TextDelta(0, "b")]
    assert ["image_url" in r.getMessage() for r in caplog.records] == [True]
    # a list with no text opens no block
    assert feed(decoder, frame({"content": [{"type": "image_url"}]})) == []


MAGISTRAL_THINKING = {"type": "thinking", "thinking": [{"type": "text", "text": "Let me see."}]}


def test_thinking_parts_are_reasoning_never_answer() -> None:
    """Magistral streams its reasoning as ``thinking`` parts of a list-valued ``content``."""
    decoder = OpenAIStreamDecoder()
    chunks = feed(
        decoder,
        frame({"role": "assistant", "content": [MAGISTRAL_THINKING]}),
        frame({"content": [{"type": "thinking", "thinking": [{"type": "text", "text": " Ok"}]}]}),
        frame({"content": [{"type": "text", "text": "42"}]}),
        frame({}, "stop"),
    )
    assert chunks == [
        BlockStart(0, "reasoning"),
        ReasoningDelta(0, "Let me see."),
        ReasoningDelta(0, " Ok"),
        BlockEnd(0),
        BlockStart(1, "text"),
        TextDelta(1, "42"),
        BlockEnd(1),
    ]
    assert assemble([*chunks, *decoder.end()]) == (
        {"type": "reasoning", "text": "Let me see. Ok"},
        {"type": "text", "text": "42"},
    )


def test_parts_of_one_delta_keep_their_order() -> None:
    """Thinking and text in one list stay in their own blocks, in the order they came."""
    decoder = OpenAIStreamDecoder()
    content = [
        {"type": "text", "text": "a"},
        {"type": "thinking", "thinking": "plain string thinking"},
        {"type": "thinking", "thinking": [{"type": "reference", "reference_ids": [1]}]},
        {"type": "text", "text": "b"},
    ]
    assert feed(decoder, frame({"content": content})) == [
        BlockStart(0, "text"),
        TextDelta(0, "a"),
        BlockEnd(0),
        BlockStart(1, "reasoning"),
        ReasoningDelta(1, "plain string thinking"),
        BlockEnd(1),
        BlockStart(2, "text"),
        TextDelta(2, "b"),
    ]


@pytest.mark.parametrize(
    "part",
    [
        {"type": "thinking"},
        {"type": "thinking", "thinking": 3},
        {"type": "thinking", "thinking": [{"type": "text", "text": None}]},
        {"type": "thinking", "thinking": ["text"]},
    ],
)
def test_a_thinking_part_that_cannot_be_read_is_malformed(part: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"thinking|part"):
        feed(OpenAIStreamDecoder(), frame({"content": [part]}))


# --- refusals -----------------------------------------------------------------------------


def test_refusal_is_text_and_turns_stop_into_refusal() -> None:
    decoder = OpenAIStreamDecoder()
    chunks = feed(
        decoder, frame({"refusal": "I can't"}), frame({"refusal": " help."}), frame(finish="stop")
    )
    assert chunks == [
        BlockStart(0, "text"),
        TextDelta(0, "I can't"),
        TextDelta(0, " help."),
        BlockEnd(0),
    ]
    assert decoder.end() == [Finish("stop", stop_reason="refusal")]


def test_refusal_is_kept_on_done_without_finish() -> None:
    decoder = OpenAIStreamDecoder()
    feed(decoder, frame({"refusal": "No."}))
    assert feed(decoder, DONE) == [BlockEnd(0), Finish("stop", stop_reason="refusal")]


def test_refusal_does_not_rename_another_finish_reason() -> None:
    decoder = OpenAIStreamDecoder()
    feed(decoder, frame({"refusal": "No"}), frame(finish="length"))
    assert decoder.end() == [Finish("max-tokens", stop_reason="length")]


# --- tool calls ---------------------------------------------------------------------------


def test_tool_call_fragments_are_assembled_across_frames() -> None:
    decoder = OpenAIStreamDecoder()
    chunks = feed(
        decoder,
        frame({"content": "Checking."}),
        frame({"tool_calls": [call(0, "", call_id="call_a", name="get_weather")]}),
        frame({"tool_calls": [call(0, '{"city":')]}),
        frame({"tool_calls": [call(0, '"Paris"}')]}),
        frame({"tool_calls": [call(1, '{"tz":"UTC"}', call_id="call_b", name="get_time")]}),
        frame(finish="tool_calls"),
        DONE,
    )
    assert chunks == [
        BlockStart(0, "text"),
        TextDelta(0, "Checking."),
        BlockEnd(0),  # an open text block ends when a call starts
        BlockStart(1, "tool-call", "call_a", "get_weather"),
        ToolCallDelta(1, '{"city":'),
        ToolCallDelta(1, '"Paris"}'),
        BlockStart(2, "tool-call", "call_b", "get_time"),
        ToolCallDelta(2, '{"tz":"UTC"}'),
        BlockEnd(1),
        BlockEnd(2),
        Finish("tool-calls", stop_reason="tool_calls"),
    ]


def test_interleaved_parallel_fragments_go_to_their_own_blocks() -> None:
    decoder = OpenAIStreamDecoder()
    chunks = feed(
        decoder,
        frame(
            {"tool_calls": [call(0, "", call_id="a", name="f"), call(1, "", call_id="b", name="g")]}
        ),
        frame({"tool_calls": [call(1, '{"y"'), call(0, '{"x"')]}),
        frame({"tool_calls": [call(0, ":1}"), call(1, ":2}")]}),
    )
    deltas: dict[int, str] = {}
    for chunk in chunks:
        if isinstance(chunk, ToolCallDelta):
            deltas[chunk.index] = deltas.get(chunk.index, "") + chunk.arguments
    assert deltas == {0: '{"x":1}', 1: '{"y":2}'}


def test_text_after_a_call_opens_a_new_block_and_leaves_the_call_open() -> None:
    decoder = OpenAIStreamDecoder()
    chunks = feed(
        decoder,
        frame({"tool_calls": [call(0, "{}", call_id="a", name="f")]}),
        frame({"content": "more"}),
        frame(finish="tool_calls"),
    )
    assert chunks == [
        BlockStart(0, "tool-call", "a", "f"),
        ToolCallDelta(0, "{}"),
        BlockStart(1, "text"),
        TextDelta(1, "more"),
        BlockEnd(1),
        BlockEnd(0),
    ]


def test_id_and_name_arriving_late_restate_the_block_start() -> None:
    decoder = OpenAIStreamDecoder()
    chunks = feed(
        decoder,
        frame({"tool_calls": [call(0, '{"a"')]}),
        frame({"tool_calls": [call(0, ":1}", call_id="call_x")]}),
        frame({"tool_calls": [call(0, None, name="f")]}),
        frame({"tool_calls": [call(0, None, call_id="other", name="other")]}),  # no override
    )
    assert chunks == [
        BlockStart(0, "tool-call", None, None),
        ToolCallDelta(0, '{"a"'),
        BlockStart(0, "tool-call", "call_x", None),
        ToolCallDelta(0, ":1}"),
        BlockStart(0, "tool-call", "call_x", "f"),
    ]


def test_call_without_arguments_gets_an_empty_object_at_finish() -> None:
    decoder = OpenAIStreamDecoder()
    chunks = feed(
        decoder,
        frame({"tool_calls": [call(0, "", call_id="a", name="now")]}),
        frame(finish="tool_calls"),
    )
    assert chunks == [
        BlockStart(0, "tool-call", "a", "now"),
        ToolCallDelta(0, "{}"),
        BlockEnd(0),
    ]


def test_arguments_sent_as_an_object_are_serialised() -> None:
    decoder = OpenAIStreamDecoder()
    chunks = feed(decoder, frame({"tool_calls": [call(0, {"q": "café"}, call_id="a", name="s")]}))
    assert chunks[1] == ToolCallDelta(0, '{"q": "café"}')


def test_calls_without_index_are_whole_calls_one_per_id() -> None:
    decoder = OpenAIStreamDecoder()
    chunks = feed(
        decoder,
        frame(
            {
                "tool_calls": [
                    call(None, '{"a":1}', call_id="c1", name="f"),
                    call(None, '{"b":2}', call_id="c2", name="g"),
                ]
            }
        ),
        frame({"tool_calls": [call(None, '{"c":', call_id="c3", name="h")]}),  # a new call
        frame({"tool_calls": [call(None, "3}")]}),  # no id: continues the latest call
        frame(finish="stop"),  # Ollama reports "stop" after calls
    )
    assert chunks == [
        BlockStart(0, "tool-call", "c1", "f"),
        ToolCallDelta(0, '{"a":1}'),
        BlockStart(1, "tool-call", "c2", "g"),
        ToolCallDelta(1, '{"b":2}'),
        BlockStart(2, "tool-call", "c3", "h"),
        ToolCallDelta(2, '{"c":'),
        ToolCallDelta(2, "3}"),
        BlockEnd(0),
        BlockEnd(1),
        BlockEnd(2),
    ]
    assert decoder.end() == [Finish("tool-calls", stop_reason="stop")]


def test_length_ends_only_calls_whose_arguments_parse() -> None:
    decoder = OpenAIStreamDecoder()
    chunks = feed(
        decoder,
        frame({"tool_calls": [call(0, '{"a":1}', call_id="a", name="f")]}),
        frame({"tool_calls": [call(1, '{"b":', call_id="b", name="g")]}),
        frame({"tool_calls": [call(2, "", call_id="c", name="h")]}),
        frame(finish="length"),
    )
    ends = [c for c in chunks if isinstance(c, BlockEnd)]
    assert ends == [BlockEnd(0)]  # the cut call and the argument-less one stay open
    assert ToolCallDelta(2, "{}") not in chunks
    assert decoder.end() == [Finish("max-tokens", stop_reason="length")]


# --- finish reasons, [DONE] and usage -----------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "mapped"),
    [
        ("stop", "stop"),
        ("content_filter", "stop"),
        ("length", "max-tokens"),
        ("tool_calls", "tool-calls"),
        ("function_call", "tool-calls"),
        ("eos", "stop"),  # unknown reasons finish normally and are kept
    ],
)
def test_finish_reason_mapping(reason: str, mapped: str) -> None:
    decoder = OpenAIStreamDecoder()
    feed(decoder, frame({"content": "x"}), frame(finish=reason))
    assert decoder.end() == [Finish(mapped, stop_reason=reason)]  # type: ignore[arg-type]


def test_only_the_first_finish_reason_counts() -> None:
    decoder = OpenAIStreamDecoder()
    chunks = feed(decoder, frame({"content": "x"}), frame(finish="length"), frame(finish="stop"))
    assert chunks.count(BlockEnd(0)) == 1
    assert decoder.end() == [Finish("max-tokens", stop_reason="length")]


def test_overloaded_finish_reason_is_a_transient_error_without_usage() -> None:
    decoder = OpenAIStreamDecoder()
    feed(
        decoder,
        frame({"content": "par"}),
        frame(finish="insufficient_system_resource", usage={"prompt_tokens": 3}),
    )
    [finish] = feed(decoder, DONE)
    assert isinstance(finish, Finish)
    assert finish.reason == "error"
    assert finish.failure is not None
    assert finish.failure.code == "HTTP_5XX"
    assert "insufficient_system_resource" in finish.failure.message


def test_done_without_finish_after_content_completes_the_turn() -> None:
    decoder = OpenAIStreamDecoder()
    feed(decoder, frame({"content": "hi"}), {"choices": [], "usage": {"prompt_tokens": 1}})
    assert feed(decoder, DONE) == [
        BlockEnd(0),
        UsageChunk(Usage(input_tokens=1, output_tokens=0)),
        Finish("stop"),
    ]
    assert decoder.done is True


def test_done_without_finish_after_calls_completes_them() -> None:
    decoder = OpenAIStreamDecoder()
    feed(decoder, frame({"tool_calls": [call(0, "", call_id="a", name="f")]}))
    assert feed(decoder, DONE) == [ToolCallDelta(0, "{}"), BlockEnd(0), Finish("tool-calls")]


def test_done_before_anything_is_a_stream_cut() -> None:
    decoder = OpenAIStreamDecoder()
    feed(decoder, frame({"role": "assistant"}))
    [finish] = feed(decoder, DONE)
    assert isinstance(finish, Finish)
    assert finish.reason == "error"
    assert finish.failure is not None
    assert finish.failure.code == "STREAM_CUT"
    assert decoder.done is True


def test_end_without_done_gives_the_finish_if_one_arrived() -> None:
    decoder = OpenAIStreamDecoder()
    feed(decoder, frame({"content": "x"}))
    assert decoder.end() == []
    feed(decoder, frame(finish="stop"))
    assert decoder.done is False
    assert decoder.end() == [Finish("stop", stop_reason="stop")]


def test_usage_details_cached_and_reasoning_tokens() -> None:
    decoder = OpenAIStreamDecoder()
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 40,
        "prompt_tokens_details": {"cached_tokens": 64},
        "completion_tokens_details": {"reasoning_tokens": 30},
    }
    feed(decoder, frame({"content": "x"}, finish="stop", usage=usage))
    assert decoder.end()[0] == UsageChunk(
        Usage(input_tokens=100, output_tokens=40, cache_read_tokens=64, reasoning_tokens=30)
    )


def test_usage_deepseek_cache_hit_tokens_and_later_frames_replace_earlier() -> None:
    decoder = OpenAIStreamDecoder()
    feed(
        decoder,
        frame({"content": "x"}, usage={"prompt_tokens": 1, "completion_tokens": 1}),
        frame(finish="stop"),
        {"choices": [], "usage": {"prompt_tokens": 9, "prompt_cache_hit_tokens": 5}},
    )
    assert decoder.end()[0] == UsageChunk(
        Usage(input_tokens=9, output_tokens=0, cache_read_tokens=5)
    )


def test_only_the_first_choice_is_followed() -> None:
    decoder = OpenAIStreamDecoder()
    other = {"index": 1, "delta": {"content": "other"}, "finish_reason": "length"}
    assert feed(decoder, {"choices": [other]}) == []
    assert decoder.end() == []


# --- error frames and events --------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "code", "message"),
    [
        ({"error": {"message": "boom", "type": "server_error"}}, "PROVIDER_ERROR", "boom"),
        ({"error": {"message": "busy", "type": "overloaded_error"}}, "HTTP_5XX", "busy"),
        ({"error": {"code": "Overloaded"}}, "HTTP_5XX", '{"code": "Overloaded"}'),
        (
            {"object": "error", "message": "vllm says no", "type": "BadRequest"},
            "PROVIDER_ERROR",
            "vllm says no",
        ),
    ],
)
def test_error_frame_finishes_the_stream(payload: dict[str, Any], code: str, message: str) -> None:
    decoder = OpenAIStreamDecoder()
    feed(decoder, frame({"content": "x"}))
    assert feed(decoder, payload) == [Finish("error", failure=Failure(code, message))]
    assert decoder.done is True


@pytest.mark.parametrize(
    ("data", "code", "message"),
    [
        ('{"error": {"message": "quota", "type": "x"}}', "PROVIDER_ERROR", "quota"),
        ('{"message": "bare", "type": "overloaded"}', "HTTP_5XX", "bare"),
        ("upstream went away", "PROVIDER_ERROR", "upstream went away"),
    ],
)
def test_error_event_finishes_the_stream(data: str, code: str, message: str) -> None:
    decoder = OpenAIStreamDecoder()
    assert decoder.feed(SSEEvent(data, event="error")) == [
        Finish("error", failure=Failure(code, message))
    ]
    assert decoder.done is True


def test_unknown_event_types_are_ignored_even_if_unreadable() -> None:
    decoder = OpenAIStreamDecoder()
    assert decoder.feed(SSEEvent("not json", event="keepalive")) == []
    assert decoder.done is False


def test_feed_frame_takes_a_decoded_frame() -> None:
    decoder = OpenAIStreamDecoder()
    assert decoder.feed_frame(frame({"content": "x"})) == [BlockStart(0, "text"), TextDelta(0, "x")]


# --- unreadable frames (the pump's BAD_STREAM) ---------------------------------------------


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ("{not json", "Expecting"),
        ("[1, 2]", "frame is not a JSON object"),
        ('"text"', "frame is not a JSON object"),
    ],
)
def test_undecodable_data_raises(data: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        OpenAIStreamDecoder().feed(SSEEvent(data))


BAD_FRAMES: dict[str, tuple[dict[str, Any], str]] = {
    "choices not a list": ({"choices": {"0": {}}}, "choices is not a list"),
    "choice not an object": ({"choices": ["x"]}, "choices is not a list of objects"),
    "delta not an object": (frame("text"), "delta is not an object"),  # type: ignore[arg-type]
    "finish_reason not a string": (frame(finish=1), "finish_reason"),  # type: ignore[arg-type]
    "reasoning not a string": (frame({"reasoning_content": ["r"]}), "reasoning"),
    "content a number": (frame({"content": 5}), "neither a string nor a list"),
    "content part without type": (frame({"content": [{"text": "a"}]}), "with a type"),
    "content part not an object": (frame({"content": ["a"]}), "with a type"),
    "text part without text": (frame({"content": [{"type": "text"}]}), "no string text"),
    "refusal not a string": (frame({"refusal": {"r": 1}}), "refusal"),
    "tool_calls not a list": (frame({"tool_calls": {"index": 0}}), "tool_calls is not a list"),
    "tool call not an object": (frame({"tool_calls": ["x"]}), "entry is not an object"),
    "function not an object": (
        frame({"tool_calls": [{"index": 0, "function": "f"}]}),
        "function is not an object",
    ),
    "id not a string": (frame({"tool_calls": [call(0, call_id=7)]}), "id"),  # type: ignore[arg-type]
    "name not a string": (frame({"tool_calls": [call(0, name=["f"])]}), "name"),  # type: ignore[arg-type]
    "index not an integer": (frame({"tool_calls": [call("0", "{}")]}), "index"),  # type: ignore[arg-type]
    "arguments a list": (frame({"tool_calls": [call(0, ["{}"])]}), "arguments"),
    "usage not an object": ({"usage": [1]}, "usage is not an object"),
    "negative token count": ({"usage": {"prompt_tokens": -1}}, "token count"),
    "token count a string": ({"usage": {"completion_tokens": "3"}}, "token count"),
    "usage details not an object": (
        {"usage": {"prompt_tokens_details": 3}},
        "prompt_tokens_details",
    ),
}


@pytest.mark.parametrize("case", BAD_FRAMES)
def test_unreadable_frame_raises_value_error(case: str) -> None:
    payload, match = BAD_FRAMES[case]
    with pytest.raises(ValueError, match=match):
        OpenAIStreamDecoder().feed(SSEEvent(json.dumps(payload)))


# --- recorded transcripts -----------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "openai_text",
        "openai_parallel_tools",
        "deepseek_reasoner_tools",
        "deepseek_content_filter",
        "ollama_tool_crlf",
    ],
)
def test_recorded_streams_give_well_formed_blocks(name: str) -> None:
    parser = SSEParser()
    decoder = OpenAIStreamDecoder()
    chunks: list[Chunk] = []
    for event in parser.feed(transcript(name)):
        chunks += decoder.feed(event)
    assert decoder.done is True
    started = [c.index for c in chunks if isinstance(c, BlockStart)]
    ended = [c.index for c in chunks if isinstance(c, BlockEnd)]
    assert sorted(set(started)) == list(range(len(set(started))))  # dense block indices
    assert sorted(ended) == sorted(set(started))  # every block ends exactly once
    arguments: dict[int, str] = {}
    for chunk in chunks:
        if isinstance(chunk, ToolCallDelta):
            arguments[chunk.index] = arguments.get(chunk.index, "") + chunk.arguments
    for text in arguments.values():
        json.loads(text)
    finish = chunks[-1]
    assert isinstance(finish, Finish)
    assert finish.failure is None
    assert (finish.reason == "tool-calls") == bool(arguments)


def test_the_finish_carries_the_first_reported_model_and_id() -> None:
    decoder = OpenAIStreamDecoder()
    feed(decoder, frame({"content": "a"}, id=7, model=""))  # wrong type, empty: not kept
    feed(decoder, frame({"content": "b"}, id="chatcmpl-1", model="gpt-4o-2024-08-06"))
    feed(decoder, frame({}, "stop", id="chatcmpl-2", model="other"))
    (finish,) = decoder.end()
    assert isinstance(finish, Finish)
    assert (finish.model, finish.response_id) == ("gpt-4o-2024-08-06", "chatcmpl-1")
    assert finish == Finish("stop", stop_reason="stop")  # not part of equality
    bare = OpenAIStreamDecoder()
    feed(bare, frame({"content": "a"}), frame({}, "stop"))
    (finish,) = bare.end()
    assert isinstance(finish, Finish)
    assert (finish.model, finish.response_id) == (None, None)
