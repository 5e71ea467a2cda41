"""Assembles an attempt's chunks into assistant content blocks (sans-I/O).

Rules (docs/design.md#streaming): the *delivered prefix* is what arrived before the stream stopped.
Text and
reasoning blocks keep whatever text they received. A tool call is kept only when complete: its
``block-end`` arrived, or the stream finished normally (``stop``/``tool-calls``), which completes
every open block. On ``max-tokens`` or a cancel, an unended tool call is dropped ("cut").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, final

from msgspec import Struct, field

from .._frozen import FrozenDict, freeze, from_shape, shape
from ._base import (
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

__all__ = ["FOLD_CHUNK", "Assembler"]


class _Block(Struct, gc=False, eq=False):
    """One content block as it arrives (not GC-tracked: it holds only strings and JSON)."""

    kind: str
    call_id: str | None = None
    name: str | None = None
    parts: str | list[str] = ""
    """What arrived: the only part as is, a list from the second on (a tool call's block
    waits for its arguments with no container allocated); ``joined()`` is the text."""
    ended: bool = False
    metadata: Any = None

    def joined(self) -> str:
        """Everything that arrived, concatenated."""
        parts = self.parts
        return parts if isinstance(parts, str) else "".join(parts)


def _add(block: _Block, part: str) -> None:
    parts = block.parts
    if isinstance(parts, list):
        parts.append(part)
    elif parts:
        block.parts = [parts, part]
    else:
        block.parts = part


@final
class Assembler(Struct, gc=False, eq=False):
    """Folds chunks; ``content()`` returns the blocks of the assistant message.

    Not GC-tracked (a ``msgspec.Struct`` declared ``gc=False``, as are its blocks): with
    thousands of agents mid-stream, what a stream holds outlives many collections of the young
    generations, and an assembler refers only to chunks and strings, never back to its owner.
    """

    _blocks: dict[int, _Block] = field(default_factory=dict)
    """By chunk index, in the order the blocks started (what ``content()`` keeps)."""
    finish: Finish | None = None
    usage: Usage | None = None
    delivered: bool = False
    """True once any text, reasoning or tool-call content arrived."""

    def _block(self, index: int, kind: str) -> _Block:
        block = self._blocks.get(index)
        if block is None:
            block = _Block(kind)
            self._blocks[index] = block
        return block

    def feed(self, chunk: Chunk) -> None:
        """Fold one chunk."""
        FOLD_CHUNK[type(chunk)](self, chunk)

    def _text(self, chunk: TextDelta) -> None:
        _add(self._block(chunk.index, "text"), chunk.text)
        self.delivered = True

    def _reasoning(self, chunk: ReasoningDelta) -> None:
        _add(self._block(chunk.index, "reasoning"), chunk.text)
        self.delivered = True

    def _arguments(self, chunk: ToolCallDelta) -> None:
        block = self._blocks.get(chunk.index) or self._block(chunk.index, "tool-call")
        _add(block, chunk.arguments)
        self.delivered = True

    def _start(self, chunk: BlockStart) -> None:
        block = self._block(chunk.index, chunk.kind)
        block.kind = chunk.kind
        if chunk.call_id is not None:
            block.call_id = chunk.call_id
        if chunk.name is not None:
            block.name = chunk.name
        if chunk.kind == "tool-call":
            self.delivered = True

    def _end(self, chunk: BlockEnd) -> None:
        block = self._blocks.get(chunk.index) or self._block(chunk.index, "text")
        block.ended = True
        if chunk.metadata:
            block.metadata = chunk.metadata

    def _usage(self, chunk: UsageChunk) -> None:
        self.usage = chunk.usage

    def _finish(self, chunk: Finish) -> None:
        self.finish = chunk
        if chunk.reason in ("stop", "tool-calls"):
            for block in self._blocks.values():
                block.ended = True

    def delivered_text(self) -> tuple[str, str]:
        """All delivered (text, reasoning), concatenated across blocks."""
        text: list[str] = []
        reasoning: list[str] = []
        for block in self._blocks.values():
            if block.kind == "text":
                text.append(block.joined())
            elif block.kind == "reasoning":
                reasoning.append(block.joined())
        return "".join(text), "".join(reasoning)

    def has_cut_tool_call(self) -> bool:
        """True when a tool-call block started but never completed."""
        return any(b.kind == "tool-call" and not b.ended for b in self._blocks.values())

    def content(self) -> tuple[FrozenDict, ...]:
        """The message blocks: text/reasoning as delivered, complete tool calls only."""
        out: list[FrozenDict] = []
        for index, block in self._blocks.items():
            if block.kind == "tool-call":
                if not block.ended or not block.name:
                    continue
                call_id = block.call_id or f"call-{index}"
                values = ("tool-call", call_id, block.name, block.joined())
                out.append(from_shape(_TOOL_CALL_BLOCK, values))
                continue
            text = block.joined()
            if not text and block.metadata is None:
                continue
            if block.metadata is not None:
                out.append(FrozenDict(type=block.kind, text=text, metadata=freeze(block.metadata)))
            else:
                out.append(from_shape(_TEXT_BLOCK, (block.kind, text)))
        return tuple(out)


# The shapes of the blocks ``Assembler.content`` builds (``from_shape``: one C call each).
_TOOL_CALL_BLOCK = shape(("type", "call_id", "name", "arguments"))
_TEXT_BLOCK = shape(("type", "text"))


#: Chunk type -> the ``Assembler`` method folding it (``feed`` without the extra call).
FOLD_CHUNK: dict[type, Callable[[Assembler, Any], None]] = {
    TextDelta: Assembler._text,
    ReasoningDelta: Assembler._reasoning,
    ToolCallDelta: Assembler._arguments,
    BlockStart: Assembler._start,
    BlockEnd: Assembler._end,
    UsageChunk: Assembler._usage,
    Finish: Assembler._finish,
}
