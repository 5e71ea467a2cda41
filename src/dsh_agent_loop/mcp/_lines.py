"""``LineSplitter``: newline-delimited messages cut from a byte stream, bounded (sans-I/O).

Design. MCP over stdio is one JSON-RPC message a line. A reader that joins chunks until it sees
a newline holds a 100 MB line whole, and one that re-joins its buffer on each chunk spends time
quadratic in the line (the SDK's reader does both). This splitter scans each byte once, keeps
at most ``limit`` bytes of an unfinished line, and turns a longer line into an ``Oversized``
record instead: its first and last bytes (where a JSON-RPC ``id`` is found, so the call waiting
for it can be answered with an error) and its length. The rest of such a line is counted and
dropped as it arrives, so the stream stays in step for the next message.

The ``id`` is read from the head (``{"jsonrpc":"2.0","id":7,...``, as the Python SDK writes) as
soon as the line passes the limit, or else from the tail (``...,"id":7}``, as the TypeScript SDK
writes) when the line ends. A server could claim any id in any message, so a guessed id gives a
hostile server nothing it did not have.
"""

from __future__ import annotations

import json
import re
from typing import Final, final

import attrs

__all__ = ["LineSplitter", "Oversized", "message_id"]

#: Bytes kept from each end of an oversized line, to find its ``id``.
EDGE: Final = 256

_ID = rb'"id"\s*:\s*(-?\d{1,18}|"(?:[^"\\]|\\.){0,200}")'
_HEAD_ID: Final = re.compile(rb'\A\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?' + _ID)
_TAIL_ID: Final = re.compile(rb"[,{]\s*" + _ID + rb"\s*\}\s*\Z")


@final
@attrs.frozen
class Oversized:
    """A line longer than the limit (not kept)."""

    size: int
    """Its length in bytes, or how many had arrived when it was reported (``finished`` false)."""
    id: int | str | None
    """The JSON-RPC id it carries, when one was found at either end."""
    finished: bool
    """Whether the line has ended (False: reported from its head, the rest still arriving)."""


def message_id(head: bytes, tail: bytes) -> int | str | None:
    """The JSON-RPC ``id`` at the start of ``head`` or the end of ``tail``, if either has one."""
    match = _HEAD_ID.match(head) or _TAIL_ID.search(tail)
    if match is None:
        return None
    value: int | str = json.loads(match.group(1))
    return value


@final
class LineSplitter:
    """Feed bytes, get complete lines (without the newline) and ``Oversized`` records."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buffer = bytearray()
        self._scanned = 0
        self._dropping = -1
        """Bytes of the oversized line dropped so far (-1: not dropping one)."""
        self._head = b""
        self._tail = b""
        self._reported = False

    def feed(self, data: bytes | bytearray) -> list[bytes | Oversized]:
        """The lines and oversized records that ``data`` completes, in order."""
        out: list[bytes | Oversized] = []
        while data:
            data = self._drop(data, out) if self._dropping >= 0 else self._take(data, out)
        return out

    def _take(self, data: bytes | bytearray, out: list[bytes | Oversized]) -> bytes:
        buffer = self._buffer
        buffer += data
        start = 0
        while True:
            end = buffer.find(b"\n", max(start, self._scanned))
            if end < 0 or end - start > self.limit:
                break
            if end > start:
                out.append(bytes(buffer[start:end]))
            start = end + 1
        if end < 0 and len(buffer) - start <= self.limit:
            del buffer[:start]
            self._scanned = len(buffer)  # no newline in what is left
            return b""
        # The line at `start` is too long: report it, then drop it to its newline.
        line_end = len(buffer) if end < 0 else end
        self._head = bytes(buffer[start : start + EDGE])
        self._tail = bytes(buffer[max(start, line_end - EDGE) : line_end])
        self._dropping = line_end - start
        rest = bytes(buffer[line_end:])
        buffer.clear()
        self._scanned = 0
        found = message_id(self._head, b"")
        self._reported = found is not None
        if self._reported:
            out.append(Oversized(self._dropping, found, finished=False))
        return rest

    def _drop(self, data: bytes | bytearray, out: list[bytes | Oversized]) -> bytes:
        end = data.find(b"\n")
        piece = data if end < 0 else data[:end]
        self._dropping += len(piece)
        self._tail = (self._tail + piece)[-EDGE:]
        if end < 0:
            return b""
        if not self._reported:
            out.append(Oversized(self._dropping, message_id(self._head, self._tail), finished=True))
        self._dropping = -1
        self._head = self._tail = b""
        return bytes(data[end + 1 :])
