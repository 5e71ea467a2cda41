"""``dsh-agent approve`` and ``dsh-agent deny``: decide tool calls waiting in a stored session.

A call the permission policy deferred waits durably in its session (docs/design.md#approvals)
until someone decides it; ``chat`` asks, and these verbs decide from any shell, so a ``run`` that
exited 3 can be finished by a script. ``approve SESSION CALL_ID...`` (or ``--all``) approves,
``--always`` also records an allow rule for calls like it (``Agent.approve(always=True)``, the
``[a]lways`` of ``chat``); ``deny SESSION CALL_ID... [--message TEXT]`` refuses, the message
being what the model reads.

The ids are checked against the stored session before anything is opened for writing: an id
that waits nowhere is a usage error (exit 2) listing the ids that wait, and nothing is decided
or appended. Then the session is resumed: as its agent last ran (``rt.agents.resume``), or, when
``--config`` declares its agent, as that declaration says (as ``chat --resume`` does, so its
permission policy and sandbox hold for the continuation). Its sub-agent sessions left waiting
come back under it (``resume_waiting_children``): a sub-agent's call is decided with the top
session's id and the call's id, as ``run`` lists them. Once an agent's calls are all decided its
continuation runs; it is streamed and summarised as ``run`` streams and summarises a turn
(``--quiet``: no summary).

A session a live fleet worker holds cannot be resumed here (the store refuses a second owner):
its calls are then decided through the fleet, by the worker that holds it, and the continuation
is followed in the session's log (``_fleet_decide.py``, docs/design.md#fleet-clients).

Exit codes as ``run``: 0 done; 1 a turn ended ``error`` or ``interrupted``, or the store failed;
2 bad usage or config, an unknown session or call id, or the agent failed to start; 3 calls still
wait (one stderr line each, with the commands that decide it); 130 Ctrl-C (the first cancels the
running continuation, which is stored ``aborted``).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any, final

import attrs
import trio
from rich.console import Console
from rich.text import Text

from .._agent.agent import Agent
from .._agent.results import ApprovalRequest
from .._errors import SessionAlreadyOwnedError
from .._runtime import open_runtime
from .._session.store import SessionStore
from .._tools.base import Tool
from ..config import RuntimeConfig
from ._approvals import (
    MODES_TEXT,
    ResumeHint,
    StoredCall,
    agent_tree,
    pending_calls,
    pending_line,
    permission_mode,
    resume_waiting_children,
    stored_pending,
    with_permission_mode,
)
from ._fleet import DEFAULT_WAIT
from ._fleet_decide import DecideOptions, decide_in_fleet, fleet_serves
from ._numbers import positive_number
from ._render import StreamRenderer
from ._run import (
    EXIT_INTERRUPTED,
    print_stored,
    report_start_failures,
    report_turns,
    watch_interrupts,
)
from ._setup import (
    EXIT_AWAITING,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    StoredAt,
    load_cli_config,
    load_cli_tools,
    load_user_settings,
    make_store,
    missing_local_store,
    store_url,
    with_cli_tools,
    with_session,
)
from ._terminal import TerminalGuard, consoles, redact_url, visible

__all__ = ["Decision", "add_decide_verbs", "decide_session", "decide_verb"]


@final
@attrs.frozen
class Decision:
    """What the command decides: which calls, and how."""

    approve: bool
    """``approve`` (True) or ``deny``."""
    call_ids: tuple[str, ...] = ()
    """The calls named (empty: ``--all``)."""
    always: bool = False
    """``approve --always``: also allow calls like each one from now on in the session."""
    message: str | None = None
    """``deny --message``: what the model reads."""


# -- the parsers ---------------------------------------------------------------------------------


def add_decide_verbs(verbs: Any, common: argparse.ArgumentParser) -> None:
    """Add ``approve`` and ``deny`` to the verbs' sub-parsers."""
    for name, text in (
        ("approve", "approve tool calls waiting in a stored session, then run the continuation"),
        ("deny", "deny tool calls waiting in a stored session, then run the continuation"),
    ):
        verb = verbs.add_parser(
            name,
            parents=[common],
            help=text,
            description=f"{text[0].upper()}{text[1:]}. A sub-agent's call is named with the top"
            " session's id. Exit codes as run: 0 done; 1 a turn ended error or interrupted, or the"
            " store failed; 2 bad usage, config, session or call id (the ids waiting are listed);"
            " 3 calls still wait (one stderr line each says how to decide it); 130 interrupted.",
        )
        verb.add_argument("session_id", metavar="SESSION", help="the session the calls wait in")
        verb.add_argument("call_ids", metavar="CALL_ID", nargs="*", help="the calls to decide")
        verb.add_argument("--all", action="store_true", help="every call waiting in the session")
        if name == "approve":
            verb.add_argument(
                "--always",
                action="store_true",
                help="also allow calls like each one from now on in this session",
            )
        else:
            verb.add_argument("--message", "-m", metavar="TEXT", help="what the model reads")
        verb.add_argument("--quiet", "-q", action="store_true", help="no event summary")
        verb.add_argument(
            "--tool",
            dest="tool_refs",
            action="append",
            metavar="MODULE:ATTR",
            help="add the tools MODULE:ATTR names (the calls may need them); repeatable",
        )
        verb.add_argument(
            "--permission-mode",
            dest="permission_mode",
            type=permission_mode,
            metavar="MODE",
            help=f"the mode of every permission policy ({MODES_TEXT}) for the continuation",
        )
        verb.add_argument(
            "--timeout",
            type=positive_number,
            default=DEFAULT_WAIT,
            metavar="S",
            help="for a session a fleet worker holds: seconds to wait for the worker to apply"
            f" each decision and run the continuation (default {DEFAULT_WAIT:.0f})",
        )
        verb.set_defaults(handler=decide_verb)


def decide_verb(args: argparse.Namespace, guard: TerminalGuard) -> int:
    """``dsh-agent approve|deny``: resolve config, store and decision; the exit code.

    Raises:
        CliError: neither or both of CALL_ID and ``--all``; the store holds no sessions.
    """
    call_ids = tuple(args.call_ids)
    if bool(call_ids) == bool(args.all):
        which = "not both" if call_ids else "none was given"
        raise CliError(f"{args.verb}: name the calls (CALL_ID ...) or give --all; {which}")
    path: str | None = getattr(args, "config", None)
    settings = load_user_settings()
    config = load_cli_config(path) or RuntimeConfig()
    tools = load_cli_tools(args.tool_refs)
    config = with_permission_mode(with_cli_tools(config, tools), args.permission_mode)
    option: str | None = getattr(args, "store", None)
    url = store_url(option, config)
    guard.add_store_url(url)
    if missing_local_store(url):
        raise CliError(f"session '{visible(args.session_id)}' not found in {redact_url(url)}")
    store = make_store(url)
    console, errors = consoles(guard)
    decision = Decision(
        approve=args.verb == "approve",
        call_ids=call_ids,
        always=bool(getattr(args, "always", False)),
        message=getattr(args, "message", None),
    )
    hint = ResumeHint(
        config=path or "",
        first_agent="",
        store=option,
        tools=tuple(args.tool_refs or ()),
        mode=args.permission_mode,
    )
    return trio.run(
        lambda: decide_session(
            config,
            store,
            settings,
            session_id=args.session_id,
            decision=decision,
            console=console,
            errors=errors,
            tools=tools,
            url=url,
            hint=hint,
            quiet=args.quiet,
            timeout=args.timeout,
        )
    )


# -- deciding ------------------------------------------------------------------------------------


def _chosen(waiting: Sequence[StoredCall], decision: Decision, session_id: str) -> list[str]:
    """The call ids to decide.

    Raises:
        CliError: nothing waits in the session, or a named id is not waiting (exit 2).
    """
    if not waiting:
        raise CliError(f"session '{visible(session_id)}' has no tool calls waiting for approval")
    ids = [call.request.call_id for call in waiting]
    unknown = [call_id for call_id in decision.call_ids if call_id not in ids]
    if unknown:
        listed = ", ".join(f"{c.request.call_id} ({c.agent_id}: {c.request.name})" for c in waiting)
        raise CliError(
            visible(
                f"no tool call {', '.join(repr(u) for u in unknown)} waits for approval in"
                f" session '{session_id}'; waiting: {listed}"
            )
        )
    return list(dict.fromkeys(decision.call_ids)) or ids


async def _waiting_in_store(
    store: SessionStore, session_id: str, url: str, decision: Decision
) -> tuple[str, list[str], list[StoredCall]]:
    """The session's agent id, the ids of the calls to decide, and every call waiting (read only).

    The store is closed when this raises.

    Raises:
        CliError: the session does not exist, or a call id does not wait in it (exit 2).
    """
    try:
        info = await store.stat(session_id)
        if info is None:
            raise CliError(f"session '{visible(session_id)}' not found in {redact_url(url)}")
        waiting = await stored_pending(store, session_id)
        return info.agent_id, _chosen(waiting, decision, session_id), waiting
    except BaseException:
        with trio.CancelScope(shield=True):
            await store.aclose()
        raise


def _for_session(config: RuntimeConfig, agent_id: str, session_id: str) -> RuntimeConfig:
    """``config`` starting only the session's agent, resumed, when it declares it; else none."""
    entries = tuple(entry for entry in config.agents if entry.id == agent_id)
    config = attrs.evolve(config, plugin=attrs.evolve(config.plugin, agents=entries))
    return with_session(config, [agent_id], resume=session_id) if entries else config


def _apply(
    tree: Sequence[Agent], chosen: Sequence[str], decision: Decision, console: Console
) -> list[str]:
    """Decide each chosen call on the agent it waits in, saying what was decided.

    Returns the ids of the chosen calls no live agent holds (their session was not resumed).
    """
    owners: dict[str, tuple[Agent, ApprovalRequest]] = {
        request.call_id: (agent, request) for agent, request in pending_calls(tree)
    }
    missing = [call_id for call_id in chosen if call_id not in owners]
    for call_id in chosen:
        if call_id in missing:
            continue
        agent, request = owners[call_id]
        what = f"{agent.id}'s call {call_id} of {request.name}"
        if not decision.approve:
            agent.deny(call_id, decision.message)
            _say(console, f"denied {what}")
            continue
        rule = agent.approve(call_id, always=decision.always)
        _say(console, f"approved {what}")
        if rule is not None:
            _say(console, f"{agent.id}: allowed from now on in this session: {rule}")
        elif decision.always:
            _say(
                console,
                f"{agent.id}: approved once; no rule can allow calls like it (a path outside its"
                " working directory), so they will be asked about again",
            )
    return missing


def _say(console: Console, text: str) -> None:
    console.print(Text(visible(text), style="dim"), soft_wrap=True)


async def _until_quiet(top: Agent) -> None:
    """Wait until ``top`` and its live sub-agents are all idle (continuations included)."""
    while True:
        tree = agent_tree(top)
        for agent in tree:
            await agent.wait_idle()
        if all(agent.status.value == "idle" for agent in agent_tree(top)):
            return


async def decide_session(
    config: RuntimeConfig,
    store: SessionStore,
    settings: Mapping[str, Any],
    *,
    session_id: str,
    decision: Decision,
    console: Console,
    errors: Console,
    tools: Sequence[Tool] = (),
    url: str,
    hint: ResumeHint,
    quiet: bool = False,
    timeout: float = DEFAULT_WAIT,
) -> int:
    """Decide the calls, run and stream the continuations; the exit code.

    A session another process holds is decided through the fleet when a live fleet worker holds
    it (``_fleet_decide.py``): that worker applies the decisions.

    Raises:
        CliError: an unknown session or call id (nothing is decided or appended then).
        SessionAlreadyOwnedError: another process, not a live fleet worker, holds the session.
    """
    agent_id, chosen, waiting = await _waiting_in_store(store, session_id, url, decision)
    config = _for_session(config, agent_id, session_id)
    try:
        return await _decide_here(
            config,
            store,
            settings,
            session_id=session_id,
            chosen=chosen,
            decision=decision,
            console=console,
            errors=errors,
            tools=tools,
            url=url,
            hint=hint,
            quiet=quiet,
        )
    except SessionAlreadyOwnedError:
        if not await fleet_serves(url, session_id):
            raise
    how = DecideOptions(
        approve=decision.approve,
        always=decision.always,
        message=decision.message,
        quiet=quiet,
        timeout=timeout,
    )
    calls = [call for call in waiting if call.request.call_id in chosen]
    return await decide_in_fleet(
        url, session_id, calls, how, console=console, errors=errors, hint=hint
    )


async def _decide_here(
    config: RuntimeConfig,
    store: SessionStore,
    settings: Mapping[str, Any],
    *,
    session_id: str,
    chosen: Sequence[str],
    decision: Decision,
    console: Console,
    errors: Console,
    tools: Sequence[Tool],
    url: str,
    hint: ResumeHint,
    quiet: bool,
) -> int:
    """Resume the session in this process, decide, and stream the continuations.

    Raises:
        SessionAlreadyOwnedError: another process holds the session (nothing was decided).
    """
    async with open_runtime(config, store=store, settings=settings, tools=tools) as rt:
        _raise_if_owned(rt.start_failures)
        report_start_failures(rt, errors, url)
        if rt.start_failures:
            return EXIT_USAGE
        handle = rt.agents.handle(config.agents[0].id) if config.agents else None
        top = (handle or await rt.agents.resume(session_id)).agent
        for problem in await resume_waiting_children(rt, top):
            errors.print(visible(problem), soft_wrap=True, markup=False)
        tree = agent_tree(top)
        starts = {agent.id: len(agent.session.events) for agent in tree}
        renderer = StreamRenderer(console, prefix=len(tree) > 1, errors=errors)
        disposers = renderer.attach(rt.hooks)
        presses: list[int] = []
        missing: list[str] = []
        try:
            async with trio.open_nursery() as nursery:
                waiting_scope = trio.CancelScope()
                await nursery.start(watch_interrupts, tree, waiting_scope, presses)
                with waiting_scope:
                    missing = _apply(tree, chosen, decision, console)
                    await _until_quiet(top)
                nursery.cancel_scope.cancel()
        finally:
            for dispose in disposers:
                dispose()
        renderer.end_line()
        grown = [agent for agent in agent_tree(top) if agent.id in starts]
        code = report_turns(grown, starts, renderer, console, errors, quiet=quiet)
        for call_id in missing:  # resume_waiting_children said why
            errors.print(visible(f"call {call_id} was not decided"), soft_wrap=True, markup=False)
            code = EXIT_FAILED
        if _report_waiting(top, session_id, hint, errors) and code == EXIT_OK:
            code = EXIT_AWAITING
        if presses:
            errors.print("interrupted: the cancelled turns are stored as aborted", soft_wrap=True)
            code = EXIT_INTERRUPTED
        print_stored(StoredAt(url), [session_id], console, errors)  # as run and chat end
        return code


def _raise_if_owned(failures: Sequence[Any]) -> None:
    """Raise the declared agent's ``SessionAlreadyOwnedError``, if that is why it did not start."""
    for failure in failures:
        if isinstance(failure.error, SessionAlreadyOwnedError):
            raise failure.error


def _report_waiting(top: Agent, session_id: str, hint: ResumeHint, errors: Console) -> bool:
    """One stderr line per call still waiting, with the commands that decide it."""
    waiting = pending_calls(agent_tree(top))
    for agent, request in waiting:
        how = hint.decide_how(session_id, request.call_id)
        errors.print(pending_line(agent.id, request, how), soft_wrap=True, markup=False)
    return bool(waiting)
