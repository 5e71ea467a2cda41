"""``approve``/``deny`` of a session a fleet worker holds: decide its calls through the fleet.

``_decide.py`` decides calls by resuming the session in this process. A session a live worker
holds (docs/design.md#fleet-workers) cannot be resumed here: the store refuses a second owner
(``SessionAlreadyOwnedError``). Then, when the store carries a fleet with a live worker, each call
is decided with ``FleetClient.approve``/``deny`` (docs/design.md#fleet-clients), which return
once the worker applied the decision; ``--timeout`` bounds each wait (a decision no worker
applied in time stays queued: exit 3). The worker runs the continuation; this command follows
the session's log until that turn ends and prints its events as ``approve`` prints a local
continuation (``--quiet``: none). Exit codes are the local path's: 0 done, 1 a decision the worker
refused or a turn that ended ``error``/``interrupted``, 3 calls still wait (or a decision is
still queued).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, final

import attrs
import trio
from rich.console import Console

from .._errors import ConfigError
from .._session.store import SessionStore
from ..events import TURN_END, Event
from ..fleet import FleetClient, FleetCommandError, open_client
from ._approvals import ResumeHint, StoredCall, pending_line, stored_pending
from ._run import FAILED_KINDS, print_stored
from ._setup import EXIT_AWAITING, EXIT_FAILED, EXIT_OK, StoredAt, make_store
from ._terminal import visible
from ._transcript import transcript_lines

__all__ = ["DecideOptions", "decide_in_fleet", "fleet_serves"]

#: Seconds between looks at the log while following the continuation.
_POLL: Final = 0.05


async def fleet_serves(url: str, session_id: str) -> bool:
    """True when ``url``'s store carries a fleet and a live worker of it holds ``session_id``."""
    store = make_store(url)
    try:
        try:
            client = FleetClient(store)
        except ConfigError:
            return False
        try:
            return await client.owner(session_id) is not None
        finally:
            await client.aclose()
    finally:
        with trio.CancelScope(shield=True):
            await store.aclose()


@final
@attrs.frozen
class DecideOptions:
    """How the calls are decided: the ``approve``/``deny`` flags the fleet path needs."""

    approve: bool
    """``approve`` (True) or ``deny``."""
    always: bool = False
    """``approve --always``."""
    message: str | None = None
    """``deny --message``."""
    quiet: bool = False
    """No event lines."""
    timeout: float = 30.0
    """Seconds each decision, and the continuation, may take to be applied."""


def _say(console: Console, text: str) -> None:
    console.print(visible(text), soft_wrap=True, markup=False, highlight=False, style="dim")


async def _log(store: SessionStore, session_id: str) -> list[Event]:
    reader = await store.open(session_id, "read")
    try:
        return list(await reader.read(0))
    finally:
        with trio.CancelScope(shield=True):
            await reader.close()


async def _decide_each(
    client: FleetClient,
    session_id: str,
    calls: Sequence[StoredCall],
    how: DecideOptions,
    console: Console,
    errors: Console,
) -> int:
    """Send each decision and wait for the worker to apply it; the exit code so far."""
    code = EXIT_OK
    verb = "approved" if how.approve else "denied"
    for call in calls:
        call_id = call.request.call_id
        what = f"{call.agent_id}'s call {call_id} of {call.request.name}"
        try:
            with trio.move_on_after(how.timeout) as waiting:
                if how.approve:
                    await client.approve(session_id, call_id, always=how.always)
                else:
                    await client.deny(session_id, call_id, how.message)
        except FleetCommandError as exc:
            errors.print(visible(" ".join(str(exc).split())), soft_wrap=True, markup=False)
            code = EXIT_FAILED
            continue
        if waiting.cancelled_caught:
            line = (
                f"the decision on {what} is queued: no worker applied it within"
                f" {how.timeout:g} s (a worker applies it when it takes the session)"
            )
            errors.print(visible(line), soft_wrap=True, markup=False)
            return EXIT_AWAITING
        always = " (and calls like it from now on)" if how.approve and how.always else ""
        _say(console, f"{verb} {what}{always}, on the fleet worker that holds the session")
    return code


async def _follow(client: FleetClient, session_id: str, after: int, timeout: float) -> bool:
    """Wait for a ``turn/end`` after seq ``after``; False when ``timeout`` passed first."""
    with trio.move_on_after(timeout):
        async for event in client.events(session_id, after_seq=after, poll_interval=_POLL):
            if event.type == TURN_END:
                return True
    return False


async def decide_in_fleet(
    url: str,
    session_id: str,
    calls: Sequence[StoredCall],
    how: DecideOptions,
    *,
    console: Console,
    errors: Console,
    hint: ResumeHint,
) -> int:
    """Decide ``calls`` of ``session_id`` through the fleet on ``url``; the exit code."""
    store = make_store(url)
    try:
        async with open_client(store) as client:
            start = len(await _log(store, session_id))
            code = await _decide_each(client, session_id, calls, how, console, errors)
            if code == EXIT_AWAITING:
                return code
            decided = {call.request.call_id for call in calls}
            left = [
                c
                for c in await stored_pending(store, session_id)
                if c.request.call_id not in decided
            ]
            if (
                not left
                and code == EXIT_OK
                and not await _follow(client, session_id, start - 1, how.timeout)
            ):
                errors.print(
                    f"the continuation still runs on the worker after {how.timeout:g} s",
                    soft_wrap=True,
                    markup=False,
                )
            events = await _log(store, session_id)
            code = max(code, _report(events, start, how.quiet, console, errors))
            waiting = await stored_pending(store, session_id)
    finally:
        with trio.CancelScope(shield=True):
            await store.aclose()
    for call in waiting:
        line = pending_line(
            call.agent_id, call.request, hint.decide_how(session_id, call.request.call_id)
        )
        errors.print(line, soft_wrap=True, markup=False)
    if waiting and code == EXIT_OK:
        code = EXIT_AWAITING
    print_stored(StoredAt(url), [session_id], console, errors)
    return code


def _report(
    events: Sequence[Event], start: int, quiet: bool, console: Console, errors: Console
) -> int:
    """The new events, one line each (unless ``quiet``); 1 when a new turn failed."""
    if not quiet:
        for line in transcript_lines(events, start):
            console.print(visible(line), soft_wrap=True, markup=False, highlight=False)
    code = EXIT_OK
    for event in events[start:]:
        if event.type == TURN_END:
            kind = (event.data.get("reason") or {}).get("kind")
            if kind in FAILED_KINDS:
                errors.print(visible(f"a turn ended {kind}"), soft_wrap=True, markup=False)
                code = EXIT_FAILED
    return code
