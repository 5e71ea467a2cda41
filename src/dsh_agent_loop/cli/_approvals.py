"""Tool calls waiting for a person: the permission mode, how a call is shown, and where it waits.

The CLI decides no call itself: the runtime's permission policy (``docs/security.md``) runs,
refuses or defers each one, and a deferred call waits durably in its agent's session
(``docs/embedding.md#tool-approval``). This module holds what ``run`` and ``chat`` share about
those calls.

- ``--permission-mode MODE`` replaces the mode of the runtime policy and of every declared
  agent's and sub-agent's own policy, keeping all their rules; a config with no runtime policy
  gets ``Permissions(mode=MODE)``. So the mode applies to every agent the command runs, and a
  ``deny`` rule of the config still refuses under ``allow-all``.
- A call is shown whole, because a person can only decide what they can read: the arguments as
  JSON, never cut, with every control character made visible (``_terminal.visible``; JSON
  already escapes the C0 ones, ``json_visible`` the C1 and bidi ones). A long command wraps on
  the terminal; nothing is elided, so ``; touch HIDDEN`` at the end of a 600-character command is
  on screen. A string argument is shown as a JSON string, so its ends and any newline in it are
  unambiguous.
- The calls waiting in an agent's tree: its own, then each live sub-agent's (``Agent.children``)
  depth first, since a sub-agent's call is the person's to decide like the parent's.
- A sub-agent session left waiting by an earlier process (a ``run`` that exited 3, a ``chat``
  whose input ended) is resumed under its parent when the parent's session is resumed
  (``resume_waiting_children``), so ``chat --resume PARENT`` asks about it; that is the command
  ``run`` prints (``ResumeHint``). ``approve``/``deny`` (``_decide.py``) take the parent's
  session and the call id, and bring such sessions back the same way.
- What waits in a stored session, its waiting sub-agent sessions' calls included, is read
  without opening it for writing (``stored_pending``): ``run --resume`` refuses to queue a
  prompt behind such calls, and the refusal appends nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar, final

import attrs
import trio

from .._agent import subagents
from .._agent.approvals import request_of
from .._agent.results import ApprovalRequest
from .._errors import AgentLoopError, SessionNotFoundError
from .._frozen import thaw
from .._permissions import PERMISSION_MODES, PermissionMode, Permissions
from .._session.projections import AWAITING_APPROVAL, ApprovalState
from ..config import AgentEntry, RuntimeConfig, SubagentEntry
from ._setup import missing_local_store
from ._terminal import json_visible, visible

if TYPE_CHECKING:
    from rich.console import Console

    from .._agent.agent import Agent
    from .._runtime import Runtime
    from .._session.store import SessionStore

__all__ = [
    "MODES_TEXT",
    "ResumeHint",
    "StoredCall",
    "agent_tree",
    "call_text",
    "pending_calls",
    "pending_line",
    "permission_mode",
    "resume_waiting_children",
    "stored_pending",
    "waiting_before_prompt",
    "with_permission_mode",
]

#: The modes, as the usage error and ``--help`` list them.
MODES_TEXT: Final = ", ".join(PERMISSION_MODES)
#: An argument name shown bare; any other is shown as a JSON string.
_PLAIN_KEY: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")

_Entry = TypeVar("_Entry", AgentEntry, SubagentEntry)


def permission_mode(text: str) -> PermissionMode:
    """``--permission-mode``'s argument type.

    Raises:
        argparse.ArgumentTypeError: not one of the modes (a usage error, exit 2).
    """
    if text not in PERMISSION_MODES:
        raise argparse.ArgumentTypeError(f"expected one of {MODES_TEXT}, got {text!r}")
    return text


def _with_mode(entry: _Entry, mode: PermissionMode) -> _Entry:
    if entry.permissions is None:
        return entry  # it follows the runtime's (or its parent's) policy
    return attrs.evolve(entry, permissions=attrs.evolve(entry.permissions, mode=mode))


def with_permission_mode(config: RuntimeConfig, mode: PermissionMode | None) -> RuntimeConfig:
    """``config`` whose every permission policy has mode ``mode`` (None: ``config`` itself)."""
    if mode is None:
        return config
    plugin = config.plugin
    runtime = (
        Permissions(mode=mode)
        if plugin.permissions is None
        else attrs.evolve(plugin.permissions, mode=mode)
    )
    return attrs.evolve(
        config,
        plugin=attrs.evolve(
            plugin,
            permissions=runtime,
            agents=tuple(_with_mode(entry, mode) for entry in plugin.agents),
            subagents=tuple(_with_mode(entry, mode) for entry in plugin.subagents),
        ),
    )


# -- the calls waiting ---------------------------------------------------------------------------


def agent_tree(agent: Agent) -> list[Agent]:
    """``agent`` and its live sub-agents, depth first (children in creation order)."""
    found = [agent]
    for child in agent.children:
        found.extend(agent_tree(child))
    return found


def pending_calls(agents: Iterable[Agent]) -> list[tuple[Agent, ApprovalRequest]]:
    """Each call waiting for a decision, with the agent it belongs to, in the given order."""
    return [(agent, request) for agent in agents for request in agent.pending_approvals()]


def _json(value: Any) -> str:
    return json_visible(json.dumps(thaw(value), ensure_ascii=False, default=str))


def _key(key: object) -> str:
    text = str(key)
    return text if _PLAIN_KEY.fullmatch(text) else _json(text)


def call_text(agent_id: str, request: ApprovalRequest) -> str:
    """What ``chat`` shows before asking: who asks for which tool, then each argument whole."""
    lines = [f"{agent_id} asks to run {request.name}:"]
    arguments = request.arguments
    if isinstance(arguments, Mapping) and arguments:
        lines.extend(f"  {_key(key)}: {_json(value)}" for key, value in arguments.items())
    else:
        lines.append(f"  {_json(arguments)}")
    return visible("\n".join(lines))


def pending_line(agent_id: str, request: ApprovalRequest, how: str) -> str:
    """``run``'s one line for a waiting call: agent, tool, whole arguments, then ``how``."""
    arguments = _json(request.arguments)
    return visible(f"{agent_id}: {request.name} {arguments} is waiting for approval; {how}")


@final
@attrs.frozen
class ResumeHint:
    """The ``chat`` command that asks about the calls a ``run`` left waiting."""

    config: str
    """The config path as the user gave it."""
    first_agent: str
    """The agent ``chat`` talks to without ``--agent``."""
    store: str | None = None
    """``--store`` as given (None: the config's store, which ``chat`` reads too)."""
    tools: tuple[str, ...] = ()
    """The ``--tool`` references given (the calls may need them to run)."""
    mode: PermissionMode | None = None
    """``--permission-mode`` as given."""
    forgets: bool = False
    """The store keeps nothing after the run (``memory:``): no later command can decide."""

    def how(self, agent_id: str, session_id: str, call_id: str | None = None) -> str:
        """How a call waiting in ``session_id`` of declared agent ``agent_id`` gets decided.

        With ``call_id``, the ``approve``/``deny`` commands that decide that call follow the
        ``chat`` command.
        """
        if self.forgets:
            return (
                "it is lost when run exits, as the memory: store keeps nothing (give a --store"
                " that keeps sessions to decide it with chat, or --permission-mode deny-asks)"
            )
        chat = f"decide with: {self.command(agent_id, session_id)}"
        return chat if call_id is None else f"{chat}; or {self.decide_how(session_id, call_id)}"

    def command(self, agent_id: str, session_id: str) -> str:
        """``dsh-agent chat CONFIG [--agent ID] --resume SESSION ...``, quoted for a shell."""
        parts = ["dsh-agent", "chat", self.config]
        if agent_id != self.first_agent:
            parts += ["--agent", agent_id]
        parts += ["--resume", session_id]
        return self._quoted(parts)

    def decide_command(self, verb: str, session_id: str, call_id: str) -> str:
        """``dsh-agent approve|deny SESSION CALL_ID --config CONFIG ...``, quoted for a shell."""
        config = ["--config", self.config] if self.config else []
        return self._quoted(["dsh-agent", verb, session_id, call_id, *config])

    def decide_how(self, session_id: str, call_id: str) -> str:
        """The two commands that decide call ``call_id`` waiting under ``session_id``."""
        approve = self.decide_command("approve", session_id, call_id)
        deny = self.decide_command("deny", session_id, call_id)
        return f"approve with: {approve} (or deny with: {deny})"

    def _quoted(self, parts: list[str]) -> str:
        if self.store is not None:
            parts += ["--store", self.store]
        for ref in self.tools:
            parts += ["--tool", ref]
        if self.mode is not None:
            parts += ["--permission-mode", self.mode]
        return " ".join(shlex.quote(part) for part in parts)


@final
@attrs.frozen
class StoredCall:
    """A call waiting for approval in a stored session, as read from the store."""

    agent_id: str
    """The agent of the session it waits in."""
    session_id: str
    """The session it waits in (the given one, or a sub-agent session below it)."""
    request: ApprovalRequest
    """The call."""


# -- sub-agent sessions left waiting -------------------------------------------------------------


async def _parent_session(store: SessionStore, session_id: str) -> str | None:
    try:
        handle = await store.open(session_id, "read")
    except SessionNotFoundError:  # deleted meanwhile: no link to follow
        return None
    try:
        parent, _ = subagents.links(handle.header)
    finally:
        await handle.close()
    return parent


async def _waiting_chains(store: SessionStore, root: str) -> list[list[str]]:
    """For each stored session waiting for approval below ``root``: its sessions from the top.

    Only the waiting sessions' headers and their ancestors' are read, not every session's.
    """
    infos = await store.list()
    waiting = [
        i.session_id
        for i in infos
        if (i.last_turn_end or {}).get("kind") == AWAITING_APPROVAL and i.session_id != root
    ]
    parents: dict[str, str | None] = {}
    chains = []
    for session_id in waiting:
        chain = [session_id]
        while chain[-1] != root and len(chain) <= len(infos):
            current = chain[-1]
            if current not in parents:
                parents[current] = await _parent_session(store, current)
            up = parents[current]
            if up is None:
                break
            chain.append(up)
        if chain[-1] == root:
            chains.append(chain[-2::-1])  # top first, root left out
    return chains


async def _stored_calls(store: SessionStore, session_id: str) -> list[StoredCall]:
    try:
        handle = await store.open(session_id, "read")
    except SessionNotFoundError:  # absent (or deleted meanwhile): nothing waits there
        return []
    try:
        header, events = handle.header, await handle.read()
    finally:
        await handle.close()
    state = ApprovalState()
    for event in events:
        if event.type in state.types:
            state.fold(event)
    agent_id = str(header.get("agent_id", ""))
    return [
        StoredCall(
            agent_id,
            session_id,
            request_of(d),
        )
        for d in (e.data for e in state.pending())
    ]


async def stored_pending(store: SessionStore, session_id: str) -> list[StoredCall]:
    """The calls waiting in stored session ``session_id`` and in its sub-agent sessions.

    Read only: nothing is opened for writing, nothing appended. An absent session has none.
    """
    found = await _stored_calls(store, session_id)
    for chain in await _waiting_chains(store, session_id):
        found.extend(await _stored_calls(store, chain[-1]))
    return found


async def waiting_before_prompt(
    config: RuntimeConfig,
    agent_ids: Iterable[str],
    store: SessionStore,
    url: str | None,
    hint: ResumeHint | None,
    errors: Console,
) -> bool:
    """``run`` on stored sessions: say which calls wait in them and how to decide each.

    Returns True when one waits: ``run`` then queues nothing and exits 3, and the store is
    closed here (no runtime opens it). Read only: a store that does not exist is not created.
    """
    wanted = set(agent_ids)
    sessions = [
        session_id
        for entry in config.agents
        if entry.id in wanted
        for session_id in (entry.resume_session_id, entry.session_id)
        if session_id is not None
    ]
    if not sessions or (url is not None and missing_local_store(url)):
        return False
    hint = hint or ResumeHint(config=config.source, first_agent=config.agents[0].id)
    done = True  # a failed read closes the store too: the caller opens no runtime then
    try:
        done = await _report_stored(store, sessions, hint, errors)
    finally:
        if done:
            with trio.CancelScope(shield=True):
                await store.aclose()
    return done


async def _report_stored(
    store: SessionStore, sessions: Iterable[str], hint: ResumeHint, errors: Console
) -> bool:
    waiting = False
    for session_id in sessions:
        calls = await stored_pending(store, session_id)
        if calls:
            waiting = True
            errors.print(
                visible(
                    f"session {session_id} has tool calls waiting for approval, so the prompt"
                    " was not queued (nothing was added to the session); decide them first:"
                ),
                soft_wrap=True,
                markup=False,
            )
        for call in calls:
            how = hint.decide_how(session_id, call.request.call_id)
            line = pending_line(call.agent_id, call.request, how)
            errors.print(line, soft_wrap=True, markup=False)
    return waiting


async def resume_waiting_children(rt: Runtime, agent: Agent) -> list[str]:
    """Resume the stored sub-agent sessions below ``agent``'s that wait for approval.

    Each is resumed as the sub-agent of its (resumed) parent, as it last ran; the sessions
    between ``agent``'s and a waiting one are resumed too, so every link is live. Returns one
    line per session that could not be resumed (its calls stay waiting in the store).
    """
    chains = await _waiting_chains(rt.store, agent.session_id)
    live = {a.session_id: a for a in agent_tree(agent)}
    problems: list[str] = []
    for chain in chains:
        parent = agent
        for session_id in chain:
            child = live.get(session_id)
            if child is None:
                try:
                    handle = await rt.agents.resume(session_id, parent_agent=parent)
                except AgentLoopError as exc:
                    problems.append(f"cannot resume sub-agent session {session_id}: {exc}")
                    break
                child = live[session_id] = handle.agent
            parent = child
    return problems
