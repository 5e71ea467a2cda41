"""``dsh-agent chat``: an interactive session with one agent.

SIGINT is received inside trio (``trio.open_signal_receiver``), never as a KeyboardInterrupt
racing the runtime: while a turn runs, Ctrl-C cancels it (``cause="user"``; the delivered text
stays in the log as an interrupted anchor); a Ctrl-C while idle, or two within
``DOUBLE_PRESS`` seconds, exits. Lines are read from standard input in a worker thread that is
abandoned on exit. ``/new`` disposes the agent and creates it again on a new session,
``/resume ID`` moves it to a stored session, ``/exit`` (or end of input) leaves.

A tool call waiting for approval (the permission policy deferred it, ``docs/security.md``) is shown
whole (``_approvals.call_text``: the agent, the tool, every argument, never cut, controls made
visible) and asked about: ``[y]es`` runs it, ``[n]o`` refuses it, ``[a]lways this session`` runs it
and records a durable allow rule for that exact call (``agent.approve(call_id, always=True)``), so
the same call later in the session, after a resume too, runs unasked. Any other answer asks again,
except ``/exit``, which leaves at once (the calls stay pending). A line typed while a turn runs
waits in the terminal; when it is read (as the next prompt, or as an answer) it is shown after the
prompt, so the turn it starts is seen to start from it. The calls of the chatting agent and of each
of its live sub-agents are asked about, each naming its agent: a turn that ends
``awaiting-approval`` anywhere in the tree is seen at once through the ``session/event``
notification, so a sub-agent's call is asked about even while the parent's turn still runs. Once an
agent's calls are decided its continuation runs and is shown; the REPL prompts again when the whole
tree is idle. A resumed session (``--resume``, ``/resume``) brings back its sub-agent sessions left
waiting and asks about every waiting call first. End of input, or Ctrl-C at a question, leaves the
calls pending in the session.

When the agent's store fails or another process takes its session over (``agent/error`` with
``OWNERSHIP_LOST`` or ``STORE_FAILED``), the agent stops: the renderer says so in one line and
the REPL leaves at once with exit 1, mid-turn or waiting for input alike.

Without a config the agent talks to an offline echo model, so the REPL can be tried anywhere.
"""

from __future__ import annotations

import math
import select
import signal
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final

import attrs
import trio
from rich.console import Console
from rich.text import Text

from .._agent.agent import Agent
from .._agent.lifecycle import AgentHandle
from .._agent.results import ApprovalRequest
from .._errors import AgentLoopError
from .._frozen import FrozenDict
from .._runtime import Runtime, open_runtime
from .._session.projections import AWAITING_APPROVAL
from .._session.store import SessionStore
from .._tools.base import Tool
from ..config import PLUGIN_NAME, RuntimeConfig, load_config
from ..events import AGENT_ERROR, SESSION_EVENT, TURN_END, Event
from ..llm import ModelAdapter, ModelRequest, Reply, ScriptedModel
from ._approvals import agent_tree, call_text, pending_calls, resume_waiting_children
from ._render import STORE_FAILURES, StreamRenderer, message_text, reason_text
from ._run import failed_turns, print_stored, report_start_failures
from ._setup import EXIT_FAILED, EXIT_OK, EXIT_USAGE, StoredAt
from ._terminal import redact_url, visible

__all__ = ["ANSWERS", "ASK", "DOUBLE_PRESS", "PROMPT", "chat", "echo_config"]

#: Two Ctrl-C within this many seconds exit even while a turn winds down.
DOUBLE_PRESS: Final = 1.0
#: The input prompt.
PROMPT: Final = "you> "
ECHO_PROVIDER: Final = "echo"
#: The question asked about each call waiting for approval.
ASK: Final = "allow? [y]es / [n]o / [a]lways this session: "
#: What an answer to ``ASK`` means.
ANSWERS: Final[Mapping[str, str]] = FrozenDict(
    y="yes", yes="yes", n="no", no="no", a="always", always="always"
)
#: The commands that leave, at the prompt and at an approval question alike.
EXITS: Final = ("/exit", "/quit")
#: The denial message a refused call carries.
DECLINED: Final = "the user declined"
HELP: Final = (
    "/new  start a new session · /resume ID  continue a stored session · /session  show the "
    "session id · /compact [INSTRUCTIONS]  summarise older history · /exit  leave · "
    "Ctrl-C cancels a running turn; Ctrl-C when idle exits"
)


def _input_waiting() -> bool:
    """True when standard input has a line ready (typed ahead) before it is read."""
    try:
        return bool(select.select([sys.stdin], [], [], 0)[0])
    except (OSError, ValueError):  # closed, or no file descriptor
        return False


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
        self.asking = trio.Event()
        """Set when a turn ended ``awaiting-approval`` (any agent: ``settle`` looks whose)."""

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

    def on_session_event(self, event: Event) -> None:
        """``session/event`` observer: a turn that ended awaiting approval wakes ``settle``."""
        stored = event.data.get("event")
        if isinstance(stored, Event) and stored.type == TURN_END:
            reason = stored.data.get("reason") or {}
            if reason.get("kind") == AWAITING_APPROVAL:
                self.asking.set()

    # -- input and signals -------------------------------------------------------------------
    async def read_line(self, prompt: str = PROMPT) -> str | None:
        """The next input line, or None at end of input."""
        self.renderer.end_line()
        self.console.print(Text(visible(prompt), style="bold green"), end="", soft_wrap=True)
        self.console.file.flush()
        # A line typed while a turn ran was echoed by the terminal then, amid the output: it is
        # shown again after the prompt, so the turn it starts (or the answer) reads in place.
        typed_ahead = self.echoed and _input_waiting()
        line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        if line and (typed_ahead or not self.echoed):
            # A terminal echoes what is typed; piped input is shown so transcripts read well.
            self.console.print(Text(visible(line.rstrip("\n"))), soft_wrap=True)
        return line if line else None

    async def watch_interrupts(self, signals: AsyncIterator[int], leave: trio.CancelScope) -> None:
        async for _ in signals:
            now = trio.current_time()
            twice = now - self.last_interrupt < DOUBLE_PRESS
            self.last_interrupt = now
            if self.busy and not twice:
                # The sub-agents too: one may run on its own (a continuation after its approval).
                for agent in agent_tree(self.handle.agent):
                    if agent.status.value == "running":
                        agent.cancel(cause="user")
                self.say("^C cancelling the turn (Ctrl-C again to exit)", "yellow")
            else:
                self.say("^C bye")
                leave.cancel()
                return

    # -- turns and approvals -----------------------------------------------------------------
    async def turn(self, text: str | None) -> None:
        """Run a turn for ``text`` (None: only what is due) and everything it leads to."""
        agent = self.handle.agent
        start = len(agent.session)
        if text is not None:
            agent.followup(text)
        await self.settle()
        self.renderer.end_line()
        events = agent.session.events
        if failed_turns(events, start):
            self.failed = True
        for event in events[start:]:
            reason = event.data.get("reason") if event.type == TURN_END else None
            if reason is not None and reason.get("kind") == "aborted":
                self.say(f"turn {reason_text(reason)}: what was shown is kept in the session")

    def quiet(self) -> bool:
        """True when the agent and its live sub-agents are all idle."""
        return all(a.status.value == "idle" for a in agent_tree(self.handle.agent))

    async def settle(self) -> None:
        """Wait until the agent's tree is idle, asking about each call that waits meanwhile."""
        while True:
            self.asking = trio.Event()  # before looking: a later request sets the new one
            waiting = pending_calls(agent_tree(self.handle.agent))
            if waiting:
                if not await self.decide(waiting):
                    return
                continue
            if self.quiet():
                return
            self.busy = True  # Ctrl-C cancels the turn; at a question it leaves (see ``ask``)
            try:
                await self.quiet_or_asked()
            finally:
                self.busy = False

    async def quiet_or_asked(self) -> None:
        """Return when the tree is idle or a turn ended awaiting approval, whichever is first."""
        async with trio.open_nursery() as nursery:

            async def idle() -> None:
                while not self.quiet():
                    for agent in agent_tree(self.handle.agent):
                        await agent.wait_idle()
                nursery.cancel_scope.cancel()

            async def asked() -> None:
                await self.asking.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(idle)
            nursery.start_soon(asked)

    async def decide(self, waiting: Sequence[tuple[Agent, ApprovalRequest]]) -> bool:
        """Ask about each call and record the answer; False when nothing more can be decided."""
        for agent, request in waiting:
            answer = await self.ask(agent.id, request)
            if answer is None:
                self.say("left undecided: the calls stay pending in the session")
                return False
            try:
                if answer == "always":
                    self.granted(agent.id, agent.approve(request.call_id, always=True))
                elif answer == "yes":
                    agent.approve(request.call_id)
                else:
                    agent.deny(request.call_id, DECLINED)
            except (AgentLoopError, ValueError) as exc:  # disposed, or decided meanwhile
                self.complain(f"cannot decide {agent.id}'s call of {request.name}: {exc}")
                return False
        return True

    def granted(self, agent_id: str, rule: str | None) -> None:
        """Say what an "always" answer allowed (a rule, or nothing beyond this call)."""
        if rule is not None:
            self.say(f"{agent_id}: allowed from now on in this session: {rule}")
        else:
            self.say(
                f"{agent_id}: approved once; no rule can allow calls like it (a path outside its"
                " working directory), so they will be asked about again"
            )

    async def ask(self, agent_id: str, request: ApprovalRequest) -> str | None:
        """Show the call whole and ask until the answer is y, n or a (None: end of input)."""
        self.renderer.end_line()
        self.console.print(Text(call_text(agent_id, request), style="yellow", overflow="fold"))
        while True:
            line = await self.read_line(ASK)
            if line is None:
                return None
            if line.strip() in EXITS:  # leave now; the calls stay pending in the session
                if self.leave is not None:
                    self.leave.cancel()
                return None
            answer = ANSWERS.get(line.strip().lower())
            if answer is not None:
                return answer
            self.complain(
                "answer y (run it), n (refuse it) or a (run it, and the same call from now on"
                " in this session without asking)"
            )

    async def adopt_waiting(self) -> None:
        """Bring back the sub-agent sessions of a resumed session that wait for approval."""
        try:
            problems = await resume_waiting_children(self.rt, self.handle.agent)
        except AgentLoopError as exc:
            problems = [f"cannot look for sub-agent sessions waiting for approval: {exc}"]
        for problem in problems:
            self.complain(problem)

    # -- commands ----------------------------------------------------------------------------
    async def command(self, text: str) -> bool:
        """Run a ``/command``; False means leave."""
        name, _, rest = text.partition(" ")
        argument = rest.strip()
        if name in EXITS:
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
                await self.adopt_waiting()
                await self.turn(None)  # calls waiting there are asked about first
                return
        self.handle = await self.rt.agents.create(options=options)
        self.say(f"new session {self.handle.session_id}")

    async def repl(self, *, resumed: bool) -> None:
        agent = self.handle.agent
        self.say(f"{agent.id} on session {agent.session_id} — /help for commands")
        if resumed:
            await self.adopt_waiting()
        await self.turn(None)  # a resumed session may have calls waiting, or decided and due
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
    stored: StoredAt | None = None,
) -> int:
    """Run the REPL on ``agent_id`` (default: the first declared agent); the exit code.

    ``stored`` makes the closing lines: where the last session is and how to show it.
    """
    async with open_runtime(
        config, store=store, settings=settings, providers=providers, tools=tools
    ) as rt:
        report_start_failures(rt, errors, url)
        wanted = agent_id or (config.agents[0].id if config.agents else None)
        handle = rt.agents.handle(wanted) if wanted is not None else None
        if handle is None:
            return EXIT_USAGE
        entry = next((e for e in config.agents if e.id == wanted), None)
        resumed = entry is not None and (entry.session_id or entry.resume_session_id) is not None
        session = _Chat(rt, handle, url, console, errors)
        disposers = [
            *session.renderer.attach(rt.hooks),
            rt.hooks.on(AGENT_ERROR, session.on_error),
            rt.hooks.on(SESSION_EVENT, session.on_session_event),
        ]
        try:
            with trio.open_signal_receiver(signal.SIGINT) as signals:
                async with trio.open_nursery() as nursery:
                    session.leave = nursery.cancel_scope
                    nursery.start_soon(session.watch_interrupts, signals, nursery.cancel_scope)
                    await session.repl(resumed=resumed)
                    nursery.cancel_scope.cancel()
        finally:
            for dispose in disposers:
                dispose()
        session.renderer.end_line()
        if not session.failed:  # its own line said why the session is not all stored
            print_stored(stored, [session.handle.session_id], console, errors)
        return EXIT_FAILED if session.failed else EXIT_OK
