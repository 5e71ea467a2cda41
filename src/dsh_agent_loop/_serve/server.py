"""``serve``: run the server on a store until cancelled (docs/serve.md).

It opens a fleet client on the store (the server is a client only: workers run the agents),
builds the app and serves it with Hypercorn's trio worker inside the caller's trio run: no
thread, no asyncio loop, no process of its own. ``task_status.started`` reports the address it
listens on (port 0 picks a free port). Cancelling the caller's scope stops it: the open
connections (event streams among them) close, then the client's database connections.

A non-loopback ``host`` needs a token (``ServeError`` otherwise), and a token must be 16 to 256
characters a cookie can carry unchanged (letters, digits, ``-._~+/=``): the page's cookie holds
it verbatim.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve

from .._agent.options import AgentOptions
from .._errors import ConfigError
from .._session.store import SessionStore
from ..fleet import open_client
from .access import is_loopback
from .app import create_app
from .context import ServeContext

#: A token's form.
TOKEN: Final = re.compile(r"[A-Za-z0-9._~+/=-]{16,256}")


def check_access(host: str, token: str | None) -> None:
    """Refuse a bind the access rules forbid (module docstring).

    Raises:
        ConfigError: a non-loopback host without a token, or a malformed token.
    """
    if token is not None and not TOKEN.fullmatch(token):
        raise ConfigError(
            "serve: the token must be 16 to 256 characters of letters, digits and -._~+/="
        )
    if token is None and not is_loopback(host):
        raise ConfigError(
            f"serve: --host {host} is reachable from other machines: give it --token"
            " (or DSH_AGENT_TOKEN), or bind to 127.0.0.1"
        )


def _bind(host: str, port: int) -> str:
    return f"[{host.strip('[]')}]:{port}" if ":" in host.strip("[]") else f"{host}:{port}"


async def serve(
    store: SessionStore,
    *,
    agents: Sequence[AgentOptions] = (),
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    reports_dir: Path | None = None,
    max_streams: int = 256,
    command_wait: float = 10.0,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the API, the page and AG-UI for ``store`` until cancelled.

    ``agents``: the options ``POST /api/sessions`` and ``/agui`` create sessions of (the first
    is the default; none: creating is refused). ``max_streams``: event streams open at once.
    ``command_wait``: seconds a cancel or decision waits for a worker before replying 202.

    Raises:
        ConfigError: the access rules refuse the bind, or the store cannot carry a fleet.
        OSError: the address cannot be bound.
    """
    check_access(host, token)
    config = Config()
    config.bind = [_bind(host, port)]
    config.accesslog = None
    config.errorlog = logging.getLogger("dsh_agent_loop.serve")
    config.keep_alive_timeout = 30
    async with open_client(store) as client:
        ctx = ServeContext(
            client=client,
            agents={options.id: options for options in agents},
            token=token,
            reports_dir=reports_dir,
            bound_host=host,
            max_streams=max_streams,
            command_wait=command_wait,
        )
        app = create_app(ctx)
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                lambda task_status: hypercorn_serve(
                    app,  # type: ignore[arg-type]
                    config,
                    task_status=task_status,
                )
            )
            task_status.started(str(binds[0]))
