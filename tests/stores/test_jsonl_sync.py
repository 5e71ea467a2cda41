"""``JsonlStore``'s synchronous side (``stores/_jsonl_sync.py``): parse, lock, write, release."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dsh_agent_loop._errors import (
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionNotFoundError,
    SessionOwnershipLostError,
    StoreError,
)
from dsh_agent_loop.events import event_to_json
from dsh_agent_loop.stores import _jsonl_sync as sync

from .conftest import ev, header


def lines(*events) -> bytes:
    return b"".join(event_to_json(e).encode() + b"\n" for e in events)


def write_session(path: Path, n: int, tail: bytes = b"") -> bytes:
    data = json.dumps(header("s1")).encode() + b"\n" + lines(*[ev(i) for i in range(n)]) + tail
    path.write_bytes(data)
    return data


def test_read_path_of_an_absent_file_is_none(tmp_path: Path):
    assert sync.read_path(str(tmp_path / "none.jsonl")) is None


def test_read_path_parses_header_and_events(tmp_path: Path):
    path = tmp_path / "s1.jsonl"
    data = write_session(path, 3)
    log = sync.read_path(str(path))
    assert log.header["session_id"] == "s1"
    assert [e.seq for e in log.events] == [0, 1, 2]
    assert log.valid_end == len(data)


@pytest.mark.parametrize("tail", [b'{"type":"user/mess', b"garbage\n", b"\n"])
def test_a_torn_last_line_is_left_out(tmp_path: Path, tail: bytes):
    path = tmp_path / "s1.jsonl"
    data = write_session(path, 2, tail)
    log = sync.read_path(str(path))
    assert [e.seq for e in log.events] == [0, 1]
    assert log.valid_end == len(data) - len(tail)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (lines(ev(0), ev(2)) + lines(ev(3)), "seq 2 where 1 was expected"),
        (b"not json\n" + lines(ev(1)), "not a JSON event"),
    ],
)
def test_a_bad_line_before_the_last_is_corruption(tmp_path: Path, body: bytes, why: str):
    path = tmp_path / "s1.jsonl"
    path.write_bytes(json.dumps(header("s1")).encode() + b"\n" + body)
    with pytest.raises(StoreError, match=why) as info:
        sync.read_path(str(path))
    assert info.value.code == "STORE_CORRUPT"
    assert "more lines follow it; the log was left untouched" in info.value.message


def test_a_header_without_a_session_id_is_corruption(tmp_path: Path):
    path = tmp_path / "s1.jsonl"
    path.write_bytes(b'{"agent_id":"a"}\n' + lines(ev(0)))
    with pytest.raises(StoreError, match="line 1 is corrupt"):
        sync.read_path(str(path))


def test_create_flush_and_open_write_round_trip(tmp_path: Path):
    path = str(tmp_path / "sub" / "s1.jsonl")
    fd, size = sync.create(path, "s1", header("s1"))
    try:
        with pytest.raises(SessionAlreadyOwnedError, match="is owned by"):
            sync.open_write(path, "s1")
        end = sync.flush("s1", fd, size, lines(ev(0), ev(1)), str(tmp_path / "sub"))
        assert end == os.path.getsize(path)
    finally:
        sync.release(fd, path, unlink=False)
    with pytest.raises(SessionAlreadyExistsError):
        sync.create(path, "s1", header("s1"))
    fd, log = sync.open_write(path, "s1")
    sync.release(fd, path, unlink=False)
    assert [e.seq for e in log.events] == [0, 1]
    assert log.header == header("s1")


def test_open_write_truncates_a_torn_tail(tmp_path: Path):
    path = tmp_path / "s1.jsonl"
    data = write_session(path, 1, b'{"torn')
    fd, log = sync.open_write(str(path), "s1")
    sync.release(fd, str(path), unlink=False)
    assert os.path.getsize(path) == len(data) - len(b'{"torn') == log.valid_end


def test_open_write_of_an_absent_or_empty_session_is_not_found(tmp_path: Path):
    with pytest.raises(SessionNotFoundError):
        sync.open_write(str(tmp_path / "none.jsonl"), "none")
    path = tmp_path / "s1.jsonl"
    write_session(path, 0)
    with pytest.raises(SessionNotFoundError):
        sync.open_write(str(path), "s1")


def test_a_header_only_file_is_reclaimed_by_create(tmp_path: Path):
    path = tmp_path / "s1.jsonl"
    write_session(path, 0)
    fd, size = sync.create(str(path), "s1", header("s1", agent_id="new"))
    sync.release(fd, str(path), unlink=False)
    assert sync.read_path(str(path)).header["agent_id"] == "new"
    assert size == os.path.getsize(path)


def test_flush_after_the_file_was_deleted_is_ownership_lost(tmp_path: Path):
    path = str(tmp_path / "s1.jsonl")
    fd, size = sync.create(path, "s1", header("s1"))
    try:
        sync.unlink(path)
        sync.unlink(path)  # absent: nothing to do
        with pytest.raises(SessionOwnershipLostError, match="was deleted while owned"):
            sync.flush("s1", fd, size, lines(ev(0)), None)
    finally:
        sync.release(fd, path, unlink=True)


def test_release_with_unlink_removes_the_file(tmp_path: Path):
    path = str(tmp_path / "s1.jsonl")
    fd, _ = sync.create(path, "s1", header("s1"))
    sync.release(fd, path, unlink=True)
    assert not os.path.exists(path)


def test_list_sessions_skips_empty_corrupt_and_foreign_files(tmp_path: Path):
    assert sync.list_sessions(str(tmp_path / "absent")) == []
    write_session(tmp_path / "a.jsonl", 2)
    write_session(tmp_path / "b.jsonl", 0)
    (tmp_path / "c.jsonl").write_bytes(b"junk\n" + lines(ev(0)))
    write_session(tmp_path / "d.txt", 1)
    infos = sync.list_sessions(str(tmp_path))
    assert [(i.session_id, i.event_count) for i in infos] == [("s1", 2)]
