"""``open_http``: a streamable-HTTP MCP connection whose every message is bounded in size.

Design. The SDK reads a JSON answer with ``response.aread()``, whole, however long it is, and
bounds an SSE event at 1 MiB whatever the runtime's limit. Here the SDK gets an HTTP client whose
transport counts the bytes of each non-SSE body and fails it past the limit (an
``httpx2.StreamError``, which the SDK turns into an error answer to that request: the call fails
and the connection goes on), and the SSE limit is set to the same number (an event past it
fails that request's stream). A compressed body could hide any length behind a small one, so
the client asks for none, and a compressed non-SSE body is refused the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._spec import McpServer

__all__ = ["open_http"]


def _bodies(limit: int) -> tuple[Any, Any]:
    """Byte-stream wrappers: one that stops past ``limit`` bytes, one that refuses at once."""
    import httpx2

    class MessageTooLarge(httpx2.StreamError):
        """A body the runtime will not read (the SDK answers the request with this message)."""

    class Capped(httpx2.AsyncByteStream):
        def __init__(self, stream: Any) -> None:
            self._stream = stream

        async def __aiter__(self) -> AsyncIterator[bytes]:
            seen = 0
            async for chunk in self._stream:
                seen += len(chunk)
                if seen > limit:
                    raise MessageTooLarge(
                        f"the server's message was over the {limit:,}-byte limit for one MCP"
                        " message (limits.mcpMaxMessageBytes); it was dropped unread"
                    )
                yield chunk

        async def aclose(self) -> None:
            await self._stream.aclose()

    class Refused(Capped):
        def __init__(self, stream: Any, encoding: str) -> None:
            super().__init__(stream)
            self._encoding = encoding

        async def __aiter__(self) -> AsyncIterator[bytes]:
            raise MessageTooLarge(
                f"the server's message is compressed ({self._encoding}), which hides its"
                " length; it was refused unread"
            )
            yield b""  # pragma: no cover - makes this an async generator

    return Capped, Refused


def _capped_transport(limit: int) -> Any:
    """An ``httpx2`` transport whose non-SSE response bodies stop past ``limit`` bytes."""
    import httpx2

    capped, refused = _bodies(limit)

    class CappedTransport(httpx2.AsyncBaseTransport):
        def __init__(self) -> None:
            self._inner = httpx2.AsyncHTTPTransport()

        async def handle_async_request(self, request: Any) -> Any:
            response = await self._inner.handle_async_request(request)
            kind = response.headers.get("content-type", "").lower()
            if not kind.startswith("text/event-stream"):  # SSE: the SDK bounds each event
                encoding = response.headers.get("content-encoding", "identity").lower()
                if encoding not in ("", "identity"):
                    response.stream = refused(response.stream, encoding)
                else:
                    response.stream = capped(response.stream)
            return response

        async def aclose(self) -> None:
            await self._inner.aclose()

    return CappedTransport()


@contextlib.asynccontextmanager
async def open_http(spec: McpServer, limit: int) -> AsyncIterator[tuple[Any, Any]]:
    """Reach ``spec.url``; yields the session's (read, write) streams."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    assert spec.url is not None
    headers = {"Accept-Encoding": "identity", **(spec.headers or {})}
    client = httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(30.0, read=300.0),
        transport=_capped_transport(limit),
    )
    async with (
        client,
        streamable_http_client(spec.url, http_client=client, max_sse_event_size=limit) as streams,
    ):
        yield streams
