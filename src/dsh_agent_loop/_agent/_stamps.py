"""Session ids, ``created_at`` texts and options records for new session headers, made cheaply.

A burst of creations (a simulation creates thousands of agents) pays for each header: a
``uuid.UUID`` object and a ``datetime`` formatting per session would cost more than the rest of
the header. ``uuid4_text`` writes the same text from the same random bits without the object;
``Stamps`` formats the time once per millisecond and shares it; ``shared_record`` gives equal
options records one frozen object.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from typing import Any, Final, final

from .._frozen import FrozenDict, freeze

__all__ = ["SHARED_RECORDS", "Stamps", "shared_record", "uuid4_text"]

#: Distinct header options records ``shared_record`` keeps for sharing.
SHARED_RECORDS: Final = 256


def shared_record(records: dict[Any, FrozenDict], record: dict[str, Any]) -> FrozenDict:
    """``record`` frozen, the same object for every equal record (``records`` keeps them).

    Records of atoms are looked up by their items before they are frozen (freezing is most
    of the cost of a header); others are frozen first and looked up as a ``FrozenDict``.
    """
    key: Any = tuple(record.items())
    try:
        shared = records.get(key)
    except TypeError:  # a list or dict inside: look it up frozen
        key = freeze(record)
        shared = records.get(key)
    if shared is None:
        if len(records) >= SHARED_RECORDS:
            records.clear()
        shared = records[key] = freeze(record)
    return shared


def uuid4_text() -> str:
    """``str(uuid.uuid4())`` from the same 16 random bytes, without building a ``UUID``.

    The version nibble is ``4`` and the variant nibble one of ``8 9 a b`` (RFC 9562), as
    ``uuid4`` sets them; the other 122 bits are ``os.urandom``'s.
    """
    h = os.urandom(16).hex()
    variant = "89ab"[int(h[16], 16) & 3]
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{variant}{h[17:20]}-{h[20:]}"


@final
class Stamps:
    """``created_at`` texts (UTC, milliseconds), made once per millisecond.

    Formatting a ``datetime`` costs more than the rest of a header; agents created in a burst
    share the text of their millisecond.
    """

    __slots__ = ("_ms", "_text")

    def __init__(self) -> None:
        self._ms = -1
        self._text = ""

    def now(self) -> str:
        """``datetime.now(UTC).isoformat(timespec="milliseconds")``."""
        ms = int(time.time() * 1000)
        if ms != self._ms:
            self._ms = ms
            self._text = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
        return self._text
