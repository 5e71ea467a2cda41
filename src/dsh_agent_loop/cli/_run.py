"""``dsh-agent run``: prompt the declared agents once, stream their output, summarise the logs.

The prompt goes to every declared agent (or the one named) at once; the verb returns when all
are idle, that is when every turn's ``turn/end`` is stored. The exit code looks only at turns
that ended in this process: the turns run for the prompt, and a turn that crash repair closed
when the session was resumed (``interrupted``). A first Ctrl-C cancels the running turns (what
was shown stays in the log, and each turn's ``turn/end`` is stored as ``aborted``); a second one
stops waiting. Either way the verb then exits 130, as an interrupted command does. An agent
whose store failed or whose session another process took over (``agent/error`` with
``OWNERSHIP_LOST`` or ``STORE_FAILED``) makes the exit code 1: what it did after that was not
stored, and its turn's end may never be.

``run`` asks nobody: a tool call that the permission policy defers for a person's decision
(``docs/security.md``) leaves its agent idle with the call waiting in the session. Each such call,
the prompted agents' own and their live sub-agents', is one stderr line naming the agent, the tool
and its whole arguments, and the ``chat`` command that asks about it (``ResumeHint``); the exit
code is then 3. Codes are checked in a fixed order, the first that applies wins: 130 (Ctrl-C),
2 (an agent failed to start), 1 (a failed turn or store), 3 (calls waiting), 0. When a prompted
agent did not start (an MCP server whose tools it needs among the reasons), nothing is prompted:
the verb exits 2 before any model call.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import trio
from rich.console import Console
from rich.text import Text

from .._agent.agent import Agent
from .._errors import SessionNotFoundError
from .._runtime import Runtime, open_runtime
from .._session.store import SessionStore
from .._tools.base import Tool
from ..config import RuntimeConfig
from ..events import SESSION_END_SEED, TURN_END, Event
from ..mcp import McpStartError
from ._approvals import (
    ResumeHint,
    agent_tree,
    pending_calls,
    pending_line,
    waiting_before_prompt,
)
from ._render import StreamRenderer
from ._setup import EXIT_AWAITING, EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError, StoredAt
from ._start_failures import mcp_failure_lines
from ._terminal import redact_url, visible
from ._transcript import totals, transcript_lines

__all__ = [
    "attach_index",
    "failed_turns",
    "print_stored",
    "read_prompt",
    "report_start_failures",
    "report_turns",
    "run_agents",
    "select_agents",
    "watch_interrupts",
]

#: Turn-end kinds that make the exit code 1 (``aborted`` and ``blocked`` do not count).
FAILED_KINDS = frozenset({"error", "interrupted"})
#: The exit code after Ctrl-C (128 + SIGINT), as shells report an interrupted command.
EXIT_INTERRUPTED = 130


def read_prompt(prompt: str | None) -> str:
    """``--prompt``, else standard input when it is not a terminal.

    Raises:
        CliError: no prompt (exit 2).
    """
    if prompt is not None:
        return prompt
    if sys.stdin is None or sys.stdin.isatty():
        raise CliError("--prompt is required (or pipe the prompt on standard input)")
    text = sys.stdin.read().strip()
    if not text:
        raise CliError("--prompt is required (standard input was empty)")
    return text


def select_agents(config: RuntimeConfig, agent_id: str | None) -> list[str]:
    """The declared agent ids the prompt goes to.

    Raises:
        CliError: no agent is declared, or ``agent_id`` is not one of them (exit 2).
    """
    declared = [entry.id for entry in config.agents]
    if not declared:
        raise CliError(f"{config.source}: declares no agents (agents, or plugins[0].config.agents)")
    if agent_id is None:
        return declared
    if agent_id not in declared:
        raise CliError(f"{config.source}: no agent {agent_id!r} (declared: {', '.join(declared)})")
    return [agent_id]


def attach_index(events: Sequence[Event]) -> int:
    """Index of the first event this process wrote: its seed end, or the repair before it."""
    for index in range(len(events) - 1, -1, -1):
        if events[index].type == SESSION_END_SEED:
            before = events[index - 1] if index > 0 else None
            if before is not None and before.type == TURN_END:
                reason = before.data.get("reason") or {}
                if reason.get("kind") == "interrupted":
                    return index - 1
            return index
    return 0


def failed_turns(events: Sequence[Event], start: int) -> list[Mapping[str, Any]]:
    """The ``turn/end`` reasons from ``start`` on that count as failures."""
    out = []
    for event in events[start:]:
        if event.type == TURN_END:
            reason = event.data.get("reason") or {}
            if reason.get("kind") in FAILED_KINDS:
                out.append(reason)
    return out


def report_start_failures(rt: Runtime, errors: Console, url: str | None = None) -> None:
    """One stderr line per declared agent that failed to start."""
    resumed = {entry.id: entry.resume_session_id for entry in rt.config.agents}
    for failure in rt.start_failures:
        session = resumed.get(failure.agent_id)
        if isinstance(failure.error, SessionNotFoundError) and session is not None:
            where = f" in {redact_url(url)}" if url else ""
            line = f"session '{visible(session)}' not found{where}"
            errors.print(line, soft_wrap=True, markup=False)
            continue
        message = visible(" ".join(str(failure.error).split()))
        if isinstance(failure.error, McpStartError):
            if failure.agent_id.startswith("mcpServers."):
                for line in mcp_failure_lines(failure.error):
                    errors.print(line, soft_wrap=True, markup=False, highlight=False)
                continue
            server = failure.error.server
            message = f"it needs the tools of MCP server {server!r}, which did not start"
        errors.print(
            f"agent {failure.agent_id!r} failed to start: {message}", soft_wrap=True, markup=False
        )


async def watch_interrupts(
    agents: Sequence[Agent],
    waiting: trio.CancelScope,
    presses: list[int],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        task_status.started()
        count = 0
        async for _ in signals:
            count += 1
            presses.append(count)
            if count == 1:
                for agent in agents:
                    agent.cancel(cause="user")
            else:
                waiting.cancel()
                return


async def run_agents(
    config: RuntimeConfig,
    store: SessionStore,
    settings: Mapping[str, Any],
    *,
    agent_ids: Sequence[str],
    prompt: str,
    quiet: bool,
    console: Console,
    errors: Console,
    tools: Sequence[Tool] = (),
    url: str | None = None,
    hint: ResumeHint | None = None,
    stored: StoredAt | None = None,
) -> int:
    """Open the runtime, prompt the agents, stream, wait for idle, summarise; the exit code.

    ``hint`` makes the command each waiting call's line names (default: from the config's path);
    ``stored`` the closing lines saying where the sessions are (none without it). A stored
    session (``--resume``/``--session``) whose calls wait for approval gets no prompt: its calls
    are listed with the commands that decide them, and the code is 3.
    """
    if await waiting_before_prompt(config, agent_ids, store, url, hint, errors):
        return EXIT_AWAITING
    async with open_runtime(config, store=store, settings=settings, tools=tools) as rt:
        report_start_failures(rt, errors, url)
        live = {agent.id: agent for agent in rt.agents.list()}
        agents = [live[i] for i in agent_ids if i in live]
        if len(agents) < len(agent_ids):
            return EXIT_USAGE  # an agent did not start (its line is printed): no turn is run
        renderer = StreamRenderer(console, prefix=len(agents) > 1, errors=errors)
        disposers = renderer.attach(rt.hooks)
        starts = {agent.id: attach_index(agent.session.events) for agent in agents}
        finished = True
        presses: list[int] = []
        async with trio.open_nursery() as nursery:
            waiting = trio.CancelScope()
            await nursery.start(watch_interrupts, agents, waiting, presses)
            with waiting:
                for agent in agents:
                    agent.followup(prompt)
                for agent in agents:
                    await agent.wait_idle()
            finished = not waiting.cancelled_caught
            nursery.cancel_scope.cancel()
        for dispose in disposers:
            dispose()
        renderer.end_line()
        code = report_turns(agents, starts, renderer, console, errors, quiet=quiet)
        if not finished:
            code = EXIT_FAILED
        hint = hint or ResumeHint(config=config.source, first_agent=config.agents[0].id)
        if _report_waiting(agents, hint, errors) and code == EXIT_OK:
            code = EXIT_AWAITING
        if rt.start_failures:
            code = EXIT_USAGE
        if presses:
            errors.print("interrupted: the cancelled turns are stored as aborted", soft_wrap=True)
            code = EXIT_INTERRUPTED
        kept = [agent.session_id for agent in agents if agent.id not in renderer.store_failures]
        print_stored(stored, kept, console, errors)
        return code


def print_stored(
    stored: StoredAt | None, session_ids: Sequence[str], console: Console, errors: Console
) -> None:
    """The closing lines on stderr: where the sessions are, and how to show one.

    An agent whose store failed or whose session another process took has said so in its own
    line instead: what it did last is not stored, and the session may no longer be its own.
    """
    if stored is None:
        return
    console.file.flush()  # they come last, after what stdout holds
    for line in stored.lines(session_ids):
        errors.print(visible(line), soft_wrap=True, markup=False, highlight=False)


def report_turns(
    agents: Sequence[Agent],
    starts: Mapping[str, int],
    renderer: StreamRenderer,
    console: Console,
    errors: Console,
    *,
    quiet: bool,
) -> int:
    """Print each session's summary and its failed turns; 1 when one failed, else 0.

    The summary is skipped when ``quiet``; a turn counts from ``starts[agent.id]`` on, and an
    agent whose store failed counts as failed.
    """
    code = EXIT_OK
    for agent in agents:
        events = agent.session.events
        if not quiet:
            _summary(console, agent, events)
        if agent.id in renderer.store_failures:
            code = EXIT_FAILED  # its one line was printed when it happened
            continue
        for reason in failed_turns(events, starts[agent.id]):
            code = EXIT_FAILED
            line = visible(f"{agent.id}: a turn ended {reason.get('kind')}")
            errors.print(line, soft_wrap=True, markup=False)
    return code


def _report_waiting(agents: Sequence[Agent], hint: ResumeHint, errors: Console) -> bool:
    """One stderr line per call waiting in the agents' trees; True when there was one."""
    waiting = False
    for top in agents:
        for agent, request in pending_calls(agent_tree(top)):
            waiting = True
            how = hint.how(top.id, top.session_id, request.call_id)
            errors.print(pending_line(agent.id, request, how), soft_wrap=True, markup=False)
    return waiting


def _summary(console: Console, agent: Agent, events: Sequence[Event]) -> None:
    console.print()
    title = visible(f"session {agent.session_id}  ({len(events)} events)")
    console.print(Text(title, style="bold"), soft_wrap=True)
    # The words of ``sessions show`` (one vocabulary for a log: ``_transcript.py``).
    for line in [*totals(events).lines(), *transcript_lines(events)]:
        console.print(visible(line), soft_wrap=True, markup=False, highlight=False)
