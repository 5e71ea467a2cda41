"""The ``dsh-agent`` application: argument parsing, verb dispatch, and error reporting.

``--store``, ``--config`` and ``--debug`` belong to every verb and may stand anywhere after it,
before or after its positionals (``sessions --store X list`` and ``sessions list --store X``
alike). They are declared on each parser level with ``default=SUPPRESS``: argparse copies a
sub-parser's namespace over its parent's, and a suppressed default is simply absent, so a value
given at an outer level is never reset by an inner one.

Every error reaches the user as one line on stderr (a ``ConfigError`` verbatim), with exit 2
for bad usage, bad config or an unknown session, and 1 for anything else; ``--debug`` adds the
traceback. (``run`` also exits 3 when tool calls wait for approval: ``_run.py``.) Whatever is
written, the error line, the traceback, log records and the consoles' output alike, passes
through one ``TerminalGuard`` (``_terminal.py``): control characters are shown, not sent, and
the store URL's password is hidden; each verb hands it its store URL before
building the store. Log records reach stderr through the guard too, while the command runs: this
library's warnings always, other libraries' (psycopg's, for one, after a failure already
reported) only with ``--debug``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import trio

from .. import __version__
from .._compose import load_config
from .._errors import ConfigError
from ..config import RuntimeConfig
from ..stores import parse_store_url
from ._approvals import MODES_TEXT, ResumeHint, permission_mode, with_permission_mode
from ._decide import add_decide_verbs
from ._fleet import add_fleet_verbs
from ._fleet_worker import add_worker_verb
from ._numbers import non_negative_float, non_negative_int, positive_int
from ._serve import add_serve_verb
from ._setup import (
    EXIT_FAILED,
    EXIT_USAGE,
    CliError,
    StoredAt,
    config_path,
    config_store_url,
    load_cli_config,
    load_cli_tools,
    load_user_settings,
    make_store,
    store_url,
    with_cli_tools,
    with_session,
)
from ._terminal import TerminalGuard, consoles, redact, visible
from ._trace import TRACE_CHOICES, start_tracing

__all__ = ["build_parser", "main"]

PROG = "dsh-agent"


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one stderr line and exit 2."""

    def error(self, message: str) -> NoReturn:
        shown = visible(redact(message))  # it may quote any argument, a store URL among them
        self.exit(EXIT_USAGE, f"{self.prog}: error: {shown} (see {self.prog} --help)\n")


def _workers(text: str) -> int:
    value = non_negative_int(text)
    if value > 64:  # _sim_workers.MAX_WORKERS
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to 64, got {text!r}")
    return value


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("common options")
    group.add_argument(
        "--store",
        metavar="URL",
        default=argparse.SUPPRESS,
        help="session store: memory:, sqlite:///PATH, jsonl:///DIR or postgresql://... "
        "(default: the config's store, else $DSH_AGENT_STORE, else the settings file's store, "
        "else sqlite:///sessions.db)",
    )
    group.add_argument(
        "--config", metavar="PATH", default=argparse.SUPPRESS, help="config file (YAML)"
    )
    group.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show tracebacks of errors",
    )
    return common


def _add_tool_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tool",
        dest="tool_refs",
        action="append",
        metavar="MODULE:ATTR",
        help="add the tools MODULE:ATTR names (a @tool function, a Tool, or a list); repeatable",
    )


def _add_trace_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace",
        choices=TRACE_CHOICES,
        help="trace the turns (as the config's otel: true) and print each span on stderr as"
        " one JSON line; with OTEL_EXPORTER_OTLP_ENDPOINT set, spans also go there",
    )


def _add_permission_mode(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--permission-mode",
        dest="permission_mode",
        type=permission_mode,
        metavar="MODE",
        help=f"the mode of every permission policy ({MODES_TEXT}); the config's rules stay",
    )


def _add_run(verbs: Any, common: argparse.ArgumentParser) -> None:
    run = verbs.add_parser(
        "run",
        parents=[common],
        help="prompt the declared agents once and stream their output",
        description="Send a prompt to every declared agent (or the one named), stream their "
        "output, and print a one-line-per-event summary of each session log. Exit codes: 0 "
        "done; 1 a turn ended error or interrupted, or an agent's store failed; 2 bad usage, "
        "config or session, or an agent failed to start; 3 tool calls wait for approval (one "
        "stderr line each says how to decide them); 130 interrupted. When several apply, the "
        "first in the order 130, 2, 1, 3 wins.",
    )
    run.add_argument("config_path", metavar="CONFIG", nargs="?", help="config file (YAML)")
    run.add_argument("--prompt", "-p", metavar="TEXT", help="the prompt (default: stdin)")
    run.add_argument("--agent", metavar="ID", help="prompt only this declared agent")
    run.add_argument("--quiet", "-q", action="store_true", help="no session summary")
    which = run.add_mutually_exclusive_group()
    which.add_argument(
        "--session", metavar="ID", help="run on session ID (created when it does not exist)"
    )
    which.add_argument("--resume", metavar="ID", help="continue the stored session ID")
    _add_tool_option(run)
    _add_permission_mode(run)
    _add_trace_option(run)
    run.set_defaults(handler=_run_verb)


def _add_chat(verbs: Any, common: argparse.ArgumentParser) -> None:
    chat = verbs.add_parser(
        "chat",
        parents=[common],
        help="talk to an agent interactively",
        description="Interactive session. Ctrl-C cancels the running turn (what was shown "
        "stays in the log); Ctrl-C when idle exits. Commands: /new, /resume ID, /exit. A tool "
        "call waiting for approval, the agent's or a sub-agent's, is shown whole and asked "
        "about: [y]es / [n]o / [a]lways this session.",
    )
    chat.add_argument("config_path", metavar="CONFIG", nargs="?", help="config file (YAML)")
    chat.add_argument("--agent", metavar="ID", help="the declared agent to talk to")
    chat.add_argument("--resume", metavar="ID", help="continue the stored session ID")
    _add_tool_option(chat)
    _add_permission_mode(chat)
    _add_trace_option(chat)
    chat.set_defaults(handler=_chat_verb)


def _add_sessions(verbs: Any, common: argparse.ArgumentParser) -> None:
    sessions = verbs.add_parser(
        "sessions", parents=[common], help="list, show, check or export stored sessions"
    )
    which = sessions.add_subparsers(
        dest="sessions_verb", metavar="ACTION", required=True, parser_class=_Parser
    )
    listing = which.add_parser("list", parents=[common], help="one row per stored session")
    listing.add_argument(
        "--tree",
        action="store_true",
        help="sub-agents under their parent, forks under their source",
    )
    listing.set_defaults(handler=_sessions_verb)
    for name, text in (
        ("show", "print a session's events, one line each"),
        ("check", "check a session log's invariants (exit 1 on violations)"),
        ("export", "write a session in the JSONL store format"),
    ):
        action = which.add_parser(name, parents=[common], help=text)
        action.add_argument("session_id", metavar="ID", help="session id")
        if name == "export":
            action.add_argument(
                "-o", "--output", metavar="FILE", help="output file (default: stdout)"
            )
        action.set_defaults(handler=_sessions_verb)


def _add_simulate(verbs: Any, common: argparse.ArgumentParser) -> None:
    sim = verbs.add_parser(
        "simulate",
        parents=[common],
        help="run many agents against a seeded scripted model",
    )
    sim.add_argument("--agents", type=positive_int, required=True, metavar="N")
    sim.add_argument("--turns", type=positive_int, default=1, metavar="N")
    sim.add_argument(
        "--tools",
        type=non_negative_int,
        default=1,
        metavar="N",
        help="tool-call steps per turn before the text reply",
    )
    sim.add_argument(
        "--latency-ms",
        type=non_negative_float,
        default=0.0,
        metavar="MS",
        help="model latency per streamed chunk",
    )
    sim.add_argument(
        "--concurrency",
        type=non_negative_int,
        default=256,
        metavar="N",
        help="agents running a turn at the same time (default 256; 0: every agent at once)",
    )
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--json", metavar="PATH", help="also write the summary as JSON")
    sim.add_argument(
        "--report", metavar="PATH", help="also write an HTML report (charts, summary) to PATH"
    )
    sim.add_argument(
        "--workers",
        type=_workers,
        default=1,
        metavar="N",
        help="worker processes: each runs a shard of the agents on --store memory:, or all"
        " share a SQLite or PostgreSQL store as a fleet (default 1: this process; 0: one"
        " per CPU)",
    )
    sim.add_argument("--shard", help=argparse.SUPPRESS)  # a worker's own: _sim_workers.py
    _add_tool_option(sim)
    _add_permission_mode(sim)
    sim.set_defaults(handler=_simulate_verb)


def _add_bench(verbs: Any, common: argparse.ArgumentParser) -> None:
    bench = verbs.add_parser("bench", parents=[common], help="run the benchmarks")
    bench.add_argument("--quick", action="store_true", help="smaller workloads")
    bench.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    bench.add_argument(
        "--check", action="store_true", help="exit 1 when a target is missed (one line each)"
    )
    bench.set_defaults(handler=_bench_verb)


def build_parser() -> argparse.ArgumentParser:
    """The ``dsh-agent`` argument parser."""
    common = _common()
    parser = _Parser(
        prog=PROG,
        parents=[common],
        description="dsh-agent-loop: run, chat with, simulate and inspect agent sessions.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True, parser_class=_Parser)
    for add in (
        _add_run,
        _add_chat,
        _add_sessions,
        _add_simulate,
        _add_bench,
        add_decide_verbs,
        add_worker_verb,
        add_fleet_verbs,
        add_serve_verb,
    ):
        add(verbs, common)
    return parser


# -- verbs ------------------------------------------------------------------------------------


def _run_verb(args: argparse.Namespace, guard: TerminalGuard) -> int:
    from ._run import read_prompt, run_agents, select_agents

    path = config_path(args.config_path, getattr(args, "config", None))
    if path is None:
        raise CliError("run: CONFIG is required (dsh-agent run CONFIG --prompt TEXT)")
    settings = load_user_settings()
    config = load_config(path)
    agent_ids = select_agents(config, args.agent)
    config = with_session(config, agent_ids, session=args.session, resume=args.resume)
    tools = load_cli_tools(args.tool_refs)
    config = with_cli_tools(config, tools)
    config = with_permission_mode(config, args.permission_mode)
    prompt = read_prompt(args.prompt)
    option: str | None = getattr(args, "store", None)
    url = store_url(option, config)
    guard.add_store_url(url)
    store = make_store(url)
    console, errors = consoles(guard)
    config = start_tracing(config, args.trace, errors, guard.clean)
    hint = ResumeHint(
        config=path,
        first_agent=config.agents[0].id,
        store=option,
        tools=tuple(args.tool_refs or ()),
        mode=args.permission_mode,
        forgets=parse_store_url(url).scheme == "memory",
    )
    return trio.run(
        lambda: run_agents(
            config,
            store,
            settings,
            agent_ids=agent_ids,
            prompt=prompt,
            quiet=args.quiet,
            console=console,
            errors=errors,
            tools=tools,
            url=url,
            hint=hint,
            stored=StoredAt(url),
        )
    )


def _chat_verb(args: argparse.Namespace, guard: TerminalGuard) -> int:
    from ._chat import chat, echo_config
    from ._run import select_agents

    path = config_path(args.config_path, getattr(args, "config", None))
    settings = load_user_settings()
    config = load_cli_config(path)
    providers = None
    if config is None:
        config, providers = echo_config()
    if args.agent is not None or not config.agents:
        select_agents(config, args.agent)
    agent_id = args.agent or config.agents[0].id
    config = with_session(config, [agent_id], resume=args.resume)
    tools = load_cli_tools(args.tool_refs)
    config = with_cli_tools(config, tools)
    config = with_permission_mode(config, args.permission_mode)
    url = store_url(getattr(args, "store", None), config)
    guard.add_store_url(url)
    store = make_store(url)
    console, errors = consoles(guard)
    config = start_tracing(config, args.trace, errors, guard.clean)
    return trio.run(
        lambda: chat(
            config,
            store,
            url,
            settings,
            agent_id=agent_id,
            providers=providers,
            console=console,
            errors=errors,
            tools=tools,
            stored=StoredAt(url),
        )
    )


def _sessions_verb(args: argparse.Namespace, guard: TerminalGuard) -> int:
    from . import _sessions

    # Only the config's store is read: these verbs import no tool and start nothing.
    configured = config_store_url(getattr(args, "config", None))
    option: str | None = getattr(args, "store", None)
    url = store_url(option, configured)
    guard.add_store_url(url)
    store = make_store(url)
    console, _ = consoles(guard)
    verb = args.sessions_verb
    if verb == "list":
        tty = sys.stdout.isatty()
        return _sessions.list_sessions(store, url, console, tty=tty, tree=args.tree)
    if verb == "show":
        config = getattr(args, "config", None)
        return _sessions.show_session(store, url, args.session_id, console, config=config)
    if verb == "check":
        return _sessions.check_session(store, url, args.session_id, console)
    return _sessions.export_session(store, url, args.session_id, args.output)


def _simulate_verb(args: argparse.Namespace, guard: TerminalGuard) -> int:
    from ._sim_report import check_report_path, write_report
    from ._sim_workers import parse_shard, run_shard, run_workers, shard_count
    from ._simulate import (
        SimOptions,
        exit_code,
        measure_simulation,
        print_summary,
        skip_exit_collection,
        write_json,
    )

    if args.report is not None and args.shard is None:
        check_report_path(args.report)  # before the run: a bad path is bad usage
    settings = load_user_settings()
    config = load_cli_config(getattr(args, "config", None))
    if args.permission_mode is not None:
        config = with_permission_mode(config or RuntimeConfig(), args.permission_mode)
    tools = load_cli_tools(args.tool_refs)
    url = store_url(getattr(args, "store", None), config)
    guard.add_store_url(url)
    store = make_store(url)
    console, errors = consoles(guard)
    if config is not None and config.agents and args.shard is None:
        declared = ", ".join(entry.id for entry in config.agents)
        errors.print(
            f"simulate: {config.source}: its agents ({declared}) are not run; the simulated"
            " agents use its store, settings and tools with the scripted model",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
    options = SimOptions(
        agents=args.agents,
        turns=args.turns,
        tools=args.tools,
        latency_ms=args.latency_ms,
        seed=args.seed,
        concurrency=args.concurrency,
        workers=shard_count(args.workers, args.agents, url),
    )
    with skip_exit_collection():
        if args.shard is not None:  # one worker of ``--workers N``
            return run_shard(parse_shard(args.shard), options, store, settings, config, tools)
        if options.workers > 1:
            result = run_workers(options, url, _worker_command(args, url), console, errors)
            if result is None:
                return EXIT_FAILED  # which worker failed is on stderr
        else:
            result = trio.run(
                lambda: measure_simulation(
                    options, store, url, settings, console, config=config, tools=tools
                )
            )
    print_summary(result.summary, console)
    if args.json is not None:
        write_json(result.summary, args.json)
    if args.report is not None:
        write_report(result, args.report)
    return exit_code(result.summary)


def _worker_command(args: argparse.Namespace, url: str) -> list[str]:
    """The ``simulate`` command line of a worker of ``args``, short of its ``--shard``."""
    command = [sys.executable, "-m", "dsh_agent_loop.cli", "simulate", "--store", url]
    for name in ("agents", "turns", "tools", "latency_ms", "concurrency", "seed"):
        command += [f"--{name.replace('_', '-')}", repr(getattr(args, name))]
    for name in ("config", "permission_mode"):
        if getattr(args, name, None) is not None:
            command += [f"--{name.replace('_', '-')}", getattr(args, name)]
    for ref in args.tool_refs or ():
        command += ["--tool", ref]
    return [*command, "--debug"] if getattr(args, "debug", False) else command


def _bench_verb(args: argparse.Namespace, guard: TerminalGuard) -> int:
    from ._bench import bench

    load_cli_config(getattr(args, "config", None))
    console, errors = consoles(guard)
    return bench(args.quick, args.json, console, check=args.check, errors=errors)


# -- entry point ------------------------------------------------------------------------------


class _GuardedFormatter(logging.Formatter):
    def __init__(self, guard: TerminalGuard) -> None:
        super().__init__("%(message)s")
        self.guard = guard

    def format(self, record: logging.LogRecord) -> str:
        return self.guard.clean(super().format(record))


def _log_handler(guard: TerminalGuard, debug: bool) -> logging.Handler:
    """A stderr handler for the root logger that writes through ``guard``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_GuardedFormatter(guard))
    if not debug:
        own = __name__.partition(".")[0]
        handler.addFilter(lambda record: record.name.partition(".")[0] == own)
    return handler


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    if isinstance(error, CliError | ConfigError):
        return text
    name = type(error).__name__
    return f"{PROG}: error: {name}: {text}" if text else f"{PROG}: error: {name}"


def _report(error: BaseException, debug: bool, guard: TerminalGuard) -> int:
    leaves = _leaves(error)
    if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
        return 130
    first = leaves[0]
    if debug:
        sys.stderr.write(guard.clean("".join(traceback.format_exception(error))))
    line = _one_line(first)
    if len(leaves) > 1:
        line += f" (and {len(leaves) - 1} more errors; --debug shows them)"
    print(guard.clean(line), file=sys.stderr)
    if isinstance(first, CliError):
        return first.code
    if isinstance(first, ConfigError):
        return EXIT_USAGE
    return EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dsh-agent`` with ``argv`` (default: the process arguments); returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = bool(getattr(args, "debug", False))
    handler: Callable[[argparse.Namespace, TerminalGuard], int] = args.handler
    guard = TerminalGuard()
    option: str | None = getattr(args, "store", None)
    if option is not None:
        guard.add_store_url(option)
    root = logging.getLogger()
    log_handler = _log_handler(guard, debug)
    root.addHandler(log_handler)  # instead of logging's last resort, which writes raw
    try:
        return handler(args, guard)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (``| head``): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILED
    except (Exception, BaseExceptionGroup) as error:  # every failure is one line unless --debug
        return _report(error, debug, guard)
    finally:
        root.removeHandler(log_handler)
