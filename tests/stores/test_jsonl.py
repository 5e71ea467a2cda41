"""JSONL files on disk: the layout, a torn last line, and corruption in the middle."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsh_agent_loop._errors import SessionNotFoundError, StoreCorruptError, StoreError
from dsh_agent_loop.events import event_to_json
from dsh_agent_loop.stores import JsonlStore

from .conftest import ev, header


def write_log(path: Path, *lines: str, tail: bytes = b"") -> bytes:
    data = "".join(line + "\n" for line in lines).encode() + tail
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def valid_lines(sid: str, n: int) -> list[str]:
    return [json.dumps(header(sid)), *(event_to_json(ev(i)) for i in range(n))]


async def test_file_layout_is_one_readable_line_per_event(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path)
    handle = await store.create(header("a/b c%d"))
    await handle.append([ev(0), ev(1, "turn/end", reason={"type": "completed"})])
    await handle.close()

    path = tmp_path / "a%2Fb%20c%25d.jsonl"
    assert os.listdir(tmp_path) == [path.name]
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == header("a/b c%d")
    assert lines[1:] == [
        event_to_json(ev(0)),
        event_to_json(ev(1, "turn/end", reason={"type": "completed"})),
    ]
    info = await store.stat("a/b c%d")
    assert info is not None
    assert (info.event_count, info.last_turn_end) == (2, {"type": "completed"})


@pytest.mark.parametrize(
    "tail",
    [
        b'{"type":"user/message","seq":3,"ti',  # no newline: an interrupted write
        b'{"type":"user/message","seq":3,"time":3.0,"data":{}}',  # complete JSON, no newline
        b"\x00\x00\x00\n",  # a last line that does not parse
    ],
)
async def test_torn_last_line_is_hidden_on_read_and_truncated_on_write(
    tmp_path: Path, tail: bytes
) -> None:
    path = tmp_path / "s1.jsonl"
    good = write_log(path, *valid_lines("s1", 3))
    path.write_bytes(good + tail)
    store = JsonlStore(tmp_path)

    reader = await store.open("s1", "read")
    assert await reader.read() == [ev(0), ev(1), ev(2)]
    info = await store.stat("s1")
    assert info is not None
    assert info.event_count == 3
    assert path.read_bytes() == good + tail  # reading changes nothing

    handle = await store.open("s1", "write")
    assert path.read_bytes() == good  # the torn tail is cut off under write
    assert await handle.read() == [ev(0), ev(1), ev(2)]
    await handle.append([ev(3)])
    await handle.close()
    assert path.read_bytes() == good + (event_to_json(ev(3)) + "\n").encode()
    assert await reader.read() == [ev(i) for i in range(4)]
    await reader.close()


async def test_corrupt_middle_line_raises_and_truncates_nothing(tmp_path: Path) -> None:
    lines = valid_lines("s1", 3)
    path = tmp_path / "s1.jsonl"
    data = write_log(path, lines[0], lines[1], "{not json", lines[2], lines[3])
    store = JsonlStore(tmp_path)

    with pytest.raises(StoreError, match="line 3 is corrupt") as caught:
        await store.open("s1", "write")
    assert caught.value.code == "STORE_CORRUPT"
    with pytest.raises(StoreError, match="corrupt"):
        await store.open("s1", "read")
    with pytest.raises(StoreError, match="corrupt"):
        await store.stat("s1")
    assert await store.list() == []  # listing skips the corrupt file instead of failing
    assert path.read_bytes() == data
    # The lock was released: after a repair by hand the session opens.
    path.write_bytes(data.replace(b"{not json\n", b""))
    handle = await store.open("s1", "write")
    assert await handle.read() == [ev(0), ev(1), ev(2)]
    await handle.abort()


async def test_seq_out_of_order_in_the_middle_is_corruption(tmp_path: Path) -> None:
    lines = valid_lines("s1", 3)
    path = tmp_path / "s1.jsonl"
    data = write_log(path, lines[0], lines[2], lines[1], lines[3])
    with pytest.raises(StoreError, match="seq 1 where 0 was expected"):
        await JsonlStore(tmp_path).open("s1", "write")
    assert path.read_bytes() == data


@pytest.mark.parametrize(
    "content",
    [b"", json.dumps(header("s1")).encode() + b"\n", json.dumps(header("s1")).encode()[:10]],
)
async def test_header_only_or_torn_header_is_absent_and_reclaimed(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "s1.jsonl"
    path.write_bytes(content)
    store = JsonlStore(tmp_path)
    assert await store.stat("s1") is None
    assert await store.list() == []
    with pytest.raises(SessionNotFoundError):
        await store.open("s1", "read")
    with pytest.raises(SessionNotFoundError):
        await store.open("s1", "write")
    assert path.read_bytes() == content

    handle = await store.create(header("s1", agent_id="fresh"))
    await handle.append([ev(0)])
    await handle.close()
    assert path.read_text().splitlines() == [
        json.dumps(header("s1", agent_id="fresh"), separators=(",", ":")),
        event_to_json(ev(0)),
    ]


@pytest.mark.parametrize("last", [True, False])
async def test_a_line_with_a_foreign_seq_is_corruption_even_as_the_last_line(
    tmp_path: Path, last: bool
) -> None:
    """No torn write leaves a whole event line with another seq: it is never cut off."""
    lines = valid_lines("s1", 3)
    foreign = event_to_json(ev(1000))
    path = tmp_path / "s1.jsonl"
    order = [*lines, foreign] if last else [*lines[:2], foreign, *lines[2:]]
    data = write_log(path, *order)
    store = JsonlStore(tmp_path)
    for attempt in (lambda: store.open("s1", "write"), lambda: store.open("s1", "read")):
        with pytest.raises(StoreCorruptError, match="seq 1000 where") as caught:
            await attempt()
        assert caught.value.code == "STORE_CORRUPT"
        assert "s1.jsonl" in str(caught.value)
    assert path.read_bytes() == data  # nothing truncated


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


async def test_new_session_files_are_0600_and_existing_ones_keep_their_mode(
    tmp_path: Path, permissive_umask: None
) -> None:
    store = JsonlStore(tmp_path / "sessions")
    handle = await store.create(header("new"))
    await handle.append([ev(0)])
    await handle.close()
    assert stat.S_IMODE(os.stat(tmp_path / "sessions" / "new.jsonl").st_mode) == 0o600

    shared = tmp_path / "sessions" / "shared.jsonl"
    write_log(shared, *valid_lines("shared", 1))
    os.chmod(shared, 0o640)  # the user's choice
    handle = await store.open("shared", "write")
    await handle.append([ev(1)])
    await handle.close()
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o640
