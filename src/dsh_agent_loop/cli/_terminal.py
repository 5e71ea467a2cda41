r"""What the CLI writes: control sequences made visible and store passwords hidden.

Text that came from a model, a tool, a server or a stored session may carry terminal control
sequences: ``ESC [2J`` clears the screen, ``ESC [8m`` hides what follows, ``ESC ]52;c;…`` writes
the clipboard, and a bidi override reorders what is shown. Such text is never written raw.
Stripping the controls would hide that they were sent, so each one is replaced by a visible
stand-in instead: a C0 control (everything below U+0020 but newline and tab) by its Unicode
control picture (``ESC`` → ``␛``, ``BEL`` → ``␇``), DEL by ``␡``, a C1 control (U+0080–U+009F;
U+009B is a one-character CSI on many terminals) and a bidi embedding, override or isolate
(U+202A–U+202E, U+2066–U+2069) by its escape (``\x9b``, ``\u202e``). A lone escape character
is enough to make the rest of its sequence inert text. ``\r\n`` becomes a newline.

The CLI's own styling is untouched: rich turns styles into escape codes when it writes segments,
after the text has been cleaned. ``TerminalGuard`` is a rich render hook that cleans the text of
every segment a console prints, the net under the explicit ``visible`` calls at the places that
show outside text (which keep panel widths right).

A store URL may hold a password (``postgresql://user:pw@host/db``, ``?password=pw``), and
psycopg's errors can echo the connection string. Every URL the CLI shows is passed through
``redact_url`` (``postgresql://user:***@host/db``); every line the guard cleans also has the
passwords of the store URLs it was told about replaced, wherever they appear, and any
``scheme://user:secret@`` or ``password=secret`` replaced whatever URL it belongs to.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable
from typing import Final, final

from rich.console import Console, ConsoleOptions, ConsoleRenderable, RenderHook, RenderResult
from rich.segment import Segment

__all__ = [
    "HIDDEN",
    "TerminalGuard",
    "consoles",
    "json_visible",
    "redact",
    "redact_url",
    "url_secrets",
    "visible",
]

#: What a password is shown as.
HIDDEN: Final = "***"

_CONTROLS: Final = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_JSON_RAW: Final = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_USERINFO: Final = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^\s:/?#@'\"]*):[^\s'\"/]*@")
_PASSWORD_PARAM: Final = re.compile(r"(?i)\b(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&'\"]*)")


def _stand_in(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # the control pictures block: ␀ … ␟
    if code == 0x7F:
        return "\u2421"  # ␡
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def visible(text: str) -> str:
    """``text`` with every control character but newline and tab replaced by a visible sign."""
    if "\r\n" in text:
        text = text.replace("\r\n", "\n")
    return _CONTROLS.sub(_stand_in, text)


def json_visible(line: str) -> str:
    r"""A line of JSON with DEL, C1 and bidi controls written as ``\uXXXX`` escapes.

    ``json.dumps(..., ensure_ascii=False)`` escapes only what JSON requires (below U+0020); the
    others are legal raw, and the escaped line decodes to the same value.
    """
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", line)


def url_secrets(url: str) -> frozenset[str]:
    """The passwords ``url`` holds (userinfo and ``password=``), as written and decoded."""
    found: set[str] = set()
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:  # a malformed netloc: only the patterns of ``redact`` apply
        return frozenset()
    if password:
        found.add(password)
    for pair in parts.query.split("&") if parts.query else ():
        key, _, value = pair.partition("=")
        if urllib.parse.unquote(key).strip().lower() == "password" and value:
            found.add(value)
    found |= {urllib.parse.unquote(secret) for secret in found}
    return frozenset(secret for secret in found if secret and secret != HIDDEN)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with ``secrets`` and every URL or ``password=`` password shown as ``***``."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, HIDDEN)
    if "@" in text:
        text = _USERINFO.sub(rf"\1:{HIDDEN}@", text)
    if "=" in text:
        text = _PASSWORD_PARAM.sub(rf"\g<1>{HIDDEN}", text)
    return text


def redact_url(url: str) -> str:
    """``url`` as the CLI shows it: its password replaced by ``***``, control characters shown."""
    return visible(redact(url, url_secrets(url)))


@final
class _Guarded:
    """A renderable whose segments' text is cleaned by ``guard`` (control segments pass)."""

    __slots__ = ("guard", "inner")

    def __init__(self, inner: ConsoleRenderable, guard: TerminalGuard) -> None:
        self.inner = inner
        self.guard = guard

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        clean = self.guard.clean
        for segment in console.render(self.inner, options):
            if segment.control is not None:
                yield segment  # rich's own cursor moves (a live progress display)
                continue
            text = clean(segment.text)
            yield segment if text == segment.text else Segment(text, segment.style)


@final
class TerminalGuard(RenderHook):
    """Cleans what a console prints: ``visible`` text, store passwords as ``***``.

    Push it on a console with ``console.push_render_hook(guard)``; tell it about each store URL
    the command uses with ``add_store_url`` before anything can print it.
    """

    def __init__(self) -> None:
        self._secrets: set[str] = set()

    def add_store_url(self, url: str) -> None:
        """Hide the passwords ``url`` holds from now on."""
        self._secrets |= url_secrets(url)

    def add_secret(self, secret: str) -> None:
        """Hide ``secret`` (an access token) from now on."""
        if secret:
            self._secrets.add(secret)

    def clean(self, text: str) -> str:
        """``text`` made safe to write: controls made visible, known passwords hidden."""
        return redact(visible(text), self._secrets)

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        """Wrap each renderable so its text is cleaned when it renders (``RenderHook``)."""
        return [_Guarded(renderable, self) for renderable in renderables]


def consoles(guard: TerminalGuard) -> tuple[Console, Console]:
    """A verb's stdout and stderr consoles, both writing through ``guard``.

    Piped or redirected stdout keeps full table cells (at least 160 columns) instead of rich's
    80-column default.
    """
    out = Console(highlight=False)
    if not out.is_terminal:
        out = Console(highlight=False, width=max(out.width, 160))
    errors = Console(stderr=True, highlight=False)
    out.push_render_hook(guard)
    errors.push_render_hook(guard)
    return out, errors
