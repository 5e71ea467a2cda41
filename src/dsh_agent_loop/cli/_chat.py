"""``dsh-agent chat``: an interactive session with one agent.

SIGINT is received inside trio (``trio.open_signal_receiver``), never as a KeyboardInterrupt
racing the runtime: while a turn runs, Ctrl-C cancels it (``cause="user"``; the delivered text
stays in the log as an interrupted anchor); a Ctrl-C while idle, or two within
``DOUBLE_PRESS`` seconds, exits. Lines are read from standard input in a worker thread that is
abandoned on exit. ``/new`` disposes the agent and creates it again on a new session,
``/resume ID`` moves it to a stored session, ``/exit`` (or end of input) leaves.

A tool call waiting for approval (``requireApproval``, ``Tool(requires_approval=...)``) is asked
about with a y/n question, one per call, after the turn that deferred it and after a resume; the
turn then goes on. End of input leaves the calls pending in the session for a later resume.

When the agent's store fails or another process takes its session over (``agent/error`` with
``OWNERSHIP_LOST`` or ``STORE_FAILED``), the agent stops: the renderer says so in one line and
the REPL leaves at once with exit 1, mid-turn or waiting for input alike.

Without a config the agent talks to an offline echo model, so the REPL can be tried anywhere.
"""

from __future__ import annotations

import json
import math
import signal
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final

import attrs
import trio
from rich.console import Console
from rich.text import Text

from .._frozen import thaw
from ..agent.lifecycle import AgentHandle
from ..config import PLUGIN_NAME, RuntimeConfig, load_config
from ..errors import AgentLoopError
from ..events import AGENT_ERROR, TURN_END, Event
from ..llm.base import ModelAdapter, ModelRequest
from ..llm.scripted import Reply, ScriptedModel
from ..runtime import Runtime, open_runtime
from ..session.store import SessionStore
from ..tools.base import Tool
from ._render import STORE_FAILURES, StreamRenderer, message_text, reason_text
from ._run import failed_turns, report_start_failures
from ._setup import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from ._terminal import redact_url, visible

__all__ = ["DOUBLE_PRESS", "PROMPT", "chat", "echo_config"]

#: Two Ctrl-C within this many seconds exit even while a turn winds down.
DOUBLE_PRESS: Final = 1.0
#: The input prompt.
PROMPT: Final = "you> "
ECHO_PROVIDER: Final = "echo"
HELP: Final = (
    "/new  start a new session · /resume ID  continue a stored session · /session  show the "
    "session id · /compact [INSTRUCTIONS]  summarise older history · /exit  leave · "
    "Ctrl-C cancels a running turn; Ctrl-C when idle exits"
)


def _echo(request: ModelRequest) -> Reply:
    for message in reversed(request.messages):
        if message.get("role") == "user":
            return Reply.text(f"(echo) {message_text(message)}")
    return Reply.text("(echo)")


def echo_config() -> tuple[RuntimeConfig, dict[str, ModelAdapter]]:
    """The config used without CONFIG: one agent ``main`` on an offline echo model."""
    model = ScriptedModel([_echo], loop=True, latency=0.02)
    raw = {
        "plugins": [
            {
                "name": PLUGIN_NAME,
                "config": {"agents": [{"id": "main", "provider": ECHO_PROVIDER, "model": "echo"}]},
            }
        ]
    }
    return load_config(raw, known_providers=[ECHO_PROVIDER]), {ECHO_PROVIDER: model}


class _Chat:
    """The REPL state: the current agent handle and whether a turn is running."""

    def __init__(
        self, rt: Runtime, handle: AgentHandle, url: str, console: Console, errors: Console
    ) -> None:
        self.rt = rt
        self.handle = handle
        self.url = url
        self.console = console
        self.errors = errors
        self.renderer = StreamRenderer(console, prefix=False, errors=errors)
        self.busy = False
        self.failed = False
        self.last_interrupt = -math.inf
        self.echoed = sys.stdin.isatty()
        self.leave: trio.CancelScope | None = None
        """Cancelled to leave the REPL at once (set while it runs)."""

    def say(self, text: str, style: str = "dim") -> None:
        self.renderer.end_line()
        self.console.print(Text(visible(text), style=style), soft_wrap=True)

    def complain(self, text: str) -> None:
        self.renderer.end_line()
        self.errors.print(Text(visible(text), style="red"), soft_wrap=True)

    def on_error(self, event: Event) -> None:
        """``agent/error`` observer: a store failure of the chat's agent ends the chat (exit 1)."""
        error = event.data.get("error") or {}
        if error.get("code") not in STORE_FAILURES:
            return
        if event.data.get("agent_id") != self.handle.agent.id:
            return
        self.failed = True
        if self.leave is not None:
            self.leave.cancel()

    # -- input and signals -------------------------------------------------------------------
    async def read_line(self, prompt: str = PROMPT) -> str | None:
        """The next input line, or None at end of input."""
        self.renderer.end_line()
        self.console.print(Text(visible(prompt), style="bold green"), end="", soft_wrap=True)
        self.console.file.flush()
        line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        if line and not self.echoed:
            # A terminal echoes what is typed; piped input is shown so transcripts read well.
            self.console.print(Text(visible(line.rstrip("\n"))), soft_wrap=True)
        return line if line else None

    async def watch_interrupts(self, signals: AsyncIterator[int], leave: trio.CancelScope) -> None:
        async for _ in signals:
            now = trio.current_time()
            twice = now - self.last_interrupt < DOUBLE_PRESS
            self.last_interrupt = now
            if self.busy and not twice:
                self.handle.agent.cancel(cause="user")
                self.say("^C cancelling the turn (Ctrl-C again to exit)", "yellow")
            else:
                self.say("^C bye")
                leave.cancel()
                return

    # -- turns and commands ------------------------------------------------------------------
    async def turn(self, text: str | None) -> None:
        """Run a turn for ``text`` (None: the continuation of decided calls) and its sequels."""
        agent = self.handle.agent
        start = len(agent.session)
        self.busy = True
        try:
            if text is not None:
                agent.followup(text)
            await agent.wait_idle()
        finally:
            self.busy = False
        self.renderer.end_line()
        events = agent.session.events
        if failed_turns(events, start):
            self.failed = True
        for event in events[start:]:
            reason = event.data.get("reason") if event.type == TURN_END else None
            if reason is not None and reason.get("kind") == "aborted":
                self.say(f"turn {reason_text(reason)}: what was shown is kept in the session")
        await self.approvals()

    async def approvals(self) -> None:
        """Ask y/n for each pending tool call; once all are decided the turn goes on."""
        agent = self.handle.agent
        pending = agent.pending_approvals()
        if not pending:
            return
        for request in pending:
            arguments = json.dumps(thaw(request.arguments), ensure_ascii=False)
            line = await self.read_line(f"allow {request.name} {arguments}? [y/n] ")
            if line is None:
                self.say("left undecided: the calls stay pending in the session")
                return
            if line.strip().lower() in ("y", "yes"):
                agent.approve(request.call_id)
            else:
                agent.deny(request.call_id, "the user declined")
        await self.turn(None)

    async def command(self, text: str) -> bool:
        """Run a ``/command``; False means leave."""
        name, _, rest = text.partition(" ")
        argument = rest.strip()
        if name in ("/exit", "/quit"):
            return False
        if name == "/new":
            await self.replace(None)
        elif name == "/resume":
            if not argument:
                self.complain("usage: /resume SESSION_ID")
            else:
                await self.replace(argument)
        elif name == "/session":
            self.say(f"session {self.handle.session_id}")
        elif name == "/compact":
            await self.compact(argument or None)
        elif name == "/help":
            self.say(HELP)
        else:
            self.complain(f"unknown command {name} ({HELP})")
        return True

    async def compact(self, instructions: str | None) -> None:
        """Summarise the older history now (``agent.compact``) and say what it saved."""
        agent = self.handle.agent
        try:
            done = await agent.compact(instructions)
        except AgentLoopError as exc:
            self.complain(f"cannot compact: {exc}")
            return
        if done is None:
            self.say("nothing to compact yet")
        else:
            self.say(
                f"compacted seqs {done.start_seq}..{done.end_seq}: "
                f"~{done.tokens_before} → ~{done.tokens_after} tokens"
            )

    async def replace(self, session_id: str | None) -> None:
        """Dispose the agent and bring it back on a new (None) or a stored session."""
        options = self.handle.agent.options
        if session_id is not None:
            if session_id == self.handle.session_id:
                self.say(f"already in session {session_id}")
                return
            try:
                found = await self.rt.store.stat(session_id)
            except AgentLoopError as exc:
                self.complain(f"cannot resume {session_id}: {exc}")
                return
            if found is None:
                self.complain(f"session '{session_id}' not found in {redact_url(self.url)}")
                return
        await self.handle.dispose()
        if session_id is not None:
            try:
                # the session belongs to its own agent id; the chat's model choice stays
                resumed = attrs.evolve(options, id=found.agent_id)  # type: ignore[union-attr]
                self.handle = await self.rt.agents.resume(session_id, options=resumed)
            except AgentLoopError as exc:
                self.complain(f"cannot resume {session_id}: {exc}")
            else:
                count = len(self.handle.agent.session)
                self.say(f"resumed session {session_id} ({count} events)")
                await self.approvals()
                return
        self.handle = await self.rt.agents.create(options=options)
        self.say(f"new session {self.handle.session_id}")

    async def repl(self) -> None:
        agent = self.handle.agent
        self.say(f"{agent.id} on session {agent.session_id} — /help for commands")
        await self.approvals()  # a resumed session may have calls waiting
        while True:
            line = await self.read_line()
            if line is None:
                self.console.print()
                return
            text = line.strip()
            if not text:
                continue
            if text.startswith("/"):
                if not await self.command(text):
                    return
                continue
            await self.turn(text)


async def chat(
    config: RuntimeConfig,
    store: SessionStore,
    url: str,
    settings: Mapping[str, Any],
    *,
    agent_id: str | None,
    providers: Mapping[str, ModelAdapter] | None,
    console: Console,
    errors: Console,
    tools: Sequence[Tool] = (),
) -> int:
    """Run the REPL on ``agent_id`` (default: the first declared agent); the exit code."""
    async with open_runtime(
        config, store=store, settings=settings, providers=providers, tools=tools
    ) as rt:
        report_start_failures(rt, errors, url)
        wanted = agent_id or (config.agents[0].id if config.agents else None)
        handle = rt.agents.handle(wanted) if wanted is not None else None
        if handle is None:
            return EXIT_USAGE
        session = _Chat(rt, handle, url, console, errors)
        disposers = [*session.renderer.attach(rt.hooks), rt.hooks.on(AGENT_ERROR, session.on_error)]
        try:
            with trio.open_signal_receiver(signal.SIGINT) as signals:
                async with trio.open_nursery() as nursery:
                    session.leave = nursery.cancel_scope
                    nursery.start_soon(session.watch_interrupts, signals, nursery.cancel_scope)
                    await session.repl()
                    nursery.cancel_scope.cancel()
        finally:
            for dispose in disposers:
                dispose()
        return EXIT_FAILED if session.failed else EXIT_OK
