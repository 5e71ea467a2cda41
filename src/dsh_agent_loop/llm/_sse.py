r"""A sans-I/O parser for ``text/event-stream`` (Server-Sent Events), per the WHATWG rules.

Design: bytes go in, in whatever pieces the network delivered them; complete events come out.
The rules enforced are those of the HTML standard's event-stream interpretation:

* Lines end with CRLF, LF or a lone CR. A CR that ends one piece and an LF that starts the
  next are *one* line ending, so the parser remembers a trailing CR and drops the LF after it.
* A line starting with ``:`` is a comment (keep-alives); a line without ``:`` is a field name
  with an empty value; one leading space of a value is stripped.
* ``data`` lines accumulate and are joined with ``"\\n"``; ``event`` sets the type (default
  ``message``); ``id`` sets the last event id unless it contains NUL and persists across
  events; ``retry`` (ASCII digits only) sets the reconnection time; other fields are ignored.
* A blank line dispatches the event, but only when some ``data`` line was seen; an event still
  unterminated when the stream ends is discarded (``close()`` reports it).
* Bytes are decoded incrementally as UTF-8 with one leading BOM dropped. Invalid UTF-8 becomes
  U+FFFD, as the standard's "UTF-8 decode" mandates; adapters then report a malformed frame as
  ``BAD_STREAM`` only when the decoded payload does not parse.

Speed matters (every streamed token is one event): a piece is scanned with ``str`` methods
only, lines are split once per piece, and a line with no end yet is kept as a list of parts so
that a 10 MB ``data`` line delivered in small pieces is joined once, not re-copied per piece.

Bounds (a hostile server may send a line that never ends): ``max_line_bytes`` caps one line and
``max_event_bytes`` one event's ``data``, both in UTF-8 bytes. The unfinished line is counted as
pieces arrive, so ``feed`` raises ``SSELimitError`` as soon as it passes the cap: the parser never
holds more than the cap plus the piece that crossed it.
"""

from __future__ import annotations

import codecs
import sys
from typing import Final, final

import attrs

__all__ = ["SSEEvent", "SSELimitError", "SSEParser"]

_BOM: Final = "\ufeff"
_UNBOUNDED: Final = sys.maxsize


class SSELimitError(ValueError):
    """A line or an event passed the parser's ``max_line_bytes`` or ``max_event_bytes``."""


def _utf8_len(text: str) -> int:
    """``len(text.encode())``, without encoding ASCII text (``isascii`` is O(1) in CPython)."""
    return len(text) if text.isascii() else len(text.encode())


@final
@attrs.frozen(slots=True)
class SSEEvent:
    """One dispatched event."""

    data: str
    """The ``data`` lines joined with ``"\\n"``."""
    event: str = "message"
    """The event type (``message`` when no ``event`` field was given)."""
    id: str = ""
    """The last event id seen so far in the stream (it persists across events)."""


@final
class SSEParser:
    """Incremental event-stream parser: ``feed()`` pieces, then ``close()`` once.

    Example::

        parser = SSEParser(max_line_bytes=1 << 22, max_event_bytes=1 << 23)
        for piece in pieces:
            for event in parser.feed(piece):  # SSELimitError past a cap
                handle(event)
        truncated = parser.close()

    Args:
        max_line_bytes: The longest line, in UTF-8 bytes without its line ending (None: no
            cap; text fed as ``str`` is counted as its UTF-8 encoding).
        max_event_bytes: The most ``data`` one event may carry, in UTF-8 bytes (the lines and
            the newlines joining them; None: no cap).
    """

    __slots__ = ("_data", "_decoder", "_dirty", "_event", "_last_id", "_max_event", "_max_line",
                 "_parts", "_pending", "_size", "_skip_lf", "_started", "retry")  # fmt: skip

    def __init__(
        self, *, max_line_bytes: int | None = None, max_event_bytes: int | None = None
    ) -> None:
        self._max_line = _UNBOUNDED if max_line_bytes is None else max_line_bytes
        self._max_event = _UNBOUNDED if max_event_bytes is None else max_event_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._parts: list[str] = []
        """The unfinished last line, as received pieces."""
        self._pending = 0
        """Bytes of the unfinished last line."""
        self._size = 0
        """Bytes of the current event's ``data`` so far."""
        self._data: list[str] = []
        self._event = ""
        self._last_id = ""
        self._dirty = False
        """A field line arrived since the last blank line."""
        self._skip_lf = False
        """The previous piece ended with CR: an LF starting the next piece belongs to it."""
        self._started = False
        self.retry: int | None = None
        """The reconnection time in milliseconds from the last valid ``retry`` field."""

    def feed(self, data: bytes | str) -> list[SSEEvent]:
        """Parse one more piece of the stream.

        Args:
            data: Raw bytes (decoded incrementally as UTF-8) or already decoded text.

        Returns:
            The events completed by this piece, in order.

        Raises:
            SSELimitError: a line or an event passed its cap (the stream cannot be read on).
        """
        text = data if isinstance(data, str) else self._decoder.decode(data)
        if not text:
            return []
        if not self._started:
            self._started = True
            if text[0] == _BOM:
                text = text[1:]
        if self._skip_lf:
            self._skip_lf = False
            if text[:1] == "\n":
                text = text[1:]
        if "\r" in text:
            self._skip_lf = text[-1] == "\r"
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        if "\n" not in text:
            if text:
                self._extend(text)
            return []
        if self._parts:
            self._parts.append(text)
            text = "".join(self._parts)
            self._parts = []
        lines = text.split("\n")
        tail = lines.pop()
        self._pending = 0
        if tail:
            self._parts.append(tail)
            self._pending = _utf8_len(tail)
            if self._pending > self._max_line:
                self._line_too_long()
        return self._lines(lines)

    def _extend(self, text: str) -> None:
        """Add ``text`` (no line ending in it) to the unfinished line."""
        self._parts.append(text)
        self._pending += _utf8_len(text)
        if self._pending > self._max_line:
            self._line_too_long()

    def _line_too_long(self) -> None:
        self._parts = []
        raise SSELimitError(f"an SSE line is longer than max_line_bytes ({self._max_line})")

    def _add_data(self, value: str) -> None:
        self._size += _utf8_len(value) + 1  # the newline that joins it to the next line
        if self._size - 1 > self._max_event:
            self._event_too_long()
        self._data.append(value)

    def _event_too_long(self) -> None:
        self._data = []
        raise SSELimitError(
            f"an SSE event's data is longer than max_event_bytes ({self._max_event})"
        )

    def _lines(self, lines: list[str]) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        # A line can only be over the cap when a quarter of its length is (UTF-8: 1-4 bytes
        # per character), so the exact size is computed only for long lines.
        quarter = self._max_line // 4
        for line in lines:
            if not line:
                if self._data:
                    events.append(
                        SSEEvent("\n".join(self._data), self._event or "message", self._last_id)
                    )
                    self._data = []
                self._size = 0
                self._event = ""
                self._dirty = False
                continue
            if len(line) > quarter and _utf8_len(line) > self._max_line:
                self._line_too_long()
            if line[:6] == "data: ":  # the common case, first, with ``_add_data`` inlined
                value = line[6:]
                self._size += (len(value) if value.isascii() else len(value.encode())) + 1
                if self._size - 1 > self._max_event:
                    self._event_too_long()
                self._data.append(value)
                self._dirty = True
                continue
            colon = line.find(":")
            if colon == 0:
                continue  # a comment or keep-alive
            self._dirty = True
            if colon < 0:
                self._field(line, "")
                continue
            value = line[colon + 1 :]
            self._field(line[:colon], value[1:] if value[:1] == " " else value)
        return events

    def _field(self, name: str, value: str) -> None:
        if name == "data":
            self._add_data(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry = int(value)

    def close(self) -> bool:
        """End the stream, discarding any unterminated event.

        Returns:
            True when something was left over: a partial line, a partial UTF-8 sequence, or
            field lines not yet dispatched by a blank line (the stream was cut mid-event).
        """
        rest = self._decoder.decode(b"", final=True)
        if self._skip_lf:
            self._skip_lf = False
        left = bool(rest) or bool(self._parts) or self._dirty
        self._parts = []
        self._pending = 0
        self._size = 0
        self._data = []
        self._event = ""
        self._dirty = False
        return left
