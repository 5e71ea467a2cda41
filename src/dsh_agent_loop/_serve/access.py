"""Who may use the server: host, token and origin checks, before any route (docs/design.md#serve).

``Access`` wraps the app (plain ASGI, so streamed replies pass through untouched) and decides
each HTTP request in this order:

1. **Host.** On a loopback bind the ``Host`` header must name a loopback host (``127.0.0.1``,
   ``localhost``, ``[::1]``): a page elsewhere that rebinds its DNS name to 127.0.0.1 reaches the
   port, but with its own name in ``Host``, and gets 403 ``FORBIDDEN_HOST``.
2. **Token.** With a token, every request but the page itself (``/``, ``/static/...``) needs it:
   ``Authorization: Bearer T`` or the ``dsh_token`` cookie, compared in constant time; else 401
   ``UNAUTHORIZED``. ``GET /?token=T`` with the right token sets that cookie (``HttpOnly``,
   ``SameSite=Strict``) and redirects to ``/``, so the token leaves the address bar and history.
3. **Origin.** A state-changing request (any method but GET, HEAD and OPTIONS) that carries an
   ``Origin`` must be same-origin (the scheme and ``Host`` it was sent to), and one a browser
   marks ``Sec-Fetch-Site: cross-site`` is refused too: 403 ``FORBIDDEN_ORIGIN``. A browser always
   sends ``Origin`` on such a request, so a request without one comes from a program, which a
   cross-site page cannot make; with a token set it still needs the token.

Refusals are JSON errors like every other (``replies.py``); the token is never logged or echoed.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final, final
from urllib.parse import parse_qs

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The cookie ``/?token=`` sets.
COOKIE: Final = "dsh_token"
#: Host names a loopback bind answers to.
LOOPBACK_NAMES: Final = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
#: Methods that change nothing (no origin check).
SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})


def is_loopback(host: str) -> bool:
    """True for a host name or address only this machine reaches."""
    name = host.strip("[]").lower()
    return name in {"localhost", "::1"} or name.startswith("127.")


def _headers(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in scope.get("headers", ()):
        out.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
    return out


def _host_name(host: str) -> str:
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


async def _reply(send: Send, status: int, body: dict[str, Any], extra: list[Any]) -> None:
    data = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _refuse(send: Send, status: int, code: str, message: str) -> None:
    await _reply(send, status, {"error": {"code": code, "message": message}}, [])


@final
class Access:
    """The ASGI wrapper that applies the module's checks (see the module docstring)."""

    def __init__(self, app: App, *, token: str | None, bound_host: str) -> None:
        self.app = app
        self.token = token
        self.loopback_only = is_loopback(bound_host)

    def _has_token(self, headers: dict[str, str]) -> bool:
        assert self.token is not None
        expected = self.token.encode()
        auth = headers.get("authorization", "")
        scheme, _, given = auth.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected):
            return True
        cookie = _cookie(headers.get("cookie", ""), COOKIE)
        return cookie is not None and hmac.compare_digest(cookie.encode(), expected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check one request, then pass it on or refuse it."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        host = headers.get("host", "")
        if self.loopback_only and _host_name(host).lower() not in LOOPBACK_NAMES:
            await _refuse(send, 403, "FORBIDDEN_HOST", "this server answers to loopback names")
            return
        path: str = scope.get("path", "/")
        method: str = scope.get("method", "GET")
        if self.token is not None:
            if path == "/" and method == "GET" and await self._token_link(scope, send):
                return
            public = path == "/" or path.startswith("/static/")
            if not public and not self._has_token(headers):
                await _refuse(send, 401, "UNAUTHORIZED", "this server needs its access token")
                return
        if method not in SAFE_METHODS and not self._same_origin(scope, headers, host):
            await _refuse(
                send, 403, "FORBIDDEN_ORIGIN", "a state-changing request must be same-origin"
            )
            return
        await self.app(scope, receive, send)

    def _same_origin(self, scope: Scope, headers: dict[str, str], host: str) -> bool:
        if headers.get("sec-fetch-site", "").lower() == "cross-site":
            return False
        origin = headers.get("origin")
        if origin is None:
            return True
        scheme = scope.get("scheme", "http")
        return origin.lower() == f"{scheme}://{host}".lower()

    async def _token_link(self, scope: Scope, send: Send) -> bool:
        """Handle ``GET /?token=T``: set the cookie and redirect; True when it replied."""
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        given = query.get("token")
        if not given:
            return False
        assert self.token is not None
        if not hmac.compare_digest(given[0].strip().encode(), self.token.encode()):
            await _refuse(send, 401, "UNAUTHORIZED", "wrong access token")
            return True
        cookie = f"{COOKIE}={self.token}; HttpOnly; SameSite=Strict; Path=/"
        extra = [
            (b"location", b"/"),
            (b"set-cookie", cookie.encode()),
            (b"cache-control", b"no-store"),
        ]
        await _reply(send, 303, {"redirect": "/"}, extra)
        return True
