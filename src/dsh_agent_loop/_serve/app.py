"""``create_app``: the server's ASGI application, routes and error replies (docs/serve.md).

A Starlette app (it runs on trio through anyio; nothing in it starts an asyncio loop) wrapped in
``Access`` (host, token and origin checks: ``access.py``). Routes:

- the JSON API under ``/api`` (``api.py``), the event stream (``stream.py``), ``POST /agui``
  (``agui.py``), the reports (``reports.py``);
- the page: ``/`` is ``static/index.html`` and ``/static/...`` the files of the package's
  ``static`` folder, and nothing else on disk (Starlette's ``StaticFiles`` refuses any path that
  resolves outside it).

Every error is a JSON ``{"error": {code, message}}`` reply: an ``ApiError``, a coded error of the
runtime (``replies.error_of``), an unknown route (404 ``NOT_FOUND``), a wrong method (405
``METHOD_NOT_ALLOWED``). Any other exception is a 500 ``INTERNAL`` whose message names only its
type; the details go to the ``dsh_agent_loop.serve`` logger. Every reply carries
``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: no-referrer``; the page and the API
add a content security policy that lets the page load only its own files.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Final

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .._errors import AgentLoopError
from . import api, reports, stream
from .access import Access, App, Receive, Scope, Send
from .agui import agui_endpoint
from .context import ServeContext
from .digest import Digests
from .replies import ApiError, error_of, error_reply

#: The page's files.
STATIC: Final = Path(__file__).with_name("static")
#: What the page may load: its own scripts, styles and API, nothing from elsewhere.
PAGE_POLICY: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
    " connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_log = logging.getLogger("dsh_agent_loop.serve")


async def _index(request: Request) -> Response:
    return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")


async def _api_error(request: Request, exc: Exception) -> Response:
    mapped = error_of(exc)
    if mapped is None:
        _log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error_reply(500, "INTERNAL", f"the server failed ({type(exc).__name__})")
    return error_reply(mapped.status, mapped.code, mapped.message)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return error_reply(404, "NOT_FOUND", f"no such route: {request.url.path}")
    if exc.status_code == 405:
        return error_reply(405, "METHOD_NOT_ALLOWED", f"{request.method} is not allowed here")
    return error_reply(exc.status_code, "HTTP_ERROR", str(exc.detail))


def _routes() -> list[Any]:
    return [
        Route("/", _index, methods=["GET"]),
        Route("/api/sessions", api.list_sessions, methods=["GET"]),
        Route("/api/sessions", api.create, methods=["POST"]),
        Route("/api/sessions/{sid}", api.session_detail, methods=["GET"]),
        Route("/api/sessions/{sid}/events", api.session_events, methods=["GET"]),
        Route("/api/sessions/{sid}/stream", stream.session_stream, methods=["GET"]),
        Route("/api/sessions/{sid}/messages", api.send_message, methods=["POST"]),
        Route("/api/sessions/{sid}/cancel", api.cancel, methods=["POST"]),
        Route("/api/sessions/{sid}/approvals/{call_id}", api.decide, methods=["POST"]),
        Route("/api/agents", api.agents, methods=["GET"]),
        Route("/api/fleet", api.fleet, methods=["GET"]),
        Route("/api/reports", reports.list_reports, methods=["GET"]),
        Route("/reports/{name}", reports.report, methods=["GET"]),
        Route("/agui", agui_endpoint, methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]


class _Headers:
    """Adds the security headers of the module docstring to every reply."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                names = {key.lower() for key, _ in headers}
                headers.append((b"x-content-type-options", b"nosniff"))
                headers.append((b"referrer-policy", b"no-referrer"))
                if b"content-security-policy" not in names:
                    headers.append((b"content-security-policy", PAGE_POLICY.encode()))
                    headers.append((b"x-frame-options", b"DENY"))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


def create_app(ctx: ServeContext) -> App:
    """The server's ASGI app on ``ctx`` (module docstring)."""
    app = Starlette(
        routes=_routes(),
        exception_handlers={
            ApiError: _api_error,
            AgentLoopError: _api_error,
            HTTPException: _http_error,
            Exception: _api_error,
        },
    )
    app.state.ctx = ctx
    app.state.digests = Digests(ctx.client.store)
    app.state.streams = 0  # event streams open now (stream.py)
    return _Headers(Access(app, token=ctx.token, bound_host=ctx.bound_host))
