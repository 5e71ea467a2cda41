"""The SSE parser: WHATWG field rules, line endings, splitting, decoding, end of stream."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_agent_loop.llm._sse import SSEEvent, SSELimitError, SSEParser


def parse(*pieces: bytes | str) -> tuple[list[SSEEvent], bool]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    for piece in pieces:
        events += parser.feed(piece)
    return events, parser.close()


def test_single_event() -> None:
    assert parse(b"data: hello\n\n") == ([SSEEvent("hello")], False)


def test_multi_line_data_is_joined_with_newlines() -> None:
    events, _ = parse(b"data: a\ndata:b\ndata\ndata:  c\n\n")
    assert events == [SSEEvent("a\nb\n\n c")]


def test_event_id_and_retry_fields() -> None:
    parser = SSEParser()
    events = parser.feed(b"event: delta\nid: 7\nretry: 1500\ndata: x\n\ndata: y\n\n")
    assert events == [SSEEvent("x", "delta", "7"), SSEEvent("y", "message", "7")]
    assert parser.retry == 1500


def test_invalid_retry_and_nul_id_are_ignored() -> None:
    parser = SSEParser()
    events = parser.feed(b"id: 1\ndata: a\n\nid: 2\x003\nretry: 1.5\nretry: x\ndata: b\n\n")
    assert events == [SSEEvent("a", id="1"), SSEEvent("b", id="1")]
    assert parser.retry is None


def test_empty_id_resets_last_event_id() -> None:
    events, _ = parse(b"id: 9\ndata: a\n\nid\ndata: b\n\n")
    assert [e.id for e in events] == ["9", ""]


def test_comments_keepalives_and_unknown_fields_are_ignored() -> None:
    events, left = parse(b": keep-alive\n\n:\nfoo: bar\ndata: x\n: inside\n\n: trailing\n")
    assert events == [SSEEvent("x")]
    assert left is False


def test_blank_line_without_data_dispatches_nothing_and_resets_type() -> None:
    events, _ = parse(b"event: a\n\ndata: x\n\n")
    assert events == [SSEEvent("x", "message")]


def test_only_one_leading_space_is_stripped() -> None:
    events, _ = parse(b"data:   three\n\nevent:  spaced\ndata:x\n\n")
    assert events == [SSEEvent("  three"), SSEEvent("x", " spaced")]


def test_field_without_colon_has_empty_value() -> None:
    events, _ = parse(b"data\n\n")
    assert events == [SSEEvent("")]


def test_colon_inside_value_is_kept() -> None:
    events, _ = parse(b'data: {"a": "b:c"}\n\n')
    assert events == [SSEEvent('{"a": "b:c"}')]


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"])
def test_line_ending_variants(eol: bytes) -> None:
    stream = eol.join([b"event: e", b"data: 1", b"data: 2", b"", b"data: 3", b"", b""])
    events, left = parse(stream)
    assert events == [SSEEvent("1\n2", "e"), SSEEvent("3")]
    assert left is False


def test_mixed_line_endings() -> None:
    events, _ = parse(b"data: a\rdata: b\r\ndata: c\n\r\n")
    assert events == [SSEEvent("a\nb\nc")]


def test_cr_then_lf_across_pieces_is_one_line_ending() -> None:
    # Had the LF counted as a line of its own, "a" and "b" would be two events.
    events, _ = parse(b"data: a\r", b"\ndata: b\r\n\r\n")
    assert events == [SSEEvent("a\nb")]


def test_cr_at_piece_end_then_lf_alone() -> None:
    events, _ = parse(b"data: a\r", b"\n", b"\r", b"\n")
    assert events == [SSEEvent("a")]


def test_two_crs_across_pieces_are_two_line_endings() -> None:
    events, _ = parse(b"data: a\r", b"\r")
    assert events == [SSEEvent("a")]


def test_bom_is_stripped_once_at_stream_start() -> None:
    events, _ = parse(b"\xef\xbb", b"\xbfdata: a\n\n\xef\xbb\xbfdata: b\n\n")
    # A BOM later in the stream is part of a field name: the line is ignored.
    assert events == [SSEEvent("a")]


def test_multibyte_utf8_split_across_pieces() -> None:
    raw = "data: héllo → 世界 🎉\n\n".encode()
    pieces = [raw[i : i + 1] for i in range(len(raw))]
    events, left = parse(*pieces)
    assert events == [SSEEvent("héllo → 世界 🎉")]
    assert left is False


def test_invalid_utf8_becomes_replacement_character() -> None:
    events, _ = parse(b"data: a\xffb\xc3\n\n")
    assert events == [SSEEvent("a\ufffdb\ufffd")]


def test_truncated_utf8_at_end_is_reported() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\n\n\xe4\xb8") == [SSEEvent("a")]
    assert parser.close() is True


def test_unterminated_final_event_is_discarded() -> None:
    events, left = parse(b"data: a\n\ndata: b\n")
    assert events == [SSEEvent("a")]
    assert left is True


def test_partial_line_at_end_is_reported() -> None:
    events, left = parse(b"data: a\n\ndata: b")
    assert events == [SSEEvent("a")]
    assert left is True


def test_pending_event_field_at_end_is_reported() -> None:
    assert parse(b"event: x\n") == ([], True)


def test_str_input() -> None:
    events, _ = parse("data: é\r\n", "\r\n")
    assert events == [SSEEvent("é")]


def test_large_line_in_small_pieces() -> None:
    payload = "x" * 1_000_000
    raw = f"data: {payload}\n\n".encode()
    events, _ = parse(*[raw[i : i + 4096] for i in range(0, len(raw), 4096)])
    assert events == [SSEEvent(payload)]


# --- properties -----------------------------------------------------------------------------

_text = st.text(
    st.characters(blacklist_characters="\r\n\x00", blacklist_categories=("Cs",)), max_size=12
)
_event = st.tuples(
    st.none() | _text,  # event type
    st.none() | _text,  # id
    st.lists(_text, min_size=1, max_size=4),  # data lines
    st.booleans(),  # a comment inside
)
_eol = st.sampled_from(["\n", "\r", "\r\n"])


def _serialise(
    events: list[tuple[str | None, str | None, list[str], bool]], eols: st.DataObject
) -> bytes:
    lines: list[str] = []
    for kind, ident, data, comment in events:
        if kind is not None:
            lines.append(f"event: {kind}")
        if ident is not None:
            lines.append(f"id: {ident}")
        if comment:
            lines.append(": keep-alive")
        lines += [f"data: {line}" for line in data]
        lines.append("")
    out: list[str] = []
    previous = ""
    for line in lines:
        eol = eols.draw(_eol)
        if previous == "\r" and not line and eol == "\n":
            eol = "\r\n"  # "\r" + "\n" would be one CRLF, not two line endings
        out += [line, eol]
        previous = eol
    return "".join(out).encode()


def _expected(events: list[tuple[str | None, str | None, list[str], bool]]) -> list[SSEEvent]:
    out = []
    last_id = ""
    for kind, ident, data, _ in events:
        if ident is not None:
            last_id = ident
        out.append(SSEEvent("\n".join(data), kind or "message", last_id))
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(_event, max_size=6), st.data())
def test_any_line_endings_give_the_model_events(events, data) -> None:  # type: ignore[no-untyped-def]
    raw = _serialise(events, data)
    parsed, left = parse(raw)
    assert parsed == _expected(events)
    assert left is False


@settings(max_examples=300, deadline=None)
@given(st.lists(_event, max_size=6), st.data())
def test_arbitrary_resplitting_gives_the_same_events(events, data) -> None:  # type: ignore[no-untyped-def]
    raw = _serialise(events, data)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=20)))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert parse(*pieces) == parse(raw)
    assert parse(*pieces)[0] == _expected(events)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.data())
def test_resplitting_arbitrary_bytes_is_invariant(raw: bytes, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=10)))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert parse(*pieces) == parse(raw)


# --- limits ---------------------------------------------------------------------------------


def _capped(
    *pieces: bytes | str, line: int | None = None, event: int | None = None
) -> tuple[list[SSEEvent], bool]:
    parser = SSEParser(max_line_bytes=line, max_event_bytes=event)
    events: list[SSEEvent] = []
    for piece in pieces:
        events += parser.feed(piece)
    return events, parser.close()


def test_a_line_without_an_end_is_refused_as_soon_as_it_passes_the_cap() -> None:
    parser = SSEParser(max_line_bytes=1000)
    piece = b"data: " + b"x" * 94  # a newline-less flood in 100-byte pieces
    for _ in range(10):
        assert parser.feed(piece) == []  # 1,000 bytes: at the cap, not past it
    with pytest.raises(SSELimitError, match=r"max_line_bytes \(1000\)"):
        parser.feed(piece)  # the 11th piece crosses it: at most cap + one piece was held


def test_a_line_of_exactly_the_cap_passes_and_one_byte_more_is_refused() -> None:
    line = b"data: " + b"x" * 994  # 1000 bytes
    assert _capped(line + b"\n\n", line=1000) == ([SSEEvent("x" * 994)], False)
    assert _capped(line[:500], line[500:] + b"\n\n", line=1000)[0] == [SSEEvent("x" * 994)]
    for pieces in ([line + b"x\n\n"], [line[:500], line[500:] + b"x\n\n"], [line + b"x"]):
        with pytest.raises(SSELimitError):
            _capped(*pieces, line=1000)


def test_a_long_line_inside_one_piece_is_refused() -> None:
    with pytest.raises(SSELimitError):
        _capped("data: ok\n\n: " + "c" * 2000 + "\ndata: x\n\n", line=1000)


def test_lines_are_counted_in_utf8_bytes() -> None:
    fits = "data: " + "é" * 497  # 6 + 994 bytes, 503 characters
    assert _capped(fits.encode() + b"\n\n", line=1000)[0] == [SSEEvent("é" * 497)]
    assert _capped(fits + "\n\n", line=1000)[0] == [SSEEvent("é" * 497)]
    for over in (fits + "éé\n\n", fits + "éé"):  # 1004 bytes, 505 characters
        with pytest.raises(SSELimitError):
            _capped(over.encode(), line=1000)
        with pytest.raises(SSELimitError):
            _capped(over, line=1000)


def test_an_event_is_capped_across_its_data_lines() -> None:
    fits = b"data: " + b"a" * 49 + b"\ndata: " + b"b" * 50 + b"\n\n"  # 49 + 1 + 50 = 100
    assert _capped(fits, event=100)[0] == [SSEEvent("a" * 49 + "\n" + "b" * 50)]
    with pytest.raises(SSELimitError, match=r"max_event_bytes \(100\)"):
        _capped(b"data: " + b"a" * 50 + b"\ndata:" + b"b" * 50 + b"\n\n", event=100)
    many = b"".join(b"data: " + b"x" * 9 + b"\n" for _ in range(1000))  # short lines, big event
    with pytest.raises(SSELimitError):
        _capped(many, event=100, line=100)


def test_comments_and_other_fields_do_not_count_toward_the_event() -> None:
    raw = (
        b": "
        + b"c" * 500
        + b"\nevent: e\ndata: "
        + b"d" * 100
        + b"\n\ndata: "
        + b"d" * 100
        + b"\n\n"
    )
    events, _ = _capped(raw, event=100, line=1000)
    assert events == [SSEEvent("d" * 100, "e"), SSEEvent("d" * 100)]


def test_keep_alives_are_never_held() -> None:
    parser = SSEParser(max_line_bytes=20, max_event_bytes=20)
    for _ in range(10_000):
        assert parser.feed(b": keep-alive\n\n") == []
    assert parser.feed(b"data: x\n\n") == [SSEEvent("x")]


def _line_texts(events: list[tuple[str | None, str | None, list[str], bool]]) -> list[str]:
    lines: list[str] = []
    for kind, ident, data, comment in events:
        lines += [f"event: {kind}"] if kind is not None else []
        lines += [f"id: {ident}"] if ident is not None else []
        lines += [": keep-alive"] if comment else []
        lines += [f"data: {line}" for line in data]
    return lines


@settings(max_examples=200, deadline=None)
@given(st.lists(_event, min_size=1, max_size=6), st.data())
def test_caps_at_the_largest_sizes_change_nothing_and_one_byte_less_refuses(events, data) -> None:  # type: ignore[no-untyped-def]
    raw = _serialise(events, data)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=10)))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    line = max(len(text.encode()) for text in _line_texts(events))
    event = max(len("\n".join(lines).encode()) for _, _, lines, _ in events)
    assert _capped(*pieces, line=line, event=event) == parse(raw)
    with pytest.raises(SSELimitError):
        _capped(*pieces, line=line - 1)
    if event:
        with pytest.raises(SSELimitError):
            _capped(*pieces, event=event - 1)
