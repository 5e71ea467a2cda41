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
"""

from __future__ import annotations

import codecs
from typing import Final, final

import attrs

__all__ = ["SSEEvent", "SSEParser"]

_BOM: Final = "\ufeff"


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

        parser = SSEParser()
        for piece in pieces:
            for event in parser.feed(piece):
                handle(event)
        truncated = parser.close()
    """

    __slots__ = ("_data", "_decoder", "_dirty", "_event", "_last_id", "_parts", "_skip_lf",
                 "_started", "retry")  # fmt: skip

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._parts: list[str] = []
        """The unfinished last line, as received pieces."""
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
                self._parts.append(text)
            return []
        if self._parts:
            self._parts.append(text)
            text = "".join(self._parts)
            self._parts = []
        lines = text.split("\n")
        tail = lines.pop()
        if tail:
            self._parts.append(tail)
        return self._lines(lines)

    def _lines(self, lines: list[str]) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    events.append(
                        SSEEvent("\n".join(data), self._event or "message", self._last_id)
                    )
                    data = self._data = []
                self._event = ""
                self._dirty = False
                continue
            if line[:6] == "data: ":  # the common case, first
                data.append(line[6:])
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
            self._data.append(value)
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
        self._data = []
        self._event = ""
        self._dirty = False
        return left
