"""``dsh-agent serve``: the HTTP API, the live event stream, AG-UI and the web page (docs/serve.md).

The server is a fleet client (docs/design.md#serve): it reads the store and writes messages and
commands into the fleet's tables; ``dsh-agent worker`` processes run the agents. So the store
must be SQLite or PostgreSQL (any other is a usage error, exit 2, as for ``send``). Of
``--config`` the server reads the store and the declared agents: ``POST /api/sessions`` and
``/agui`` create sessions of them (the first is the default); without a config, of the offline
echo agent a worker without a config serves too. No agent starts here and no provider is
contacted.

Access (``_serve/access.py``): the default host is 127.0.0.1; any other host needs a token
(``--token``, else ``$DSH_AGENT_TOKEN``; surrounding whitespace is dropped) and the verb refuses
to start without one (exit 2). The token is never printed.

Output: one line once the port is bound, ``serving http://HOST:PORT/`` (``--port 0`` picks a free
port), then the server's warnings on stderr. SIGTERM or SIGINT stops it (exit 0). Without the
``serve`` extra the verb exits 2 naming what to install.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
from pathlib import Path
from typing import Any, Final

import trio
from rich.console import Console

from .._agent.options import AgentOptions
from .._compose import options_from_entry
from .._errors import ConfigError
from .._session.store import SessionStore
from ..config import RuntimeConfig
from ._fleet import fleet_store
from ._setup import EXIT_OK, EXIT_USAGE, CliError, load_cli_config, make_store, store_url
from ._terminal import TerminalGuard, consoles

__all__ = ["add_serve_verb"]

#: The modules the ``serve`` extra brings.
EXTRA_MODULES: Final = ("starlette", "hypercorn", "ag_ui")
#: The environment variable a token may come from.
TOKEN_ENV: Final = "DSH_AGENT_TOKEN"


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {text!r}")
    return value


def add_serve_verb(verbs: Any, common: argparse.ArgumentParser) -> None:
    """Add ``serve`` to the verb parsers."""
    serve = verbs.add_parser(
        "serve",
        parents=[common],
        help="serve the sessions over HTTP: JSON API, live stream, AG-UI and a web page",
        description="Serve the store's sessions: a JSON API, Server-Sent Events of each"
        " session's log, AG-UI at /agui and a web page at /. Workers (dsh-agent worker) run"
        " the agents; this process only reads and sends. Needs the serve extra:"
        " pip install 'dsh-agent-loop[serve]'.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument(
        "--port", type=_port, default=8765, help="port (default 8765; 0: any free port)"
    )
    serve.add_argument(
        "--token",
        metavar="T",
        help=f"access token (default ${TOKEN_ENV}); required for a non-loopback --host",
    )
    serve.add_argument(
        "--reports", metavar="DIR", help="serve the simulation reports (*.html) in DIR"
    )
    serve.set_defaults(handler=serve_verb)


def _check_extra() -> None:
    missing = [name for name in EXTRA_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise CliError(
            f"serve: the server needs the serve extra ({', '.join(missing)} not installed):"
            " pip install 'dsh-agent-loop[serve]'",
            EXIT_USAGE,
        )


def _agents(config: RuntimeConfig | None) -> list[AgentOptions]:
    if config is None or not config.agents:
        from ._chat import echo_config

        config, _ = echo_config()
    return [options_from_entry(entry)[0] for entry in config.agents]


def _reports_dir(value: str | None) -> Path | None:
    if value is None:
        return None
    folder = Path(value)
    if not folder.is_dir():
        raise CliError(f"serve: --reports {value}: not a directory", EXIT_USAGE)
    return folder


def serve_verb(args: argparse.Namespace, guard: TerminalGuard) -> int:
    """``dsh-agent serve``: check, resolve, then serve until a signal; the exit code."""
    _check_extra()
    from .._serve.server import check_access

    raw = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
    token = raw.strip() if raw is not None and raw.strip() else None
    if token is not None:
        guard.add_secret(token)
    try:
        check_access(args.host, token)
    except ConfigError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    config = load_cli_config(getattr(args, "config", None))
    agents = _agents(config)
    url = store_url(getattr(args, "store", None), config)
    guard.add_store_url(url)
    store = make_store(url)
    fleet_store(store, "serve")
    reports = _reports_dir(args.reports)
    console, _ = consoles(guard)
    return trio.run(lambda: _serve(store, agents, args.host, args.port, token, reports, console))


async def _serve(
    store: SessionStore,
    agents: list[AgentOptions],
    host: str,
    port: int,
    token: str | None,
    reports: Path | None,
    console: Console,
) -> int:
    from .._serve.server import serve

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            address = await nursery.start(
                lambda task_status: serve(
                    store,
                    agents=agents,
                    host=host,
                    port=port,
                    token=token,
                    reports_dir=reports,
                    task_status=task_status,
                )
            )
            console.print(f"serving {address}/", markup=False, highlight=False, soft_wrap=True)
            async for _ in signals:
                break
            nursery.cancel_scope.cancel()
    await store.aclose()
    return EXIT_OK
