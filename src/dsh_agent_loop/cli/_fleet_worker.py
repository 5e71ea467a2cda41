"""``dsh-agent worker``: run one fleet worker on the store until SIGTERM or Ctrl-C.

A worker is a runtime opened with ``fleet=FleetOptions(...)`` (docs/design.md#fleet-workers): it
claims the sessions that have messages or commands waiting, activates them, delivers, and
unloads them when idle. This verb opens one with the providers, tools and settings ``run`` would
use (the config's, or without a config the offline echo model of ``chat``) and the options of the
config's ``fleet:`` block, each overridden by its flag. The config's declared agents are not
started: a worker serves the sessions the fleet sends it work for, each resumed as it last ran.

Output. The first line names the worker, its store (password hidden) and its bound; then one line
per record of the ``dsh_agent_loop.fleet`` logger (activations, takeovers, unloads, drops, the
drain), made terminal-safe, on stdout. The log handler goes in only once the first line is out,
with no checkpoint between, so no record the worker writes after it starts is lost.

Stopping. SIGTERM or SIGINT (Ctrl-C) leaves the runtime block: the worker drains (running turns
get the drain timeout, then every agent is disposed and the sessions given back), a last line
sums up, and the exit code is 0. The signal receiver is closed before the drain, so a second
signal during the drain has its default effect (stop at once; Ctrl-C exits 130).
"""

from __future__ import annotations

import argparse
import logging
import signal
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final

import attrs
import trio
from rich.console import Console
from rich.text import Text

from .._compose import fleet_options_from_config
from .._errors import InvalidOptionError
from .._runtime import open_runtime
from .._session.store import SessionStore
from ..config import RuntimeConfig
from ..fleet import FleetOptions
from ._approvals import MODES_TEXT, permission_mode, with_permission_mode
from ._fleet import fleet_store
from ._numbers import positive_int, positive_number
from ._setup import (
    EXIT_OK,
    CliError,
    load_cli_config,
    load_user_settings,
    make_store,
    store_url,
)
from ._terminal import TerminalGuard, consoles, redact_url, visible

__all__ = ["add_worker_verb", "run_worker", "worker_verb"]

#: The logger the worker writes its lines on.
FLEET_LOGGER: Final = "dsh_agent_loop.fleet"


def add_worker_verb(verbs: Any, common: argparse.ArgumentParser) -> None:
    """Add ``worker`` to the verbs' sub-parsers."""
    worker = verbs.add_parser(
        "worker",
        parents=[common],
        help="run a fleet worker on the store until SIGTERM or Ctrl-C",
        description="Serve the fleet on the store (SQLite or PostgreSQL): activate sessions as"
        " messages arrive for them, deliver them in order, take over the sessions of a worker"
        " that died, unload idle agents. One line per activation, takeover, unload and drop."
        " SIGTERM or Ctrl-C drains and exits 0. The config's fleet: block gives the defaults;"
        " the flags win.",
    )
    worker.add_argument("--id", dest="worker_id", metavar="NAME", help="this worker's name")
    worker.add_argument(
        "--max-agents", type=positive_int, metavar="N", help="most live agents at once"
    )
    worker.add_argument(
        "--idle-unload",
        type=positive_number,
        metavar="SECONDS",
        help="unload an agent idle this long (default 300)",
    )
    worker.add_argument(
        "--drain-timeout",
        type=positive_number,
        metavar="SECONDS",
        help="on SIGTERM or Ctrl-C, how long running turns may finish (default 30)",
    )
    worker.add_argument(
        "--permission-mode",
        dest="permission_mode",
        type=permission_mode,
        metavar="MODE",
        help=f"the mode of the runtime's permission policy ({MODES_TEXT})",
    )
    worker.set_defaults(handler=worker_verb)


def worker_options(config: RuntimeConfig, args: argparse.Namespace) -> FleetOptions:
    """The config's ``fleet:`` block (or the defaults), each flag given replacing its value.

    Raises:
        CliError: a value out of range (exit 2).
    """
    base = fleet_options_from_config(config) or FleetOptions()
    flags = {
        "worker_id": args.worker_id,
        "max_agents": args.max_agents,
        "idle_unload_s": args.idle_unload,
        "drain_timeout_s": args.drain_timeout,
    }
    options = attrs.evolve(base, **{k: v for k, v in flags.items() if v is not None})
    try:
        options.validate()
    except InvalidOptionError as exc:
        raise CliError(f"worker: {exc}") from None
    return options


def worker_verb(args: argparse.Namespace, guard: TerminalGuard) -> int:
    """``dsh-agent worker``: resolve config, store and options, then serve; the exit code."""
    settings = load_user_settings()
    config = load_cli_config(getattr(args, "config", None))
    providers = None
    if config is None:
        from ._chat import echo_config

        config, providers = echo_config()
    declared = [entry.id for entry in config.agents]
    config = attrs.evolve(config, plugin=attrs.evolve(config.plugin, agents=()))
    config = with_permission_mode(config, args.permission_mode)
    url = store_url(getattr(args, "store", None), config)
    guard.add_store_url(url)
    store = make_store(url)
    fleet_store(store, "worker")
    options = worker_options(config, args)
    console, errors = consoles(guard)
    if declared and getattr(args, "config", None) is not None:
        errors.print(
            visible(
                f"worker: the agents the config declares ({', '.join(declared)}) are not started;"
                " the worker resumes each session it is sent work for as the session last ran"
            ),
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
    return trio.run(
        lambda: run_worker(config, store, url, settings, providers, options, console=console)
    )


class _Lines(logging.Handler):
    """Prints each record of the fleet logger as one terminal-safe line, once ``enabled``."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.INFO)
        self.console = console
        self.enabled = False
        """Off until the first line is out (the worker's own start record is dropped)."""

    def emit(self, record: logging.LogRecord) -> None:
        if not self.enabled:
            return
        try:
            text = " ".join(record.getMessage().split())
        except Exception:  # a record that cannot be formatted must not stop the worker
            self.handleError(record)
            return
        _say(self.console, text)


def _say(console: Console, text: str) -> None:
    console.print(Text(visible(text)), soft_wrap=True, markup=False, highlight=False)
    console.file.flush()  # a log read while the worker runs (a pipe, a file)


@contextmanager
def _fleet_lines(handler: _Lines) -> Iterator[None]:
    """Route the fleet logger's records (INFO and up) to ``handler`` only, while inside."""
    logger = logging.getLogger(FLEET_LOGGER)
    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.INFO)
    logger.propagate = False  # not also the root handler's stderr line
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


async def run_worker(
    config: RuntimeConfig,
    store: SessionStore,
    url: str,
    settings: Mapping[str, Any],
    providers: Mapping[str, Any] | None,
    options: FleetOptions,
    *,
    console: Console,
) -> int:
    """Serve until SIGTERM or SIGINT, then drain; the exit code (0)."""
    received = "?"
    lines = _Lines(console)
    with _fleet_lines(lines):
        async with open_runtime(
            config, store=store, settings=settings, providers=providers, fleet=options
        ) as rt:
            worker = rt.worker
            if worker is None:  # open_runtime was given fleet=: it is a worker
                raise CliError("worker: the runtime did not start a fleet worker", 1)
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                first = f"worker {worker.id} on {redact_url(url)} (max {options.max_agents} agents)"
                _say(console, first)
                lines.enabled = True  # no checkpoint since the runtime opened: nothing missed
                async for signum in signals:
                    received = signal.Signals(signum).name
                    break
        # leaving the block drained the worker (its lines were printed as it went)
    _say(
        console,
        f"worker {worker.id} drained and stopped on {received}: {worker.activations}"
        f" activations, {worker.takeovers} takeovers, {worker.unloads} unloads,"
        f" {worker.delivered} messages delivered",
    )
    return EXIT_OK
