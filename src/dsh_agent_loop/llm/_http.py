"""HTTP plumbing shared by the streaming adapters: clients, failure mapping, the SSE pump.

Failure mapping (docs/design.md#failure-mapping): 401/403 → ``AUTH`` naming the key's env var, 429 →
``HTTP_429``,
5xx and 529 → ``HTTP_5XX``, a 400/413 whose body says the context window is exceeded →
``CONTEXT_OVERFLOW``, other 4xx → ``HTTP_4XX`` with the provider's message; a connect
failure → ``CONNECTION``, any timeout → ``TIMEOUT``, a transport error once the body streams or
a stream that ends without a finish → ``STREAM_CUT``, a 200 that is not ``text/event-stream`` or
a malformed frame → ``BAD_STREAM``. ``Retry-After`` (seconds or an HTTP date, or OpenAI's
``retry-after-ms``) is capped at 60 s.

The pump never raises (only ``trio.Cancelled`` escapes): every failure, before or during the
stream, is yielded as one ``Finish(reason="error")`` after whatever chunks were delivered. A
frame decoder that has seen the provider's end marker stops the pump; the rest of the body is
then drained briefly so that the connection goes back to the pool instead of being closed.

The pump reads within the provider's ``StreamLimits``: a line or event over its byte cap, or
more streamed text, reasoning and arguments than ``max_output_chars``, is ``BAD_STREAM``; a
stream that yields no chunk for ``idle_timeout`` seconds (keep-alives do not count) is
``TIMEOUT``. Every failure message it yields is redacted with the request's secrets (its key
and configured header values, ``_secrets.py``).
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import aclosing
from datetime import UTC
from typing import Any, Final, final

import attrs
import httpx
import trio

from .._frozen import json_default
from ._base import Chunk, Failure, Finish, ModelRequest
from ._reader import BodyReader, FrameDecoder
from ._secrets import check_headers, read_api_key, redact
from ._stream_limits import DEFAULT_STREAM_LIMITS, StreamLimits

__all__ = [
    "DEFAULT_TIMEOUT",
    "ClientPool",
    "FrameDecoder",
    "TimeoutSpec",
    "endpoint",
    "error_finish",
    "error_message",
    "failed_stream",
    "parse_retry_after",
    "post_stream",
    "read_api_key",
    "resolve_limits",
    "status_failure",
    "stream_sse",
    "token_count",
    "transport_failure",
    "with_defaults",
]

TimeoutSpec = float | tuple[float | None, float | None] | Mapping[str, float | None]
"""A timeout: one number, ``(connect, read)``, or ``{connect, read}``."""

DEFAULT_TIMEOUT: Final = (10.0, 300.0)
RETRY_AFTER_CAP: Final = 60.0
_ERROR_BODY_LIMIT: Final = 64 * 1024
_DRAIN_SECONDS: Final = 1.0
"""How long to wait for the end of a body after the provider's end marker (connection reuse)."""


def endpoint(base_url: str, path: str) -> str:
    """``base_url`` (trailing slashes ignored) joined with ``path``.

    Raises:
        ValueError: ``base_url`` is not an ``http``/``https`` URL with a host, or it carries a
            user name or password (httpx would send them as Basic auth instead of the key; the
            message does not quote such a URL).
    """
    url = base_url.rstrip("/") + path
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        if "@" in base_url:
            raise ValueError("invalid base_url (not shown: it contains '@')") from None
        raise ValueError(f"invalid base_url {base_url!r}: {exc}") from None
    if parsed.userinfo:
        raise ValueError(
            "base_url must not carry a user name or password (user:pass@); use api_key_env"
        )
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"base_url must be an http:// or https:// URL, not {base_url!r}")
    return url


def make_timeout(timeout: TimeoutSpec) -> httpx.Timeout:
    """An ``httpx.Timeout`` from a number, ``(connect, read)`` or ``{connect, read}``."""
    if isinstance(timeout, int | float):
        return httpx.Timeout(float(timeout))
    if isinstance(timeout, Mapping):
        connect = timeout.get("connect", DEFAULT_TIMEOUT[0])
        read = timeout.get("read", DEFAULT_TIMEOUT[1])
    else:
        connect, read = timeout
    # Writing a large request is bounded like reading; waiting for a pool slot like connecting.
    return httpx.Timeout(connect=connect, read=read, write=read, pool=connect)


@final
class ClientPool:
    """One adapter's pooled ``httpx.AsyncClient``, created on first use and closed by ``aclose``.

    There is no connection limit: how many calls run at once is the runtime's decision.

    Raises:
        ValueError: a header name or value that cannot be sent (``_secrets.check_headers``).
    """

    def __init__(
        self,
        *,
        headers: Mapping[str, str] | None,
        timeout: TimeoutSpec,
        transport: httpx.AsyncBaseTransport | None,
    ) -> None:
        self._headers = check_headers(headers)
        self._timeout = make_timeout(timeout)
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    def get(self) -> httpx.AsyncClient:
        """The client, created now if needed (again after ``aclose``)."""
        if self._client is None:
            self._client = httpx.AsyncClient(
                headers=self._headers,
                timeout=self._timeout,
                transport=self._transport,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            )
        return self._client

    @property
    def read_timeout(self) -> float | None:
        """The client's read timeout in seconds (None: none)."""
        return self._timeout.read

    async def aclose(self) -> None:
        """Close the client and its connections."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


def resolve_limits(limits: StreamLimits | None, read_timeout: float | None) -> StreamLimits:
    """``limits`` (None: the defaults) with an unset ``idle_timeout`` taken from the read timeout.

    Without a read timeout either, the idle limit is the default read timeout (300 s).
    """
    limits = DEFAULT_STREAM_LIMITS if limits is None else limits
    if limits.idle_timeout is not None:
        return limits
    return attrs.evolve(limits, idle_timeout=read_timeout or DEFAULT_TIMEOUT[1])


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (seconds or HTTP date), capped at 60 s.

    Args:
        value: The header value, or None.
        now: The current Unix time for HTTP dates (default: ``time.time()``).

    Returns:
        Seconds in ``[0, 60]``, or None when absent or unparseable.
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_CAP)


def _retry_after(headers: httpx.Headers) -> float | None:
    seconds = parse_retry_after(headers.get("retry-after"))
    if seconds is None and (ms := headers.get("retry-after-ms")) is not None:
        try:
            value = float(ms) / 1000.0
        except ValueError:
            return None
        if math.isfinite(value):
            seconds = min(max(value, 0.0), RETRY_AFTER_CAP)
    return seconds


#: What providers say when a request does not fit the model's context window (OpenAI and
#: compatible servers: ``context_length_exceeded`` / "maximum context length"; Anthropic:
#: "prompt is too long", "exceed context limit"; others: "context window", "too many tokens").
_OVERFLOW: Final = re.compile(
    r"context[_ ]length[_ ]exceeded|maximum context length|context window|context limit"
    r"|prompt is too long|too many (?:input )?tokens|input is too long|reduce the length",
    re.IGNORECASE,
)


def is_context_overflow(status: int, body: bytes) -> bool:
    """Whether an error response says the request exceeds the model's context window."""
    if status not in (400, 413, 422):
        return False
    return _OVERFLOW.search(body.decode("utf-8", "replace")[:4000]) is not None


def provider_message(body: bytes) -> str:
    """The provider's error message from an error body (JSON ``error.message`` or the text)."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data: Any = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, str):
            return error
        if isinstance(error, dict):
            for key in ("message", "detail", "msg"):
                if isinstance(error.get(key), str):
                    return str(error[key])
    return text[:500]


def error_message(error: Any) -> str:
    """The provider's own text in an in-stream error payload.

    Its ``message`` (or ``detail``, ``msg``), else its ``type``, else the payload as JSON; a
    string payload is the text itself.
    """
    if isinstance(error, str):
        return error
    if isinstance(error, Mapping):
        for key in ("message", "detail", "msg", "type"):
            value = error.get(key)
            if isinstance(value, str) and value:
                return value
    return json.dumps(error, ensure_ascii=False, default=str)[:500]


def token_count(data: Mapping[str, Any], key: str) -> int | None:
    """The token count ``data[key]`` of a usage object (None when absent or null).

    Raises:
        ValueError: the value is not a non-negative integer (a frame the decoder cannot read).
    """
    value = data.get(key)
    if value is None or (type(value) is int and value >= 0):
        return value
    raise ValueError(f"usage {key} is not a token count: {value!r}")


def status_failure(
    status: int, headers: httpx.Headers, body: bytes, *, key_env: str | None
) -> Failure:
    """The failure for a non-success HTTP status."""
    detail = provider_message(body) or httpx.codes.get_reason_phrase(status)
    retry_after = _retry_after(headers)
    if status in (401, 403):
        where = (
            f"check the API key in environment variable {key_env}"
            if key_env
            else "no api_key_env is configured for this provider"
        )
        return Failure("AUTH", f"HTTP {status}: {detail} ({where})", status=status)
    if status == 429:
        return Failure("HTTP_429", f"HTTP 429: {detail}", status, retry_after)
    if status >= 500:  # 529 (Anthropic "overloaded") included
        return Failure("HTTP_5XX", f"HTTP {status}: {detail}", status, retry_after)
    if is_context_overflow(status, body):
        return Failure("CONTEXT_OVERFLOW", f"HTTP {status}: {detail}", status)
    if 400 <= status < 500:
        return Failure("HTTP_4XX", f"HTTP {status}: {detail}", status)
    return Failure("PROVIDER_ERROR", f"unexpected HTTP {status}: {detail}", status)


#: Which timeout an httpx timeout exception is, and what the client was doing then.
_TIMEOUTS: Final = (
    (httpx.ConnectTimeout, "connect", "connecting to the server"),
    (httpx.ReadTimeout, "read", "waiting for the server to send more"),
    (httpx.WriteTimeout, "write", "sending the request"),
    (httpx.PoolTimeout, "pool", "waiting for a free connection"),
)


def timeout_text(exc: httpx.TimeoutException) -> str:
    """``read timeout (300 s) expired while waiting for the server to send more``."""
    found = next((entry for entry in _TIMEOUTS if isinstance(exc, entry[0])), None)
    if found is None:
        return f"timed out ({type(exc).__name__})"
    _, name, doing = found
    try:
        seconds = exc.request.extensions.get("timeout", {}).get(name)
    except RuntimeError:  # an exception raised without a request
        seconds = None
    limit = f" ({seconds:g} s)" if isinstance(seconds, int | float) else ""
    return f"{name} timeout{limit} expired while {doing}"


def transport_failure(exc: httpx.HTTPError, *, started: bool) -> Failure:
    """The failure for an httpx exception; ``started``: the response body was streaming."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return Failure("TIMEOUT", timeout_text(exc))
    if isinstance(exc, httpx.DecodingError):
        return Failure("BAD_STREAM", text)
    if started:
        return Failure("STREAM_CUT", f"stream cut: {text}")
    return Failure("CONNECTION", text)


def error_finish(code: str, message: str) -> Finish:
    """An ``error`` finish with a fresh failure."""
    return Finish("error", failure=Failure(code, message))


async def failed_stream(failure: Failure) -> AsyncGenerator[Chunk, None]:
    """A stream that yields only the error finish for ``failure``."""
    yield Finish("error", failure=failure)


async def _discard(pieces: AsyncIterator[bytes], seconds: float) -> None:
    """Read and drop the rest of a body for at most ``seconds`` (0: stop at the next read).

    httpx reads a body through nested async generators and closing the outer one leaves the
    inner ones suspended (trio then warns when they are collected). Running the iteration to
    its end, or cancelling it at a read, finishes every layer.
    """
    with trio.move_on_after(seconds):
        try:
            async for _ in pieces:
                pass
        except httpx.HTTPError:
            pass  # nothing more to learn from this body


async def _error_body(response: httpx.Response) -> bytes:
    body = bytearray()
    pieces = response.aiter_bytes()
    try:
        async for piece in pieces:
            body += piece
            if len(body) >= _ERROR_BODY_LIMIT:
                break
    except httpx.HTTPError:
        pass  # the status says enough
    await _discard(pieces, 0)
    return bytes(body)


async def _check_response(response: httpx.Response, key_env: str | None) -> Failure | None:
    status = response.status_code
    if not 200 <= status < 300:
        return status_failure(
            status, response.headers, await _error_body(response), key_env=key_env
        )
    ctype = response.headers.get("content-type", "")
    if ctype.split(";", 1)[0].strip().lower() != "text/event-stream":
        snippet = provider_message((await _error_body(response))[:2000])[:200]
        return Failure(
            "BAD_STREAM",
            f"expected text/event-stream, got {ctype or 'no content type'}: {snippet}",
            status,
        )
    return None


def _scrub(chunk: Chunk, secrets: Sequence[str]) -> Chunk:
    """``chunk``, its failure message redacted when it is an error finish."""
    if not secrets or type(chunk) is not Finish or chunk.failure is None:
        return chunk
    message = redact(chunk.failure.message, secrets)
    if message == chunk.failure.message:
        return chunk
    return attrs.evolve(chunk, failure=attrs.evolve(chunk.failure, message=message))


def _idle_failure(seconds: float) -> Failure:
    return Failure(
        "TIMEOUT",
        f"idle timeout ({seconds:g} s) expired: the stream made no progress "
        "(keep-alive comments, blank lines and empty frames do not count)",
    )


async def stream_sse(
    client: httpx.AsyncClient,
    url: str,
    *,
    headers: Mapping[str, str],
    body: bytes,
    decoder: FrameDecoder,
    key_env: str | None,
    limits: StreamLimits = DEFAULT_STREAM_LIMITS,
    secrets: Sequence[str] = (),
) -> AsyncGenerator[Chunk, None]:
    """POST ``body`` to ``url`` and yield the decoded chunks; never raises (see module doc).

    Args:
        client: The provider's pooled client.
        url: The endpoint.
        headers: This request's headers (its auth included).
        body: The JSON body.
        decoder: The provider's frame decoder, fresh for this attempt.
        key_env: The key's env var, named by an ``AUTH`` failure.
        limits: The stream limits (an unset ``idle_timeout``: 300 s).
        secrets: Texts redacted from every failure message (``_secrets.secret_forms``).
    """
    try:
        request = client.build_request("POST", url, headers=headers, content=body)
        response = await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        yield _scrub(Finish("error", failure=transport_failure(exc, started=False)), secrets)
        return
    pieces: AsyncIterator[bytes] | None = None
    try:
        failure = await _check_response(response, key_env)
        if failure is not None:
            yield _scrub(Finish("error", failure=failure), secrets)
            return
        pieces = response.aiter_bytes()
        reader = BodyReader(decoder, limits)
        async with aclosing(_read_body(pieces, reader, limits.idle_timeout)) as chunks:
            async for chunk in chunks:
                yield _scrub(chunk, secrets)
    finally:
        try:
            if pieces is not None:
                await _discard(pieces, 0)
        finally:
            await response.aclose()


async def _read_body(
    pieces: AsyncIterator[bytes], reader: BodyReader, idle: float | None
) -> AsyncGenerator[Chunk, None]:
    """The chunks of a 200 event-stream body, ending with its finish (see ``stream_sse``)."""
    idle = idle or DEFAULT_TIMEOUT[1]
    deadline = trio.current_time() + idle
    cut: Failure | None = None
    while True:
        try:
            with trio.move_on_at(deadline) as waiting:
                piece = await anext(pieces)
        except StopAsyncIteration:
            break
        except httpx.HTTPError as exc:
            cut = transport_failure(exc, started=True)
            break
        if waiting.cancelled_caught:
            cut = _idle_failure(idle)
            break
        chunks = reader.decode(piece)
        if not chunks:
            continue
        deadline = trio.current_time() + idle
        last = chunks[-1]
        if isinstance(last, Finish):
            for chunk in chunks[:-1]:
                yield chunk
            if last.failure is None:  # let the connection go back to the pool
                await _discard(pieces, _DRAIN_SECONDS)
            yield last
            return
        for chunk in chunks:
            yield chunk
    for chunk in reader.final(cut):
        yield chunk


def with_defaults(request: ModelRequest, defaults: Mapping[str, Any]) -> ModelRequest:
    """``request`` with the adapter defaults under its config (explicit fields win)."""
    if all(key in request.config for key in defaults):
        return request
    return ModelRequest({**defaults, **request.config}, request.messages, request.tools)


def post_stream(
    pool: ClientPool,
    url: str,
    body: Mapping[str, Any],
    *,
    auth: Mapping[str, str],
    decoder: FrameDecoder,
    key_env: str | None,
    limits: StreamLimits = DEFAULT_STREAM_LIMITS,
    secrets: Sequence[str] = (),
) -> AsyncGenerator[Chunk, None]:
    """Stream one attempt: POST ``body`` as JSON with ``auth`` headers (see ``stream_sse``)."""
    headers = {"accept": "text/event-stream", "content-type": "application/json", **auth}
    return stream_sse(
        pool.get(),
        url,
        headers=headers,
        body=json.dumps(
            body, ensure_ascii=False, separators=(",", ":"), default=json_default
        ).encode(),
        decoder=decoder,
        key_env=key_env,
        limits=limits,
        secrets=secrets,
    )
