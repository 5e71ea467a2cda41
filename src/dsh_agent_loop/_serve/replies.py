"""The server's JSON replies and errors, and reading a request's JSON body (docs/design.md#serve).

Every error the API gives is ``{"error": {"code", "message"}}`` with its status: handlers raise
``ApiError`` (or let a library error through: ``error_of`` maps the runtime's coded errors, so a
``SessionNotFoundError`` is a 404 ``SESSION_NOT_FOUND`` wherever it is raised). A body is read up
to ``MAX_BODY_BYTES`` within ``BODY_TIMEOUT`` seconds and must be one JSON object; fields are checked by the handler with
``field``, which names the bad one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, TypeVar, final

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse

from .._errors import (
    AgentLoopError,
    InvalidOptionError,
    LimitExceededError,
    SessionAlreadyExistsError,
    SessionNotFoundError,
    StoreError,
)
from .context import MAX_BODY_BYTES

T = TypeVar("T")

#: Seconds a request body may take to arrive (the headers' time is the server's keep-alive).
BODY_TIMEOUT: Final = 30.0

#: The status of each library error the API lets through (by class, most specific first).
_STATUS: Final = (
    (SessionNotFoundError, 404),
    (SessionAlreadyExistsError, 409),
    (LimitExceededError, 413),
    (InvalidOptionError, 400),
    (StoreError, 503),
)


@final
class ApiError(Exception):
    """An error reply: HTTP ``status``, a stable ``code`` and a message for people."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def error_reply(status: int, code: str, message: str) -> JSONResponse:
    """The JSON error body with ``status``."""
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def error_of(exc: BaseException) -> ApiError | None:
    """The reply for an error a handler let through, or None (not one the API maps)."""
    if isinstance(exc, ApiError):
        return exc
    for kind, status in _STATUS:
        if isinstance(exc, kind):
            code = exc.code if isinstance(exc, AgentLoopError) else "ERROR"
            if status == 400:
                code = "BAD_REQUEST"  # every 400 of the API has one code
            return ApiError(status, code, str(exc))
    return None


def bad(message: str) -> ApiError:
    """A 400 ``BAD_REQUEST``."""
    return ApiError(400, "BAD_REQUEST", message)


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request body, read up to ``limit`` bytes within ``BODY_TIMEOUT`` seconds.

    Raises:
        ApiError: 413 when it is larger, 408 ``REQUEST_TIMEOUT`` when it arrives slower.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "LIMIT_EXCEEDED", f"request body over {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    with trio.move_on_after(BODY_TIMEOUT) as late:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, "LIMIT_EXCEEDED", f"request body over {limit} bytes")
            chunks.append(chunk)
    if late.cancelled_caught:
        raise ApiError(408, "REQUEST_TIMEOUT", f"the body took over {BODY_TIMEOUT:g} s to arrive")
    return b"".join(chunks)


async def json_body(request: Request, *, empty_ok: bool = False) -> dict[str, Any]:
    """The request body as a JSON object (``{}`` for an empty body when ``empty_ok``).

    Raises:
        ApiError: 400 when it is not a JSON object, 413 when it is too large.
    """
    raw = await read_body(request)
    if not raw.strip() and empty_ok:
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        raise bad("the body is not valid JSON") from None
    if not isinstance(value, dict):
        raise bad("the body must be a JSON object")
    return value


def field(body: Mapping[str, Any], name: str, kind: type[T], default: T | None = None) -> T | None:
    """``body[name]`` when it is a ``kind`` (absent or null: ``default``).

    Raises:
        ApiError: 400 naming the field when it has another type.
    """
    value = body.get(name)
    if value is None:
        return default
    if kind is int and isinstance(value, bool):
        raise bad(f"field {name!r} must be an integer")
    if not isinstance(value, kind):
        raise bad(f"field {name!r} must be of type {kind.__name__}")
    return value
