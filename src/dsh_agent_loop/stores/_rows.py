r"""Events as the stores keep them: one compact JSON text per event, its sha256, and decoding.

``event_json`` is ``events.event_to_json`` without the converter's dispatch: the same text,
byte for byte (a test pins that), at a fraction of the cost, which matters because it runs once
per stored event on the commit path. The event's frozen values are walked into plain dicts
and lists that ``msgspec`` encodes (about half the cost of the ``json`` encoder calling back
for every ``FrozenDict``); ``msgspec`` writes them as ``json`` does, except floats outside
``repr``'s positional range (``1e+16`` is ``1e16`` there), NaN and infinities (``null``), which
the walk refuses, as it refuses anything that is not frozen JSON. A refused event, and one with
a lone surrogate (which ``msgspec`` cannot encode), takes the ``json`` way: the C scanner
``json.JSONEncoder.encode`` would build, built once here (``JSONEncoder.iterencode`` makes a new
one each time), a ``FrozenDict`` encoded through ``json_default`` as the ``dict`` it holds.

``decode_event`` is ``events.event_from_json`` made cheap for a store reading back many
events: ``msgspec`` parses the text (several times faster than ``json.loads``) and its plain
dicts and lists are frozen by a walk that knows they hold nothing else, about a sixth of the
cost in all. The result is the same ``Event``, same types and values (a test pins that).
Whatever ``msgspec`` refuses (it is stricter: ``NaN``, numbers out of the double range,
escaped lone surrogates, malformed text; it cannot read a raw lone surrogate either), and any
object that is not a plain event, goes to ``event_from_json`` itself, which decodes it the
same way or raises the same ``ValueError``.

Lone surrogates. A Python ``str`` may hold a lone surrogate (``"\ud800"``, as
``os.fsdecode`` makes of undecodable bytes), which no UTF-8 text can carry: SQLite and
psycopg refuse to bind it, and a JSON-lines file cannot hold it. The stored text writes each
one as its JSON escape (``\ud800``) instead, so the stored form is valid UTF-8 and reads
back as the very same string (a JSON decoder turns the escape into the code point). The check
costs one ``isascii`` for ASCII text; only non-ASCII text is scanned. (Two adjacent lone
surrogates that form a valid pair read back as the one character they encode.) Every store
that stores text uses ``event_json``/``text_json``, so all agree; ``MemoryStore`` keeps the
objects themselves.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import msgspec

from .._errors import StoreCorruptError
from .._frozen import FrozenDict, freeze, from_shape, json_default, shape, thaw
from .._session.store import SessionInfo
from ..events import TURN_END, Event, event_from_json, make_event

__all__ = [
    "LOWEST_SEQ",
    "corrupt",
    "decode_event",
    "decode_rows",
    "escape_surrogates",
    "event_json",
    "event_sha256",
    "last_turn_end",
    "load_header",
    "not_dense",
    "session_info",
    "text_json",
]

_ENCODER: Final = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), check_circular=False, default=json_default
)


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
    try:
        return _fast_json(event)
    except Exception:  # something msgspec would spell otherwise, or cannot encode
        pass
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
    text = _ENCODE(out)
    return text if text.isascii() else escape_surrogates(text)


_MSGSPEC_ENCODE: Final = msgspec.json.Encoder().encode
#: Values ``msgspec`` writes exactly as ``json`` does, whatever they hold.
_SAME: Final = frozenset({str, int, bool, type(None)})


#: ``zip`` called without keywords: ``strict=`` sends every call down a slower argument path
#: (a fifth of the whole encoding here); a shape and its values are as long by construction.
_pair_up: Final = zip


class _Differs(Exception):
    """A value ``msgspec`` would write otherwise than ``json`` (or that is not frozen JSON)."""


def _plain(value: Any) -> Any:
    """A frozen value as the dicts and lists ``msgspec`` encodes, or ``_Differs``.

    Floats pass only where both encoders write the same digits the same way (``repr``'s
    positional range; ``msgspec`` writes exponents, NaN and infinities otherwise); anything
    that is not a ``FrozenDict``, a tuple or a JSON atom of its exact type is refused.
    """
    kind = type(value)
    if kind is FrozenDict:
        values = [v if type(v) in _SAME else _plain(v) for v in value._v]
        return dict(_pair_up(value._k, values))
    if kind is tuple:
        return [v if type(v) in _SAME else _plain(v) for v in value]
    if kind is float and (1e-4 <= abs(value) < 1e16 or value == 0.0):
        return value
    raise _Differs


def _fast_json(event: Event) -> str:
    """``event_json`` through ``msgspec`` (several times faster than the ``json`` encoder).

    Raises:
        _Differs: a value ``msgspec`` would write otherwise. UnicodeEncodeError: a lone
            surrogate (``json`` writes it, then it is escaped).
    """
    time = event.time
    if type(time) is not float or not (1e-4 <= abs(time) < 1e16 or time == 0.0):
        raise _Differs  # (the walk's float rule, inlined: every event has a time)
    out: dict[str, Any] = {
        "type": event.type,
        "seq": event.seq,
        "time": time,
        "data": _plain(event.data),
    }
    if event.ignorable:
        out["ignorable"] = True
    op = event.surface_op
    if op is not None:
        out["surface_op"] = op if type(op) in _SAME else _plain(op)
    if event.source_event_seqs is not None:
        out["source_event_seqs"] = _plain(event.source_event_seqs)
    if type(event.type) is not str or type(event.seq) not in _SAME:
        raise _Differs
    return _MSGSPEC_ENCODE(out).decode()


_DECODE: Final = msgspec.json.Decoder().decode
_NESTED: Final = (dict, list)


def _frozen_json(value: Any) -> Any:
    """``freeze(value)`` for what a JSON parser makes: dicts, lists, and atoms in them."""
    if type(value) is dict:
        values = [v if type(v) not in _NESTED else _frozen_json(v) for v in value.values()]
        return from_shape(shape(tuple(value)), tuple(values))
    return tuple([v if type(v) not in _NESTED else _frozen_json(v) for v in value])


def decode_event(text: str | bytes) -> Event:
    """The ``Event`` of a stored JSON text: what ``event_from_json(text)`` returns, faster.

    ``text`` may also be UTF-8 bytes (a JSON-lines file's line); other encodings, and bytes
    that are not UTF-8, go to ``event_from_json`` as well.

    Raises:
        ValueError: the text is not a JSON event (``event_from_json``'s error).
    """
    try:
        obj = _DECODE(text)
    except (msgspec.MsgspecError, UnicodeError):  # stricter than ``json`` (or a raw
        return event_from_json(text)  # surrogate it cannot take): the reference judges
    data = obj.get("data") if type(obj) is dict else None
    kind = obj.get("type") if type(data) is dict else None
    if type(kind) is not str:  # not a plain event (a missing key, odd types): the same way
        return event_from_json(text)
    op = obj.get("surface_op")
    cites = obj.get("source_event_seqs")
    try:
        return make_event(
            kind,
            obj.get("seq"),
            float(obj.get("time", 0.0)),
            _frozen_json(data),
            op if op is None or op == "append" else freeze(op),
            None if cites is None else tuple(cites),
            bool(obj.get("ignorable", False)),
        )
    except TypeError:  # a time or cited seqs of the wrong type
        return event_from_json(text)


def text_json(value: Any) -> str:
    """The stored JSON of a header (``json.dumps`` defaults, non-ASCII kept, surrogates escaped)."""
    text = json.dumps(thaw(value), ensure_ascii=False)
    return text if text.isascii() else escape_surrogates(text)


_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def escape_surrogates(text: str) -> str:
    r"""``text`` with every lone surrogate written as its JSON escape (``\udXXX``).

    Meant for JSON text: a raw surrogate can only stand inside a JSON string there (the
    encoder escapes nothing else it could be confused with), where its escape means the same.
    Other text (a column value) simply keeps the escape as six characters.
    """
    try:
        text.encode()
    except UnicodeEncodeError:
        return _SURROGATE.sub(_escape, text)
    return text


def event_sha256(text: str) -> bytes:
    """The content hash kept beside an event's JSON (to settle an ambiguous commit)."""
    return hashlib.sha256(text.encode()).digest()


def last_turn_end(events: Sequence[Event]) -> str | None:
    """The JSON of the latest ``turn/end`` reason in ``events``, or None."""
    for event in reversed(events):
        if event.type == TURN_END:
            return json.dumps(thaw(event.data.get("reason")))
    return None


def corrupt(sid: str, what: str, exc: ValueError) -> StoreCorruptError:
    """A ``StoreCorruptError`` (code ``STORE_CORRUPT``): stored text of ``sid`` does not decode."""
    error = StoreCorruptError(f"session {sid!r}: stored {what} does not decode ({exc})")
    error.__cause__ = exc
    return error


def not_dense(sid: str, seqs: Iterable[Any], start: int = 0) -> StoreCorruptError:
    """A ``StoreCorruptError`` naming where ``seqs`` (stored, ascending) stop counting up.

    ``seqs`` should be a session's stored seqs from ``start`` on; if they do count up densely
    to their end, the seq after the last one is the missing one (a stored count said more). A
    seq out of place that the right one follows is named as such; one past a gap, as the gap.
    """
    listed = list(seqs)
    bad = (i for i, seq in enumerate(listed) if seq != start + i or type(seq) is not int)
    i = next(bad, len(listed))
    expected = start + i
    if i == len(listed):
        what = f"seq {expected} is missing (no stored event follows it)"
        return StoreCorruptError(f"session {sid!r}: the stored seqs are not dense: {what}")
    seq = listed[i]
    after = listed[i + 1] if i + 1 < len(listed) else None
    if type(seq) is int and seq > expected and after != expected + 1:
        what = f"seq {expected} is missing (the next stored seq is {seq})"
    else:
        what = f"seq {seq!r} is stored where seq {expected} belongs"
    return StoreCorruptError(f"session {sid!r}: the stored seqs are not dense: {what}")


#: The lowest seq a read from 0 asks for (the least 64-bit integer): below 0 is foreign too.
LOWEST_SEQ: Final = -(2**63)


def decode_rows(sid: str, start: int, rows: Sequence[Any]) -> list[Event]:
    """The events of a read from ``start``, from its stored rows (``row[0]``: the JSON text).

    ``rows`` are the first rows of the session from seq ``start`` on (from ``LOWEST_SEQ``
    when ``start`` is 0, so that a foreign negative seq shows), in seq order, as many as the
    read asked for (all, or ``length``): when nothing is missing they hold exactly the events
    ``start ..``, and a gap inside the range brings in a row from past it. So the events' seqs
    must count up from ``start``. Each event's own seq is what is checked (it is what the
    session replays; the store writes a row's seq from it): a row deleted, added, renumbered or
    rewritten shows as a gap or a seq out of place. A gap just past the last stored event
    cannot show (it is the end of the log).

    Raises:
        StoreCorruptError: a gap, a seq out of place, or text that does not decode.
    """
    try:
        events = [decode_event(row[0]) for row in rows]
    except ValueError as exc:
        raise corrupt(sid, "event", exc) from exc
    seqs = [event.seq for event in events]
    if seqs != list(range(start, start + len(seqs))):
        raise not_dense(sid, seqs, start)
    return events


def load_header(text: str, sid: str) -> Mapping[str, Any]:
    """Decode a stored header.

    Raises:
        StoreCorruptError: the text is not a JSON object.
    """
    try:
        head = _DECODE(text)
    except (msgspec.MsgspecError, UnicodeError):  # stricter than ``json``: it judges
        pass
    else:
        if type(head) is dict:
            return _frozen_json(head)  # type: ignore[no-any-return]
    try:
        head = json.loads(text)
        if not isinstance(head, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        raise corrupt(sid, "header", exc) from exc
    return freeze(head)  # type: ignore[no-any-return]


def session_info(row: tuple[str, int, str | None, str]) -> SessionInfo:
    """A ``SessionInfo`` from a SQL row ``(header JSON, event count, turn-end JSON, id)``.

    Raises:
        StoreCorruptError: the header or the turn end cannot be read.
    """
    header = load_header(row[0], row[3])
    try:
        last = None if row[2] is None else freeze(json.loads(row[2]))
    except ValueError as exc:
        raise corrupt(row[3], "turn end", exc) from exc
    return SessionInfo(
        session_id=str(header.get("session_id", row[3])),
        agent_id=str(header.get("agent_id", "")),
        created_at=str(header.get("created_at", "")),
        event_count=int(row[1]),
        last_turn_end=last,
    )
