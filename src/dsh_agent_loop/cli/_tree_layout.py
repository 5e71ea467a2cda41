"""``sessions list --tree`` on a narrow terminal: lines that never break a word.

The tree's table puts a session's id, agent, event count, last turn end and link on one row,
indented two spaces a level. Deep trees and long agent ids (a sub-agent's id is its parent's
plus ``.child``) make rows wider than the terminal, which would then wrap them anywhere, in the
middle of an id. When the table does not fit, each session takes two lines instead: its id,
indented by its depth, then its details one level deeper, each line wrapped between words to the
terminal's width. Indentation gives way before words do: it stops growing where the id would no
longer fit, and the details then name the session's level. Only a single word wider than the
whole terminal (an id longer than its width) is split, at its own ``.``, ``-`` and ``_``
separators, so it still reads as itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Final

__all__ = ["fits", "stacked_rows", "wrap_words"]

#: Columns kept free for the details however deep the session is.
MIN_DETAIL_WIDTH: Final = 24
#: Extra indentation of a session's details under its id.
DETAIL_INDENT: Final = 4
_PIECES = re.compile(r"[^.\-_]*[.\-_]|[^.\-_]+")


def fits(header: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> bool:
    """Whether the table of ``rows`` (two spaces between columns) fits in ``width`` columns."""
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
    last = max(len(r[-1]) for r in [header, *rows])
    return sum(widths[:-1]) + 2 * (len(widths) - 1) + last <= width


def _pieces(word: str, width: int) -> Iterator[str]:
    """``word`` in pieces of at most ``width`` columns, cut after its separators if it can be."""
    line = ""
    for piece in _PIECES.findall(word):
        if line and len(line) + len(piece) > width:
            yield line
            line = ""
        while len(piece) > width:  # no separator within a whole line: cut where it ends
            yield piece[:width]
            piece = piece[width:]
        line += piece
    if line:
        yield line


def wrap_words(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` columns, broken only between words.

    A word wider than ``width`` alone is split (``_pieces``).
    """
    width = max(width, 1)
    lines: list[str] = []
    line = ""
    for word in text.split():
        if len(word) > width:
            if line:
                lines.append(line)
            *whole, line = list(_pieces(word, width))
            lines.extend(whole)
            continue
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = ""
        line = f"{line} {word}" if line else word
    if line or not lines:
        lines.append(line)
    return lines


def _details(row: Sequence[str]) -> str:
    _, agent, events, end, link = row
    count = f"{events} event{'s' * (events != '1')}"
    parts = [f"agent {agent}", count, f"last turn {end}" if end != "-" else "no turn yet"]
    if link != "-":
        parts.append(link)
    return " · ".join(parts)


def stacked_rows(rows: Sequence[tuple[int, Sequence[str]]], width: int) -> list[tuple[str, str]]:
    """The lines (and their styles) of the tree, two or more a session: id, then details.

    ``rows`` are ``(depth, (id, agent, events, last turn end, link))`` in tree order.
    """
    width = max(width, 1)
    out = [
        (line, "dim") for line in wrap_words("SESSION · agent · events · last turn · link", width)
    ]
    for depth, row in rows:
        session_id = row[0]
        indent = max(0, min(2 * depth, width - len(session_id)))
        for line in wrap_words(session_id, width - indent):
            out.append((" " * indent + line, "bold"))
        inner = min(indent + DETAIL_INDENT, max(0, width - MIN_DETAIL_WIDTH))
        details = _details(row)
        if indent < 2 * depth:  # the indentation gave way: say how deep the session is
            details += f" · level {depth} of the tree"
        for line in wrap_words(details, width - inner):
            out.append((" " * inner + line, ""))
    return out
