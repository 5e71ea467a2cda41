"""Events as the SQL backends store them: one compact JSON text per event, and its sha256.

``event_json`` is ``events.event_to_json`` without the converter's dispatch: the same text,
byte for byte (a test pins that), at under half the cost, which matters because it runs once
per stored event on the commit path. It calls the C scanner ``json.JSONEncoder.encode`` would
build, built once here instead of once per call (``JSONEncoder.iterencode`` makes a new one
each time); without the C accelerator it falls back to the encoder object.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any, Final

from .._frozen import thaw
from ..events import TURN_END, Event

__all__ = ["event_json", "event_sha256", "last_turn_end"]

_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)


def _c_encode() -> Callable[[dict[str, Any]], str] | None:
    """The C encoder ``_ENCODER.encode`` uses for a dict, prebuilt (None without ``_json``)."""
    make = getattr(json.encoder, "c_make_encoder", None)  # (not in the type stubs)
    if make is None:  # pragma: no cover - CPython always has _json
        return None
    scan = make(
        None,  # markers: check_circular=False
        _ENCODER.default,
        json.encoder.encode_basestring,  # ensure_ascii=False
        None,  # indent
        _ENCODER.key_separator,
        _ENCODER.item_separator,
        _ENCODER.sort_keys,
        _ENCODER.skipkeys,
        _ENCODER.allow_nan,
    )
    join = "".join

    def encode(doc: dict[str, Any]) -> str:
        return join(scan(doc, 0))

    return encode


_ENCODE: Final = _c_encode() or _ENCODER.encode


def event_json(event: Event) -> str:
    """The stored JSON text of ``event`` (identical to ``event_to_json(event)``)."""
    out: dict[str, Any] = {
        "type": event.type,
        "seq": event.seq,
        "time": event.time,
        "data": event.data,
    }
    if event.ignorable:
        out["ignorable"] = True
    if event.surface_op is not None:
        out["surface_op"] = event.surface_op
    if event.source_event_seqs is not None:
        out["source_event_seqs"] = list(event.source_event_seqs)
    return _ENCODE(out)


def event_sha256(text: str) -> bytes:
    """The content hash kept beside an event's JSON (to settle an ambiguous commit)."""
    return hashlib.sha256(text.encode()).digest()


def last_turn_end(events: Sequence[Event]) -> str | None:
    """The JSON of the latest ``turn/end`` reason in ``events``, or None."""
    for event in reversed(events):
        if event.type == TURN_END:
            return json.dumps(thaw(event.data.get("reason")))
    return None
