"""Assembles an attempt's chunks into assistant content blocks (sans-I/O).

Rules (SPEC §9): the *delivered prefix* is what arrived before the stream stopped. Text and
reasoning blocks keep whatever text they received. A tool call is kept only when complete: its
``block-end`` arrived, or the stream finished normally (``stop``/``tool-calls``), which completes
every open block. On ``max-tokens`` or a cancel, an unended tool call is dropped ("cut").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, final

from .._frozen import FrozenDict, freeze
from .base import (
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


class _Block:
    __slots__ = ("call_id", "ended", "kind", "metadata", "name", "parts")

    def __init__(self, kind: str, call_id: str | None = None, name: str | None = None) -> None:
        self.kind = kind
        self.call_id = call_id
        self.name = name
        self.parts: list[str] = []
        self.ended = False
        self.metadata: Any = None


@final
class Assembler:
    """Folds chunks; ``content()`` returns the blocks of the assistant message."""

    __slots__ = ("_blocks", "_order", "delivered", "finish", "usage")

    def __init__(self) -> None:
        self._blocks: dict[int, _Block] = {}
        self._order: list[int] = []
        self.finish: Finish | None = None
        self.usage: Usage | None = None
        self.delivered = False
        """True once any text, reasoning or tool-call content arrived."""

    def _block(self, index: int, kind: str) -> _Block:
        block = self._blocks.get(index)
        if block is None:
            block = _Block(kind)
            self._blocks[index] = block
            self._order.append(index)
        return block

    def feed(self, chunk: Chunk) -> None:
        """Fold one chunk."""
        FOLD_CHUNK[type(chunk)](self, chunk)

    def _text(self, chunk: TextDelta) -> None:
        self._block(chunk.index, "text").parts.append(chunk.text)
        self.delivered = True

    def _reasoning(self, chunk: ReasoningDelta) -> None:
        self._block(chunk.index, "reasoning").parts.append(chunk.text)
        self.delivered = True

    def _arguments(self, chunk: ToolCallDelta) -> None:
        block = self._blocks.get(chunk.index) or self._block(chunk.index, "tool-call")
        block.parts.append(chunk.arguments)
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
        for index in self._order:
            block = self._blocks[index]
            if block.kind == "text":
                text.extend(block.parts)
            elif block.kind == "reasoning":
                reasoning.extend(block.parts)
        return "".join(text), "".join(reasoning)

    def has_cut_tool_call(self) -> bool:
        """True when a tool-call block started but never completed."""
        return any(b.kind == "tool-call" and not b.ended for b in self._blocks.values())

    def content(self) -> tuple[FrozenDict, ...]:
        """The message blocks: text/reasoning as delivered, complete tool calls only."""
        out: list[FrozenDict] = []
        for index in self._order:
            block = self._blocks[index]
            if block.kind == "tool-call":
                if not block.ended or not block.name:
                    continue
                out.append(
                    FrozenDict(
                        type="tool-call",
                        call_id=block.call_id or f"call-{index}",
                        name=block.name,
                        arguments="".join(block.parts),
                    )
                )
                continue
            text = "".join(block.parts)
            if not text and block.metadata is None:
                continue
            if block.metadata is not None:
                out.append(FrozenDict(type=block.kind, text=text, metadata=freeze(block.metadata)))
            else:
                out.append(FrozenDict(type=block.kind, text=text))
        return tuple(out)


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
