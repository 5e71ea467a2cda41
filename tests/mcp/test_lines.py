"""``LineSplitter`` (sans-I/O): lines cut from chunks, long lines dropped, not held."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dsh_agent_loop.mcp._lines import LineSplitter, Oversized, message_id


def fed(splitter: LineSplitter, *chunks: bytes) -> list[bytes | Oversized]:
    out: list[bytes | Oversized] = []
    for chunk in chunks:
        out += splitter.feed(chunk)
    return out


def test_lines_across_chunks() -> None:
    splitter = LineSplitter(20)
    assert fed(splitter, b'{"a":', b"1}\n\n", b'{"b":2}\n{"c"') == [b'{"a":1}', b'{"b":2}']
    assert splitter.feed(b":3}\n") == [b'{"c":3}']


def test_a_long_line_is_reported_from_its_head_and_dropped() -> None:
    splitter = LineSplitter(16)
    head = b'{"jsonrpc":"2.0","id":7,"result":"'
    assert fed(splitter, head) == [Oversized(len(head), 7, finished=False)]
    assert fed(splitter, b"x" * 100_000) == []
    assert splitter._buffer == bytearray()  # nothing of it is held
    assert fed(splitter, b'"}\n{"ok":1}\n') == [b'{"ok":1}']


def test_a_long_line_with_its_id_at_the_end_is_reported_when_it_ends() -> None:
    splitter = LineSplitter(16)
    line = b'{"result":"' + b"x" * 1_000 + b'","jsonrpc":"2.0","id":"a-1"}'
    assert fed(splitter, line[:500], line[500:], b"\n") == [
        Oversized(len(line), "a-1", finished=True)
    ]


def test_a_long_line_without_an_id_is_reported_with_none() -> None:
    splitter = LineSplitter(8)
    assert fed(splitter, b'{"x":"' + b"y" * 50 + b'"}\nok\n') == [
        Oversized(58, None, finished=True),
        b"ok",
    ]


def test_ids_only_at_the_top_level_ends() -> None:
    assert message_id(b'{"id": 12, "x"', b"") == 12
    assert message_id(b'{"result":{"id":3', b'"a":{"id":3}}') is None
    assert message_id(b"", b',"id":5}') == 5
    assert message_id(b"", b',"id":5}}') is None


@given(
    lines=st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=40),
    cuts=st.lists(st.integers(min_value=1, max_value=50), max_size=60),
)
def test_any_chunking_gives_the_same_lines(lines: list[bytes], cuts: list[int]) -> None:
    data = b"".join(line + b"\n" for line in lines)
    splitter = LineSplitter(12)
    out: list[bytes | Oversized] = []
    position = 0
    for cut in [*cuts, len(data)]:
        out += splitter.feed(data[position : position + cut])
        position += cut
    got = [(b"O", o.size) if isinstance(o, Oversized) else o for o in out]
    assert got == [line if len(line) <= 12 else (b"O", len(line)) for line in lines if line]
