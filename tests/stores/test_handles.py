"""``stores/_handles.py``: the one read handle, and the staged write handle's close/abort."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from dsh_agent_loop._errors import SessionOwnershipLostError, StoreError
from dsh_agent_loop.events import Event
from dsh_agent_loop.stores._handles import (
    RELEASE_GRACE,
    StagedWriteHandle,
    Staging,
    StoreReadHandle,
)

from .conftest import ev

Rows = Staging[str]


class FakeBackend:
    """A ``StagingBackend`` over a list; flushes can be made to hang or fail."""

    def __init__(self) -> None:
        self.stored: list[Event] = []
        self.released: list[tuple[str, int]] = []
        self.patience: list[float] = []
        self.slow_release = False
        self.hang = False
        self.flush_error: StoreError | None = None

    async def fetch(self, staging: Rows, start: int, stop: int) -> list[Event]:
        await trio.lowlevel.checkpoint()
        return self.stored[start:stop]

    async def flush(self, staging: Rows) -> None:
        if self.hang:
            await trio.sleep_forever()
        await trio.lowlevel.checkpoint()
        if self.flush_error is not None:
            raise self.flush_error
        staging.pending_rows(lambda event: str(event.seq))
        self.stored.extend(staging.staged)
        staging.committed(len(staging.staged))

    async def renew(self, staging: Rows) -> None:
        await trio.lowlevel.checkpoint()

    async def release(self, staging: Rows, patience: float) -> None:
        self.patience.append(patience)
        await trio.lowlevel.checkpoint()
        if self.slow_release:
            raise trio.TooSlowError
        self.released.append((staging.session_id, len(staging.staged)))


def make(backend: FakeBackend, close_timeout: float = 10.0) -> StagedWriteHandle[str]:
    staging = Staging[str]("s1", "token", 0)
    return StagedWriteHandle(backend, staging, {"session_id": "s1"}, close_timeout)


async def test_read_handle_reads_through_its_range_and_checks_it() -> None:
    calls: list[tuple[int, int | None]] = []

    async def read_range(start: int, stop: int | None) -> list[Event]:
        calls.append((start, stop))
        await trio.lowlevel.checkpoint()
        return [ev(i) for i in range(5)][start:stop]

    handle = StoreReadHandle("s1", {"session_id": "s1"}, read_range)
    assert (handle.session_id, handle.header) == ("s1", {"session_id": "s1"})
    assert await handle.read(1, 2) == [ev(1), ev(2)]
    assert await handle.read(3) == [ev(3), ev(4)]
    assert calls == [(1, 3), (3, None)]
    with pytest.raises(ValueError, match="negative"):
        await handle.read(-1)
    await handle.close()


async def test_read_spans_stored_and_staged_events() -> None:
    backend = FakeBackend()
    handle = make(backend)
    await handle.append([ev(0), ev(1)])
    await handle.flush()
    await handle.append([ev(2)])
    assert await handle.read(1) == [ev(1), ev(2)]
    assert backend.stored == [ev(0), ev(1)]


async def test_close_flushes_then_releases_and_is_idempotent() -> None:
    backend = FakeBackend()
    handle = make(backend)
    await handle.append([ev(0)])
    await handle.close()
    await handle.close()
    assert backend.stored == [ev(0)]
    assert backend.released == [("s1", 0)]
    with pytest.raises(trio.ClosedResourceError):
        await handle.append([ev(1)])


async def test_close_past_its_timeout_drops_unflushed_and_still_releases(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = FakeBackend()
    handle = make(backend, close_timeout=2.0)
    await handle.append([ev(0), ev(1)])
    backend.hang = True
    start = trio.current_time()
    with pytest.raises(StoreError, match=r"close timed out after 2.0s; 2 unflushed events"):
        await handle.close()
    assert math.isclose(trio.current_time() - start, 2.0)
    assert backend.released == [("s1", 0)]  # staged events dropped before the release
    assert backend.patience == [RELEASE_GRACE]  # past the deadline: a short grace
    assert backend.stored == []


async def test_a_release_out_of_patience_is_a_timed_out_close(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = FakeBackend()
    handle = make(backend, close_timeout=3.0)
    await handle.append([ev(0)])
    backend.slow_release = True
    with pytest.raises(StoreError, match="releasing ownership timed out"):
        await handle.close()
    assert backend.stored == [ev(0)]  # flushed first
    assert backend.patience == [pytest.approx(3.0)]  # what is left of close_timeout


async def test_a_flush_error_surfaces_after_the_release() -> None:
    backend = FakeBackend()
    handle = make(backend)
    await handle.append([ev(0)])
    backend.flush_error = StoreError("disk full")
    with pytest.raises(StoreError, match="disk full"):
        await handle.close()
    assert backend.released == [("s1", 0)]


async def test_abort_drops_staged_events_and_releases_even_when_cancelled() -> None:
    backend = FakeBackend()
    handle = make(backend)
    await handle.append([ev(0)])
    with trio.CancelScope() as scope:
        scope.cancel()
        await handle.abort()  # shielded: the release happens anyway
    assert backend.released == [("s1", 0)]
    assert backend.stored == []
    await handle.abort()  # closed already: a no-op
    assert len(backend.released) == 1


async def test_a_failed_staging_refuses_every_write() -> None:
    staging = Staging[str]("s2", "token", 0)
    lost = SessionOwnershipLostError("session 's2': write ownership was lost")
    assert staging.fail(lost) is lost
    handle = StagedWriteHandle(FakeBackend(), staging, {"session_id": "s2"}, 10.0)
    for call in (handle.append([ev(0)]), handle.flush(), handle.renew()):
        with pytest.raises(SessionOwnershipLostError):
            await call


def test_an_event_that_cannot_be_encoded_fails_the_staging_for_good() -> None:
    staging = Staging[str]("s1", "token", 0, staged=[ev(0), ev(1)])

    def encode(event: Event) -> str:
        if event.seq == 1:
            raise TypeError("not encodable")
        return str(event.seq)

    with pytest.raises(StoreError, match="cannot be stored") as info:
        staging.pending_rows(encode)
    assert isinstance(info.value.__cause__, TypeError)
    assert staging.failure is info.value
    assert staging.rows == []  # nothing half-encoded is kept
