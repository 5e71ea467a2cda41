"""Reading one attempt's event-stream body within its limits: SSE events, frames, chunks.

Sans-I/O (``_http.py``'s pump feeds it the body's pieces). ``BodyReader`` owns the attempt's SSE
parser (capped by ``max_line_bytes`` and ``max_event_bytes``), the provider's frame decoder and
the output budget (``max_output_chars``: text, reasoning and tool-call arguments counted
together). Each limit, and a frame the decoder cannot read, ends the chunks with a
``BAD_STREAM`` finish: the pump stops there, having held at most a cap plus one piece.
"""

from __future__ import annotations

from typing import Final, Protocol, final

from ._base import Chunk, Failure, Finish, ReasoningDelta, TextDelta, ToolCallDelta
from ._sse import SSEEvent, SSELimitError, SSEParser
from ._stream_limits import StreamLimits

__all__ = ["BodyReader", "FrameDecoder"]


class FrameDecoder(Protocol):
    """Turns one provider's SSE events into chunks (sans-I/O)."""

    @property
    def done(self) -> bool:
        """True once the provider's end marker or an error frame was seen: stop reading."""
        ...

    def feed(self, event: SSEEvent) -> list[Chunk]:
        """Normalise one event; a list that sets ``done`` ends with the ``finish``.

        A malformed frame raises ``ValueError``, ``TypeError``, ``KeyError``, ... (the pump
        reports it as ``BAD_STREAM``).
        """
        ...

    def end(self) -> list[Chunk]:
        """The final ``[usage?, finish]`` when a finish was seen, else ``[]`` (stream cut)."""
        ...


_MALFORMED: Final = (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError)
"""What a decoder raises for a frame it cannot read (``RecursionError``: JSON nested too deep)."""


@final
class BodyReader:
    """One attempt's body, read within its limits: parser, decoder and the output budget."""

    __slots__ = ("_left", "_max_output", "decoder", "parser")

    def __init__(self, decoder: FrameDecoder, limits: StreamLimits) -> None:
        self.parser = SSEParser(
            max_line_bytes=limits.max_line_bytes, max_event_bytes=limits.max_event_bytes
        )
        self.decoder = decoder
        self._max_output = limits.max_output_chars
        self._left = limits.max_output_chars
        """Characters of text, reasoning and arguments the attempt may still stream."""

    def decode(self, piece: bytes) -> list[Chunk]:
        """The chunks of one piece of the body; a failure ends the list with its finish."""
        try:
            events = self.parser.feed(piece)
        except SSELimitError as exc:
            return [_error("BAD_STREAM", f"stream limit: {exc}")]
        out: list[Chunk] = []
        for event in events:
            try:
                chunks = self.decoder.feed(event)
            except _MALFORMED as exc:
                detail = f"{str(exc) or type(exc).__name__}: {event.data[:200]!r}"
                out.append(_error("BAD_STREAM", f"malformed frame: {detail}"))
                return out
            if not self._spend(chunks, out) or self.decoder.done:
                break
        return out

    def _spend(self, chunks: list[Chunk], out: list[Chunk]) -> bool:
        """Move ``chunks`` to ``out`` while the budget lasts (False: it ran out)."""
        for chunk in chunks:
            if isinstance(chunk, TextDelta | ReasoningDelta):
                self._left -= len(chunk.text)
            elif isinstance(chunk, ToolCallDelta):
                self._left -= len(chunk.arguments)
            if self._left < 0:
                out.append(
                    _error(
                        "BAD_STREAM",
                        "stream limit: the streamed text, reasoning and tool-call arguments "
                        f"are longer than max_output_chars ({self._max_output})",
                    )
                )
                return False
            out.append(chunk)
        return True

    def final(self, cut: Failure | None) -> list[Chunk]:
        """The chunks at the end of the body (``cut``: why it ended early)."""
        truncated = self.parser.close()
        final = self.decoder.end()
        if final:
            return final  # the finish arrived; a cut after it loses nothing but the end marker
        if cut is None:
            cut = Failure(
                "STREAM_CUT", f"stream ended {'mid-event' if truncated else 'without a finish'}"
            )
        return [Finish("error", failure=cut)]


def _error(code: str, message: str) -> Finish:
    return Finish("error", failure=Failure(code, message))
