r"""``dsh-agent sessions list | show | check | export``: read stored sessions.

These verbs only read. A SQLite file or JSONL directory that does not exist is an empty store
(it is not created). ``list`` puts the full session id first on every row and never wraps or
cuts a line, whatever the terminal width; piped, it prints plain tab-separated lines.
``list --tree`` reads each session's header too and puts every sub-agent session under its
parent's (``parent_session_id``) and every fork under its source (``forked_from``), indented two
spaces a level, with the link in the last column; on a terminal too narrow for that table it
prints each session as its id on one line and its details on the next, wrapped between words
(``_tree_layout.py``), so no word is ever broken by the terminal. A session whose calls wait for
a person's approval reads ``waiting for approval (N calls)`` in the last-turn-end column (its
log is read for that). ``show`` prints the header, the totals and one line per event in the
words of ``_transcript.py``, and names each waiting call with the commands that decide it.
``export`` writes the JsonlStore file format:
the header as one JSON line, then one event per line, so the output can be dropped into a JSONL
store directory as ``<session_id>.jsonl``; DEL, C1 and bidi controls, which JSON allows raw, are
written as ``\uXXXX`` escapes (the values are unchanged). Everything else these verbs print from a
stored session is passed through ``visible`` (``_terminal.py``), and the store URL through
``redact_url``. With ``--config`` only the config's ``store`` is read (``config_store_url``).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import IO, Any

import trio
from rich.console import Console
from rich.text import Text

from .. import invariants
from .._agent import subagents
from .._errors import SessionNotFoundError, StoreError
from .._session.store import SessionInfo, SessionStore
from ..events import Event, event_to_json
from ._render import reason_text
from ._setup import (
    EXIT_FAILED,
    EXIT_OK,
    CliError,
    config_store_url,
    missing_local_store,
    store_args,
)
from ._terminal import json_visible, redact_url, visible
from ._transcript import pending_approvals, totals, transcript_lines
from ._tree_layout import fits, stacked_rows

__all__ = ["check_session", "export_session", "list_sessions", "show_session"]


def _not_found(session_id: str, url: str) -> CliError:
    return CliError(f"session '{visible(session_id)}' not found in {redact_url(url)}")


async def _infos(store: SessionStore) -> tuple[list[SessionInfo], dict[str, int]]:
    try:
        infos = await store.list()
        return infos, await _waiting(store, infos)
    finally:
        with trio.CancelScope(shield=True):
            await store.aclose()


async def _waiting(store: SessionStore, infos: Sequence[SessionInfo]) -> dict[str, int]:
    """Session id → calls waiting for approval, for the sessions whose last turn stopped so."""
    out: dict[str, int] = {}
    for info in infos:
        if (info.last_turn_end or {}).get("kind") != "awaiting-approval":
            continue
        try:
            handle = await store.open(info.session_id, "read")
            try:
                out[info.session_id] = len(pending_approvals(await handle.read()))
            finally:
                await handle.close()
        except (SessionNotFoundError, StoreError):  # deleted meanwhile, or unreadable: no mark
            continue
    return out


def _end_cell(info: SessionInfo, waiting: Mapping[str, int]) -> str:
    count = waiting.get(info.session_id, 0)
    if count:
        return f"waiting for approval ({count} call{'s' * (count != 1)})"
    return reason_text(info.last_turn_end)


async def _read(
    store: SessionStore, session_id: str, url: str
) -> tuple[Mapping[str, Any], list[Event]]:
    try:
        try:
            handle = await store.open(session_id, "read")
        except SessionNotFoundError:
            raise _not_found(session_id, url) from None
        try:
            return handle.header, await handle.read()
        finally:
            await handle.close()
    finally:
        with trio.CancelScope(shield=True):
            await store.aclose()


def _load(store: SessionStore, session_id: str, url: str) -> tuple[Mapping[str, Any], list[Event]]:
    if missing_local_store(url):
        raise _not_found(session_id, url)
    return trio.run(_read, store, session_id, url)


def _rows(infos: Sequence[SessionInfo], waiting: Mapping[str, int]) -> list[tuple[str, ...]]:
    ordered = sorted(infos, key=lambda i: (i.created_at, i.session_id))
    return [
        tuple(
            visible(cell)
            for cell in (
                i.session_id,
                i.agent_id,
                str(i.event_count),
                _end_cell(i, waiting),
                i.created_at,
            )
        )
        for i in ordered
    ]


async def _linked_infos(
    store: SessionStore,
) -> tuple[list[tuple[SessionInfo, str | None, str]], dict[str, int]]:
    """Each session with its tree parent (a live link's session id, or None) and its link."""
    try:
        infos = await store.list()
        links: dict[str, tuple[str | None, str | None, str]] = {}
        for info in infos:
            handle = await store.open(info.session_id, "read")
            try:
                header = handle.header
            finally:
                await handle.close()
            parent, source = subagents.links(header)
            forked = header.get(subagents.FORKED_FROM)
            at = forked.get("at_seq") if isinstance(forked, Mapping) else None
            label = "child" if parent is not None else ""
            if source is not None:
                fork = visible(f"fork of {source}@{at}")
                label = f"{label}, {fork}" if label else fork
            links[info.session_id] = (parent, source, label)
        waiting = await _waiting(store, infos)
    finally:
        with trio.CancelScope(shield=True):
            await store.aclose()
    known = set(links)
    out = []
    for info in infos:
        parent, source, label = links[info.session_id]
        up = parent if parent in known else source if source in known else None
        out.append((info, up, label))
    return out, waiting


def _tree_rows(
    linked: Sequence[tuple[SessionInfo, str | None, str]], waiting: Mapping[str, int]
) -> list[tuple[int, tuple[str, ...]]]:
    """Rows in tree order with their depth: each session under the one it links to."""
    ordered = sorted(linked, key=lambda x: (x[0].created_at, x[0].session_id))
    below: dict[str | None, list[tuple[SessionInfo, str]]] = {}
    for info, up, label in ordered:
        below.setdefault(up, []).append((info, label))
    rows: list[tuple[int, tuple[str, ...]]] = []
    seen: set[str] = set()

    def visit(up: str | None, depth: int) -> None:
        for info, label in below.get(up, ()):
            if info.session_id in seen:
                continue
            seen.add(info.session_id)
            (row,) = _rows([info], waiting)
            rows.append((depth, (*row[:4], label or "-")))
            visit(info.session_id, depth + 1)

    visit(None, 0)
    for info, _, label in ordered:  # a cycle of links (never written by this library)
        if info.session_id not in seen:
            seen.add(info.session_id)
            rows.append((0, (*_rows([info], waiting)[0][:4], label or "-")))
            visit(info.session_id, 1)
    return rows


def list_sessions(
    store: SessionStore, url: str, console: Console, *, tty: bool, tree: bool = False
) -> int:
    """Print one row per stored session; ``tree``: sub-agents and forks under their origin."""
    if tree:
        linked, waiting = ([], {}) if missing_local_store(url) else trio.run(_linked_infos, store)
        deep = _tree_rows(linked, waiting)
        rows = [("  " * depth + row[0], *row[1:]) for depth, row in deep]
        if tty and rows and not fits(_HEADER, rows, console.width):
            for line in stacked_rows(deep, console.width):
                console.print(Text(line[0], style=line[1]), soft_wrap=True)
            return EXIT_OK
        return _print_rows(rows, url, console, tty=tty, tree=True)
    infos, waiting = ([], {}) if missing_local_store(url) else trio.run(_infos, store)
    return _print_rows(_rows(infos, waiting), url, console, tty=tty, tree=False)


_HEADER = ("SESSION", "AGENT", "EVENTS", "LAST TURN END", "LINK")


def _print_rows(
    rows: Sequence[tuple[str, ...]], url: str, console: Console, *, tty: bool, tree: bool
) -> int:
    if not tty:
        out = sys.stdout
        for row in rows:
            out.write("\t".join(row if tree else row[:4]).rstrip("\t") + "\n")
        out.flush()
        return EXIT_OK
    if not rows:
        console.print(Text(f"no sessions in {redact_url(url)}", style="dim"), soft_wrap=True)
        return EXIT_OK
    header = (*_HEADER[:4], "LINK" if tree else "CREATED")
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
    styles = ("bold", "cyan", "", "", "dim")
    console.print(
        Text("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip(), "dim"),
        soft_wrap=True,
    )
    for row in rows:
        line = Text()
        for index, (cell, width, style) in enumerate(zip(row, widths, styles, strict=True)):
            if index:
                line.append("  ")
            line.append(cell.ljust(width) if index < len(row) - 1 else cell, style=style)
        # soft_wrap: rich neither wraps nor crops the line; the id is always whole.
        console.print(line, soft_wrap=True)
    return EXIT_OK


def show_session(
    store: SessionStore,
    url: str,
    session_id: str,
    console: Console,
    *,
    config: str | None = None,
) -> int:
    """Print the session in plain words: header, totals, then one line per stored event.

    A call waiting for approval is listed with the ``approve``/``deny`` commands that decide it:
    with ``--config`` when ``sessions show`` was given one (the continuation needs the config's
    providers), and with ``--store`` when that command would not find the store by itself.
    """
    header, events = _load(store, session_id, url)
    title = (
        f"session {session_id}  agent {header.get('agent_id', '?')}  "
        f"created {header.get('created_at', '?')}  {len(events)} events"
    )
    forked = header.get(subagents.FORKED_FROM)
    if isinstance(forked, Mapping):
        title += f"  fork of {forked.get('session_id')}@{forked.get('at_seq')}"
    console.print(Text(visible(title), style="bold"), soft_wrap=True)
    for line in totals(events).lines():
        console.print(Text(visible(line)), soft_wrap=True)
    for request in pending_approvals(events):
        call_id = str(request.get("call_id"))
        arguments = json.dumps(request.get("arguments"), ensure_ascii=False, default=_json_default)
        where = ["--config", config] if config is not None else []
        if config is None or url != config_store_url(config):
            where += store_args(url)
        command = shlex.join([session_id, call_id, *where])
        decide = f"dsh-agent approve {command} (or deny: dsh-agent deny {command})"
        line = f"  {call_id}: {request.get('name')} {arguments}; decide with: {decide}"
        console.print(Text(visible(line), style="yellow"), soft_wrap=True)
    for line in transcript_lines(events):
        console.print(visible(line), soft_wrap=True, markup=False, highlight=False)
    return EXIT_OK


def check_session(store: SessionStore, url: str, session_id: str, console: Console) -> int:
    """Run ``invariants.check`` on the stored log; exit 1 when it finds violations."""
    try:
        _, events = _load(store, session_id, url)
    except StoreError as exc:
        console.print(
            visible(f"session '{session_id}' is unreadable: {exc}"), soft_wrap=True, markup=False
        )
        return EXIT_FAILED
    violations = invariants.check(events)
    if not violations:
        console.print(
            f"session {session_id}: {len(events)} events, no violations",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
        return EXIT_OK
    for violation in violations:
        console.print(visible(str(violation)), soft_wrap=True, markup=False, highlight=False)
    count = len(violations)
    console.print(
        f"session {session_id}: {len(events)} events, {count} violation{'s' * (count != 1)}",
        soft_wrap=True,
        markup=False,
        highlight=False,
    )
    return EXIT_FAILED


def _json_default(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple | list):
        return list(value)
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


def export_session(store: SessionStore, url: str, session_id: str, output: str | None) -> int:
    """Write the header line and one JSON event per line to ``output`` (stdout when None)."""
    header, events = _load(store, session_id, url)
    head = json.dumps(header, ensure_ascii=False, separators=(",", ":"), default=_json_default)
    # Escaped, the DEL, C1 and bidi controls JSON allows raw cannot reach a terminal (lossless).
    lines = [json_visible(head), *(json_visible(event_to_json(event)) for event in events)]
    if output is None or output == "-":
        _write(sys.stdout, lines)
        return EXIT_OK
    try:
        # A new file is the session's copy: readable by its owner only, like the store's files.
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "w", encoding="utf-8") as f:
            _write(f, lines)
    except OSError as exc:
        raise CliError(f"cannot write {output}: {exc.strerror or exc}", EXIT_FAILED) from None
    return EXIT_OK


def _write(out: IO[str], lines: Sequence[str]) -> None:
    for line in lines:
        out.write(line + "\n")
    out.flush()
