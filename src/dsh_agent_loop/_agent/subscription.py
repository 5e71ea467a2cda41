"""Subscribers of one agent: bounded trio channels that never end silently.

See docs/design.md#notifications.

The agent delivers with ``send_nowait`` and never waits for a reader. A subscriber that falls
``max_buffer`` events behind is marked overflowed: its send side is closed, so the reader still
gets everything that was buffered, and each event it would have received from then on is
counted. Where the reader would have met a clean ``EndOfChannel`` it gets
``SubscriberOverflowError`` naming that count: lost events can never pass for the end of a
stream. A subscriber costs the agent one ``offer`` call per event; an agent without subscribers
pays nothing (the driver tests its list first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import final

import trio

from .._errors import SubscriberOverflowError
from ..events import Event

__all__ = ["Subscriber", "Subscription"]


@final
class Subscriber:
    """The agent's side of one subscription: the send channel, its filter and its losses."""

    __slots__ = ("accept", "done", "max_buffer", "missed", "send", "types")

    def __init__(
        self,
        send: trio.MemorySendChannel[Event],
        types: frozenset[str] | None,
        max_buffer: float,
        *,
        accept: Callable[[Event], bool] | None = None,
    ) -> None:
        self.send = send
        self.types = types
        self.accept = accept
        """A finer filter than ``types`` (a stream keeps only its own turn's events)."""
        self.max_buffer = max_buffer
        self.missed = 0
        """Events not delivered since the buffer overflowed (0: none lost)."""
        self.done = False
        """The reader saw the overflow: the agent may forget this subscriber."""

    def offer(self, event: Event) -> bool:
        """Deliver ``event`` if it passes the filter; False once the agent should drop this."""
        if self.missed:
            if self.done:
                return False
            if self.types is None or event.type in self.types:
                self.missed += 1
            return True
        if self.types is not None and event.type not in self.types:
            return True
        if self.accept is not None and not self.accept(event):
            return True
        try:
            self.send.send_nowait(event)
        except trio.WouldBlock:
            self.missed = 1  # the reader drains the buffer, then learns what it lost
            self.send.close()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return True


@final
class Subscription(trio.abc.ReceiveChannel[Event]):
    """What ``Agent.subscribe()`` yields: a receive channel that reports an overflow.

    It behaves like the ``trio.MemoryReceiveChannel`` it wraps, except that a subscriber that
    fell behind gets ``SubscriberOverflowError`` after the buffered events (and again on every
    later ``receive``) instead of ``EndOfChannel``.
    """

    def __init__(self, recv: trio.MemoryReceiveChannel[Event], subscriber: Subscriber) -> None:
        self._recv = recv
        self._subscriber = subscriber
        self._overflow: SubscriberOverflowError | None = None

    @property
    def missed(self) -> int:
        """Events lost so far (0 while the subscriber keeps up)."""
        return self._subscriber.missed

    def _end(self) -> BaseException:
        sub = self._subscriber
        if not sub.missed:
            return trio.EndOfChannel()
        if self._overflow is None:
            sub.done = True
            self._overflow = SubscriberOverflowError(
                f"the subscriber fell {sub.max_buffer:g} events behind and missed {sub.missed}",
                missed=sub.missed,
            )
        return self._overflow

    def receive_nowait(self) -> Event:
        """The next buffered event, without waiting.

        Raises:
            trio.WouldBlock: nothing is buffered.
            trio.EndOfChannel: the subscription ended cleanly.
            SubscriberOverflowError: the buffer overflowed and every buffered event was read.
        """
        try:
            return self._recv.receive_nowait()
        except trio.EndOfChannel:
            raise self._end() from None

    async def receive(self) -> Event:
        """The next event, waiting for one.

        Raises:
            trio.EndOfChannel: the subscription ended cleanly.
            SubscriberOverflowError: the buffer overflowed and every buffered event was read.
        """
        try:
            return await self._recv.receive()
        except trio.EndOfChannel:
            raise self._end() from None

    def close_sender(self) -> None:
        """End the subscription from the agent's side: buffered events, then ``EndOfChannel``."""
        self._subscriber.send.close()

    def statistics(self) -> trio.MemoryChannelStatistics:
        """The wrapped channel's statistics (``current_buffer_used``, ...)."""
        return self._recv.statistics()

    async def aclose(self) -> None:
        """Close the receive side (the agent drops the subscriber at its next event)."""
        await self._recv.aclose()
