"""``dsh-agent send``, ``cancel`` and ``fleet status``: reach the sessions a fleet serves.

These verbs are fleet clients (docs/design.md#fleet-clients): they start no runtime, they write a
message or a command into the fleet's tables in the store's database and, when asked, wait for a
worker (``dsh-agent worker``, ``_fleet_worker.py``) to deliver or apply it. Only a store every
process can reach carries a fleet, SQLite or PostgreSQL; any other is a usage error (exit 2)
naming them. The store is resolved as for every verb (``--store``, the ``store`` of
``--config``, ``$DSH_AGENT_STORE``, the settings file, ``sqlite:///sessions.db``); of the config
only its ``store`` is read, as ``sessions`` reads it. A SQLite file that does not exist holds no
session and is not created.

- ``send SESSION TEXT`` accepts a followup (``--steer``, ``--inject``: the other kinds) and prints
  its message id; it is durable when the verb exits, and a worker delivers it. ``--wait`` waits
  for the turn that claims the message and prints its answer, with ``run``'s exit codes: 0 done,
  1 the turn ended ``error``, ``interrupted``, ``blocked`` or ``aborted`` (someone cancelled it, a
  worker's drain), 3 it stopped for tool calls waiting for approval (one stderr line each, with
  the commands that decide it), 130 Ctrl-C; ``--timeout`` passed: 1, the message withdrawn.
- ``cancel SESSION`` aborts the session's running turn (and clears its inbox unless
  ``--keep-inbox``) and waits, up to ``--timeout``, for a worker to apply it; when none did, the
  command stays queued and the exit code is 3. ``--no-wait`` only queues it.
- ``fleet status`` lists the workers and what waits (``--json``: one JSON document).

An unknown session exits 2 with ``session 'X' not found in URL``, as elsewhere.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

import trio
from rich.console import Console

from .._agent.results import TurnError, TurnResult
from .._errors import ConfigError, SessionNotFoundError
from .._session.store import SessionStore
from ..fleet import FleetClient, FleetCommandError, FleetStatus, open_client
from ._approvals import ResumeHint, pending_line, stored_pending
from ._numbers import positive_number
from ._run import EXIT_INTERRUPTED, print_stored
from ._setup import (
    EXIT_AWAITING,
    EXIT_FAILED,
    EXIT_OK,
    CliError,
    StoredAt,
    config_store_url,
    make_store,
    missing_local_store,
    store_url,
)
from ._terminal import TerminalGuard, consoles, json_visible, redact_url, visible

__all__ = [
    "add_fleet_verbs",
    "fleet_store",
    "print_status",
    "send_message",
]

#: Seconds ``cancel`` (and a fleet ``approve``/``deny``) waits for a worker by default.
DEFAULT_WAIT: Final = 30.0
#: Turn-end kinds that make ``send --wait`` exit 1.
_FAILED: Final = frozenset({"error", "interrupted", "blocked", "aborted"})


def fleet_store(store: SessionStore, verb: str) -> None:
    """Check that ``store`` can carry a fleet (nothing is opened).

    Raises:
        CliError: it cannot (a memory or JSONL store): exit 2 with the library's reason.
    """
    try:
        FleetClient(store)
    except ConfigError as exc:
        raise CliError(f"{verb}: {exc} ({exc.code})") from None


# -- the parsers ---------------------------------------------------------------------------------


def add_fleet_verbs(verbs: Any, common: argparse.ArgumentParser) -> None:
    """Add ``send``, ``cancel`` and ``fleet status`` to the verbs' sub-parsers."""
    send = verbs.add_parser(
        "send",
        parents=[common],
        help="send a message to a session a fleet worker serves",
        description="Queue TEXT for SESSION in the fleet on the store and print its message id;"
        " a worker delivers it. --wait waits for the turn that claims it and prints the answer."
        " Exit codes as run: 0 done; 1 the turn ended error, interrupted, blocked or aborted, or"
        " --timeout passed (the message is withdrawn); 2 bad usage or store, unknown session; 3"
        " tool calls wait for approval; 130 interrupted (the message is withdrawn).",
    )
    send.add_argument("session_id", metavar="SESSION", help="the session to send to")
    send.add_argument("text", metavar="TEXT", help="the message")
    kind = send.add_mutually_exclusive_group()
    kind.add_argument(
        "--steer", action="store_true", help="for the running turn's next step (wakes the agent)"
    )
    kind.add_argument(
        "--inject", action="store_true", help="for the next step, without waking the agent"
    )
    send.add_argument("--wait", action="store_true", help="wait for the answer (followups only)")
    send.add_argument(
        "--timeout", type=positive_number, metavar="S", help="with --wait: give up after S seconds"
    )
    send.add_argument("--json", action="store_true", help="print one JSON object")
    send.set_defaults(handler=_send_verb)

    cancel = verbs.add_parser(
        "cancel",
        parents=[common],
        help="cancel the running turn of a session a fleet worker serves",
        description="Abort SESSION's running turn (and clear its inbox unless --keep-inbox)"
        " through the fleet, and wait for a worker to apply it. Exit codes: 0 applied; 1 the"
        " worker met an error; 2 bad usage or store, unknown session; 3 no worker applied it"
        " within --timeout (it stays queued).",
    )
    cancel.add_argument("session_id", metavar="SESSION", help="the session")
    cancel.add_argument("--keep-inbox", action="store_true", help="keep the queued messages")
    cancel.add_argument("--no-wait", action="store_true", help="queue it and exit at once")
    cancel.add_argument(
        "--timeout",
        type=positive_number,
        default=DEFAULT_WAIT,
        metavar="S",
        help=f"seconds to wait for a worker (default {DEFAULT_WAIT:.0f})",
    )
    cancel.set_defaults(handler=_cancel_verb)

    fleet = verbs.add_parser("fleet", parents=[common], help="look at the fleet on the store")
    which = fleet.add_subparsers(
        dest="fleet_verb", metavar="ACTION", required=True, parser_class=type(fleet)
    )
    status = which.add_parser(
        "status", parents=[common], help="workers, sessions waiting, undelivered messages"
    )
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.set_defaults(handler=_status_verb)


# -- shared --------------------------------------------------------------------------------------


def _client_store(args: argparse.Namespace, guard: TerminalGuard, verb: str) -> tuple[str, Any]:
    """The verb's store URL and store (built, not opened), checked to carry a fleet."""
    configured = config_store_url(getattr(args, "config", None))
    url = store_url(getattr(args, "store", None), configured)
    guard.add_store_url(url)
    store = make_store(url)
    fleet_store(store, verb)
    return url, store


def _not_found(session_id: str, url: str) -> CliError:
    return CliError(f"session '{visible(session_id)}' not found in {redact_url(url)}")


def _line(console: Console, text: str) -> None:
    console.print(visible(text), soft_wrap=True, markup=False, highlight=False)


def _json_line(console: Console, value: Mapping[str, Any]) -> None:
    text = json_visible(json.dumps(value, ensure_ascii=False))
    console.print(text, soft_wrap=True, markup=False, highlight=False)


# -- send ----------------------------------------------------------------------------------------


def _send_verb(args: argparse.Namespace, guard: TerminalGuard) -> int:
    kind = "steer" if args.steer else "inject" if args.inject else "followup"
    if args.wait and kind != "followup":
        raise CliError(f"send: --wait waits for a followup's answer; a {kind} has none")
    if args.timeout is not None and not args.wait:
        raise CliError("send: --timeout goes with --wait")
    url, store = _client_store(args, guard, "send")
    if missing_local_store(url):
        raise _not_found(args.session_id, url)
    console, errors = consoles(guard)
    return trio.run(
        lambda: send_message(
            store,
            url,
            args.session_id,
            args.text,
            kind=kind,
            wait=args.wait,
            timeout=args.timeout,
            as_json=args.json,
            console=console,
            errors=errors,
            hint=ResumeHint(
                config=getattr(args, "config", None) or "",
                first_agent="",
                store=getattr(args, "store", None),
            ),
        )
    )


async def send_message(
    store: SessionStore,
    url: str,
    session_id: str,
    text: str,
    *,
    kind: str,
    wait: bool,
    timeout: float | None,
    as_json: bool,
    console: Console,
    errors: Console,
    hint: ResumeHint,
) -> int:
    """Send (and with ``wait``, follow) one message; the exit code.

    Raises:
        CliError: the session does not exist (exit 2).
    """
    try:
        async with open_client(store) as client:
            if not wait:
                mid = await client.send(session_id, text, kind=kind)
                if as_json:
                    _json_line(console, {"session_id": session_id, "message_id": mid, "kind": kind})
                else:
                    _line(console, mid)
                await _note_no_worker(client, url, errors, "it is delivered when one starts")
                code = EXIT_OK
            else:
                await _note_no_worker(client, url, errors, "waiting for one (Ctrl-C withdraws it)")
                code = await _send_and_wait(
                    client, session_id, text, timeout, as_json, console, errors
                )
        if code == EXIT_AWAITING:
            await _report_waiting(store, session_id, hint, errors)
    except SessionNotFoundError:
        raise _not_found(session_id, url) from None
    finally:
        with trio.CancelScope(shield=True):
            await store.aclose()
    if code != EXIT_INTERRUPTED:
        print_stored(StoredAt(url), [session_id], console, errors)
    return code


async def _send_and_wait(
    client: FleetClient,
    session_id: str,
    text: str,
    timeout: float | None,
    as_json: bool,
    console: Console,
    errors: Console,
) -> int:
    try:
        result = await client.run(session_id, text, timeout=timeout)
    except trio.TooSlowError:
        _line(
            errors,
            f"send: no answer within {timeout:g} s; the message is withdrawn (the worker that"
            " takes it removes it, or aborts its turn)",
        )
        return EXIT_FAILED
    except KeyboardInterrupt:
        _line(errors, "interrupted: the message is withdrawn (or its turn aborted)")
        return EXIT_INTERRUPTED
    except TurnError as exc:
        if exc.result is None:  # removed before a turn claimed it
            _line(errors, f"send: {' '.join(str(exc).split())}")
            return EXIT_FAILED
        result = exc.result
    _print_result(session_id, result, as_json, console, errors)
    if result.kind in _FAILED:
        return EXIT_FAILED
    return EXIT_AWAITING if result.kind == "awaiting-approval" else EXIT_OK


def _print_result(
    session_id: str, result: TurnResult, as_json: bool, console: Console, errors: Console
) -> None:
    if as_json:
        _json_line(
            console,
            {
                "session_id": session_id,
                "message_id": result.message_id,
                "turn": result.turn,
                "kind": result.kind,
                "text": result.text,
                "tool_calls": [
                    {"call_id": c.call_id, "name": c.name, "error": c.error}
                    for c in result.tool_calls
                ],
                "input_tokens": result.usage.input_tokens,
                "output_tokens": result.usage.output_tokens,
            },
        )
    elif result.text:
        _line(console, result.text)
    if result.kind in _FAILED:
        reason = result.reason
        detail = (reason.get("error") or {}).get("message") or reason.get("cause") or ""
        _line(errors, f"turn {result.turn} ended {result.kind}" + (f": {detail}" if detail else ""))


async def _note_no_worker(client: FleetClient, url: str, errors: Console, then: str) -> None:
    """One stderr line when no live worker serves the fleet on the store."""
    status = await client.status()
    if not any(worker.alive for worker in status.workers):
        _line(errors, f"no live worker on {redact_url(url)}: {then} (dsh-agent worker)")


async def _report_waiting(
    store: SessionStore, session_id: str, hint: ResumeHint, errors: Console
) -> None:
    for call in await stored_pending(store, session_id):
        how = hint.decide_how(session_id, call.request.call_id)
        errors.print(pending_line(call.agent_id, call.request, how), soft_wrap=True, markup=False)


# -- cancel --------------------------------------------------------------------------------------


def _cancel_verb(args: argparse.Namespace, guard: TerminalGuard) -> int:
    url, store = _client_store(args, guard, "cancel")
    if missing_local_store(url):
        raise _not_found(args.session_id, url)
    console, errors = consoles(guard)

    async def cancel() -> int:
        try:
            async with open_client(store) as client:
                return await _cancel(client, args, console, errors)
        except SessionNotFoundError:
            raise _not_found(args.session_id, url) from None
        finally:
            with trio.CancelScope(shield=True):
                await store.aclose()

    return trio.run(cancel)


async def _cancel(
    client: FleetClient, args: argparse.Namespace, console: Console, errors: Console
) -> int:
    sid, keep = args.session_id, args.keep_inbox
    if args.no_wait:
        await client.cancel(sid, keep_inbox=keep, wait=False)
        _line(console, f"cancel of session {sid} queued")
        return EXIT_OK
    try:
        with trio.move_on_after(args.timeout) as waiting:
            await client.cancel(sid, keep_inbox=keep, wait=True)
    except FleetCommandError as exc:
        _line(errors, f"cancel: {' '.join(str(exc).split())}")
        return EXIT_FAILED
    if waiting.cancelled_caught:
        _line(
            errors,
            f"cancel of session {sid} is queued: no worker applied it within {args.timeout:g} s"
            " (a worker applies it when it takes the session)",
        )
        return EXIT_AWAITING
    inbox = "inbox kept" if keep else "inbox cleared"
    _line(console, f"cancelled session {sid} ({inbox})")
    return EXIT_OK


# -- fleet status --------------------------------------------------------------------------------


def _status_verb(args: argparse.Namespace, guard: TerminalGuard) -> int:
    url, store = _client_store(args, guard, "fleet status")
    console, _ = consoles(guard)
    if missing_local_store(url):  # read only: an absent file is an empty fleet
        status = FleetStatus((), 0, 0, None)
    else:

        async def read() -> FleetStatus:
            try:
                async with open_client(store) as client:
                    return await client.status()
            finally:
                with trio.CancelScope(shield=True):
                    await store.aclose()

        status = trio.run(read)
    print_status(status, console, as_json=args.json, now=time.time())
    return EXIT_OK


def _age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def print_status(status: FleetStatus, console: Console, *, as_json: bool, now: float) -> None:
    """The workers as a plain table, then what waits (or all of it as one JSON object)."""
    if as_json:
        _json_line(console, _status_record(status, now))
        return
    rows: list[Sequence[str]] = [("WORKER", "HOST", "PID", "HEARTBEAT", "AGENTS", "STATE", "ALIVE")]
    for w in status.workers:
        rows.append(
            (
                w.worker_id,
                w.host,
                str(w.pid),
                f"{_age(max(0.0, now - w.last_heartbeat))} ago",
                f"{w.live_agents}/{w.max_agents}",
                w.state,
                "yes" if w.alive else "no",
            )
        )
    if status.workers:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            _line(console, "  ".join(c.ljust(n) for c, n in zip(row, widths, strict=True)).rstrip())
    else:
        _line(console, "no workers")
    oldest = status.oldest_undelivered_age
    _line(console, f"sessions waiting: {status.sessions_waiting}")
    _line(console, f"undelivered messages: {status.undelivered}")
    _line(console, f"oldest undelivered: {'-' if oldest is None else _age(oldest) + ' ago'}")


def _status_record(status: FleetStatus, now: float) -> dict[str, Any]:
    return {
        "workers": [
            {
                "worker_id": w.worker_id,
                "host": w.host,
                "pid": w.pid,
                "started_at": w.started_at,
                "last_heartbeat": w.last_heartbeat,
                "heartbeat_age": max(0.0, now - w.last_heartbeat),
                "live_agents": w.live_agents,
                "max_agents": w.max_agents,
                "state": w.state,
                "alive": w.alive,
            }
            for w in status.workers
        ],
        "sessions_waiting": status.sessions_waiting,
        "undelivered": status.undelivered,
        "oldest_undelivered_age": status.oldest_undelivered_age,
    }
