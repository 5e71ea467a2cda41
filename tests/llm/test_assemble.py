"""The chunk assembler (``llm/_assemble.py``): the delivered prefix, and cut tool calls dropped."""

from __future__ import annotations

import gc
from collections.abc import Iterable

import pytest

from dsh_agent_loop.llm._assemble import FOLD_CHUNK, Assembler
from dsh_agent_loop.llm._base import (
    BlockEnd,
    BlockStart,
    Chunk,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageChunk,
)


def fed(chunks: Iterable[Chunk]) -> Assembler:
    assembler = Assembler()
    for chunk in chunks:
        assembler.feed(chunk)
    return assembler


def call(index: int, call_id: str | None, name: str | None) -> BlockStart:
    return BlockStart(index, "tool-call", call_id=call_id, name=name)


def test_a_fresh_assembler_has_nothing():
    a = Assembler()
    assert a.content() == ()
    assert a.delivered_text() == ("", "")
    assert not a.delivered
    assert not a.has_cut_tool_call()
    assert (a.finish, a.usage) == (None, None)


def test_text_reasoning_and_calls_in_block_order():
    a = fed(
        [
            BlockStart(0, "reasoning"),
            ReasoningDelta(0, "let me "),
            ReasoningDelta(0, "see"),
            BlockEnd(0),
            TextDelta(1, "Hel"),
            TextDelta(1, "lo"),
            call(2, "c1", "read"),
            ToolCallDelta(2, '{"p":'),
            ToolCallDelta(2, "1}"),
            BlockEnd(2),
            UsageChunk(Usage(3, 4)),
            Finish("tool-calls"),
        ]
    )
    assert a.content() == (
        {"type": "reasoning", "text": "let me see"},
        {"type": "text", "text": "Hello"},
        {"type": "tool-call", "call_id": "c1", "name": "read", "arguments": '{"p":1}'},
    )
    assert a.delivered_text() == ("Hello", "let me see")
    assert a.usage == Usage(3, 4)
    assert a.finish == Finish("tool-calls")
    assert a.delivered


@pytest.mark.parametrize("finish", [Finish("max-tokens"), Finish("error"), None])
def test_an_unended_tool_call_is_cut_unless_the_stream_finished_normally(finish):
    chunks: list[Chunk] = [TextDelta(0, "partial"), call(1, "c1", "write"), ToolCallDelta(1, "{")]
    if finish is not None:
        chunks.append(finish)
    a = fed(chunks)
    assert a.has_cut_tool_call()
    assert a.content() == ({"type": "text", "text": "partial"},)


@pytest.mark.parametrize("reason", ["stop", "tool-calls"])
def test_a_normal_finish_completes_every_open_block(reason):
    a = fed([call(0, "c1", "write"), ToolCallDelta(0, "{}"), Finish(reason)])
    assert not a.has_cut_tool_call()
    assert a.content() == (
        {"type": "tool-call", "call_id": "c1", "name": "write", "arguments": "{}"},
    )


def test_a_call_without_a_name_is_dropped_and_one_without_an_id_is_numbered():
    a = fed(
        [
            call(0, None, None),
            ToolCallDelta(0, "{}"),
            BlockEnd(0),
            call(1, None, "read"),
            BlockEnd(1),
        ]
    )
    assert a.content() == (
        {"type": "tool-call", "call_id": "call-1", "name": "read", "arguments": ""},
    )


def test_arguments_before_their_start_still_join_the_call():
    a = fed([ToolCallDelta(0, '{"a"'), call(0, "c", "t"), ToolCallDelta(0, ":1}"), BlockEnd(0)])
    assert a.content() == (
        {"type": "tool-call", "call_id": "c", "name": "t", "arguments": '{"a":1}'},
    )


def test_empty_text_blocks_are_left_out_unless_they_carry_metadata():
    a = fed(
        [
            BlockStart(0, "text"),
            BlockEnd(0),
            BlockStart(1, "reasoning"),
            BlockEnd(1, metadata={"signature": "sig"}),
            BlockEnd(2),  # an end for a block never started
        ]
    )
    assert a.content() == ({"type": "reasoning", "text": "", "metadata": {"signature": "sig"}},)
    assert not a.delivered  # no content arrived


def test_delivered_is_set_by_content_and_by_a_tool_call_start():
    assert fed([TextDelta(0, "x")]).delivered
    assert fed([ReasoningDelta(0, "x")]).delivered
    assert fed([call(0, "c", "t")]).delivered
    assert not fed([BlockStart(0, "text"), UsageChunk(Usage())]).delivered


def test_fold_chunk_covers_every_chunk_type():
    assert set(FOLD_CHUNK) == {
        TextDelta,
        ReasoningDelta,
        ToolCallDelta,
        BlockStart,
        BlockEnd,
        UsageChunk,
        Finish,
    }


def test_the_assembler_and_its_blocks_are_not_gc_tracked_and_join_one_or_many_parts():
    asm = fed(
        [
            TextDelta(0, "alone"),
            call(1, "c1", "f"),
            ToolCallDelta(1, '{"a"'),
            ToolCallDelta(1, ": 1}"),
            ReasoningDelta(2, ""),
            ReasoningDelta(2, "then"),
            Finish("tool-calls"),
        ]
    )
    assert not gc.is_tracked(asm)
    assert not gc.is_tracked(asm._blocks)  # a dict of untracked blocks stays untracked
    assert [b["type"] for b in asm.content()] == ["text", "tool-call", "reasoning"]
    assert asm.content()[1]["arguments"] == '{"a": 1}'
    assert asm.delivered_text() == ("alone", "then")
