"""Built-in tools, opt-in by name: read, list and search files; write and edit them; run commands.

Confinement rule: every path argument is resolved against the agent's ``cwd`` with symlinks
followed (``..``, absolute paths and symlinks all collapse into one real path) and must land
inside the resolved ``cwd``; I/O then uses that resolved path. A refused call or a failed
file operation is an error result the model can read (``content`` starts with ``Error:``,
``error`` carries a code such as ``PATH_OUTSIDE_CWD``), not an exception. An agent without a
``cwd`` gets ``NO_CWD``. (A path swapped for a symlink between the check and the I/O is not
caught: confinement guards against the model's mistakes; the sandbox is ``run_command``'s.)

``write_file`` and ``edit_file`` never write a protected path, whatever the permission mode or
rule (``PROTECTED_PATH``): anything inside a ``.git``, and the paths of
``context.workspace.protected`` (the config file the runtime loaded, the CLI's settings
directory, the store's files), real paths compared.

``run_command`` runs under bubblewrap per ``context.workspace.sandbox`` (``_tools/_sandbox.py``,
``docs/security.md``); where that is impossible the call is ``SANDBOX_UNAVAILABLE``, never an
unconfined run, and only ``Sandbox(mode="off")`` runs commands as the user. ``timeout_s`` is
capped at the sandbox's ``max_timeout_s`` (said in the result).

Reading tools are ``parallel``; ``write_file``, ``edit_file`` and ``run_command`` change the
workspace and are ``exclusive``. Blocking file I/O runs in ``trio.to_thread``; commands are
killed as a whole on timeout or cancel (``_tools/_command.py``).
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Iterable, Iterator, Mapping
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

import trio

from .._sandbox import Sandbox
from ._command import COMMAND_OUTPUT_HEAD as COMMAND_OUTPUT_HEAD
from ._command import COMMAND_OUTPUT_TAIL as COMMAND_OUTPUT_TAIL
from ._command import Output, run_confined, run_unconfined
from ._sandbox import (
    SandboxUnavailable,
    bwrap_argv,
    confined_environment,
    is_protected,
    prepare,
    probe,
)
from ._seccomp import filter_fd
from .base import Handler, Tool, ToolContext, ToolResult

__all__ = ["BUILTIN_TOOLS", "builtin_tool"]

#: Lines ``read_file`` returns by default, and the most characters in one answer.
DEFAULT_READ_LINES: Final = 2_000
MAX_READ_CHARS: Final = 100_000
MAX_LIST_ENTRIES: Final = 1_000
DEFAULT_SEARCH_RESULTS: Final = 100
MAX_SEARCH_RESULTS: Final = 1_000
#: Files larger than this, or with a NUL byte near the start, are not searched.
MAX_SEARCH_FILE_BYTES: Final = 2_000_000
MAX_MATCH_LINE_CHARS: Final = 300
SEARCH_SKIPPED_DIRS: Final = frozenset(
    {".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv"}
)
DEFAULT_COMMAND_TIMEOUT_S: Final = 120.0


class _Refusal(Exception):
    """A call that cannot be carried out; becomes ``ToolResult(error=code)``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _guarded(fn: Handler) -> Handler:
    async def handler(arguments: Mapping[str, Any], context: ToolContext) -> ToolResult | str:
        try:
            return await fn(arguments, context)
        except _Refusal as refusal:
            return ToolResult(content=f"Error: {refusal.message}", error=refusal.code)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if "path" in arguments:
                reason = f"{reason}: {arguments['path']!r}"
            return ToolResult(content=f"Error: {reason}", error="IO_ERROR")

    return handler


# --- confinement ------------------------------------------------------------------------------


async def _root(context: ToolContext) -> Path:
    if not context.cwd:
        raise _Refusal("NO_CWD", "this tool works inside the agent's cwd, and the agent has none")
    root = await trio.Path(context.cwd).resolve()
    if not await root.is_dir():
        raise _Refusal("NO_CWD", f"the agent's cwd {context.cwd!r} is not a directory")
    return Path(root)


async def _inside(root: Path, raw: Any) -> Path:
    """The real path of ``raw`` (relative to ``root``), refused unless it lies inside ``root``."""
    if not isinstance(raw, str) or not raw or "\x00" in raw:
        raise _Refusal("INVALID_ARGUMENTS", "path must be a non-empty string")
    target = Path(await trio.Path(root / raw).resolve())
    if not target.is_relative_to(root):
        raise _Refusal("PATH_OUTSIDE_CWD", f"path {raw!r} is outside the working directory")
    return target


def _shown(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix() or "."


async def _existing(root: Path, raw: Any) -> Path:
    path = await _inside(root, raw)
    if not await trio.Path(path).exists():
        raise _Refusal("NOT_FOUND", f"{raw!r} does not exist")
    return path


async def _existing_file(root: Path, raw: Any) -> Path:
    path = await _existing(root, raw)
    if not await trio.Path(path).is_file():
        raise _Refusal("NOT_A_FILE", f"{raw!r} is not a file")
    return path


def _int_argument(arguments: Mapping[str, Any], name: str, default: int, low: int = 1) -> int:
    value = arguments.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _Refusal("INVALID_ARGUMENTS", f"{name} must be an integer >= {low}")
    return value


def _text_argument(arguments: Mapping[str, Any], name: str, *, empty: bool = True) -> str:
    value = arguments.get(name)
    if not isinstance(value, str) or (not empty and not value):
        kind = "a string" if empty else "a non-empty string"
        raise _Refusal("INVALID_ARGUMENTS", f"{name} must be {kind}")
    return value


# --- read_file --------------------------------------------------------------------------------


def _read_lines(path: Path, offset: int, limit: int) -> tuple[list[str], bool, int]:
    """Lines ``offset`` (1-based) onward: at most ``limit`` and ``MAX_READ_CHARS``.

    Returns the lines, whether more follow, and the number of the last line seen.
    """
    lines: list[str] = []
    size = 0
    number = 0
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            if number < offset:
                continue
            if len(lines) >= limit or (lines and size + len(line) > MAX_READ_CHARS):
                return lines, True, number
            if len(line) > MAX_READ_CHARS:
                line = line[:MAX_READ_CHARS] + " [... line truncated]\n"
            lines.append(line)
            size += len(line)
    return lines, False, number


async def _read_file(arguments: Mapping[str, Any], context: ToolContext) -> str:
    root = await _root(context)
    path = await _existing_file(root, arguments.get("path"))
    offset = _int_argument(arguments, "offset", 1)
    limit = _int_argument(arguments, "limit", DEFAULT_READ_LINES)
    lines, more, last = await trio.to_thread.run_sync(_read_lines, path, offset, limit)
    if not lines:
        if last == 0:
            return "(empty file)"
        return f"[offset {offset} is past the end of the file, which has {last} lines]"
    text = "".join(lines)
    if more:
        end = offset + len(lines) - 1
        text += (
            f"{'' if text.endswith(chr(10)) else chr(10)}[... truncated: lines {offset}-{end} "
            f"shown; read on with offset={end + 1}]"
        )
    return text


# --- list_dir ---------------------------------------------------------------------------------


def _list(path: Path) -> list[str]:
    entries = []
    with os.scandir(path) as it:
        for entry in it:
            if entry.is_symlink():
                entries.append(f"{entry.name}@")
            elif entry.is_dir():
                entries.append(f"{entry.name}/")
            else:
                entries.append(entry.name)
    return sorted(entries)


async def _list_dir(arguments: Mapping[str, Any], context: ToolContext) -> str:
    root = await _root(context)
    raw = arguments.get("path") or "."
    path = await _existing(root, raw)
    if not await trio.Path(path).is_dir():
        raise _Refusal("NOT_A_DIRECTORY", f"{raw!r} is not a directory")
    entries = await trio.to_thread.run_sync(_list, path)
    if not entries:
        return f"({_shown(root, path)} is empty)"
    shown = entries[:MAX_LIST_ENTRIES]
    if len(entries) > len(shown):
        shown.append(f"[... truncated: {len(entries) - len(shown)} more entries]")
    return "\n".join(shown)


# --- search_text ------------------------------------------------------------------------------


def _candidate_files(root: Path, base: Path) -> Iterator[Path]:
    if not base.is_dir():
        yield base
        return
    for dirpath, dirnames, filenames in os.walk(base):  # symlinked dirs are not entered
        dirnames[:] = sorted(d for d in dirnames if d not in SEARCH_SKIPPED_DIRS)
        for name in sorted(filenames):
            path = Path(dirpath, name)
            if not path.is_symlink() or path.resolve().is_relative_to(root):
                yield path


def _file_text(path: Path) -> str | None:
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_SEARCH_FILE_BYTES:
            return None  # FIFOs and devices would block; big files are rarely source
        data = path.read_bytes()
    except OSError:
        return None
    if b"\x00" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def _search(root: Path, base: Path, regex: re.Pattern[str], limit: int) -> tuple[list[str], bool]:
    matches: list[str] = []
    for path in _candidate_files(root, base):
        text = _file_text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if regex.search(line):
                if len(matches) == limit:
                    return matches, True
                matches.append(f"{_shown(root, path)}:{number}: {line[:MAX_MATCH_LINE_CHARS]}")
    return matches, False


async def _search_text(arguments: Mapping[str, Any], context: ToolContext) -> str:
    root = await _root(context)
    pattern = _text_argument(arguments, "pattern", empty=False)
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise _Refusal("INVALID_ARGUMENTS", f"invalid regular expression: {exc}") from None
    base = await _existing(root, arguments.get("path") or ".")
    limit = _int_argument(arguments, "max_results", DEFAULT_SEARCH_RESULTS)
    limit = min(limit, MAX_SEARCH_RESULTS)
    # Read-only work: on cancel the thread is abandoned and its answer dropped.
    matches, more = await trio.to_thread.run_sync(
        _search, root, base, regex, limit, abandon_on_cancel=True
    )
    if not matches:
        return "No matches."
    if more:
        matches.append(f"[... stopped after {limit} matches]")
    return "\n".join(matches)


# --- write_file, edit_file --------------------------------------------------------------------


def _write(path: Path, content: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as f:
        f.write(content)


def _real_paths(paths: Iterable[str]) -> tuple[Path, ...]:
    return tuple(Path(os.path.realpath(p)) for p in paths)


async def _writable(root: Path, raw: Any, context: ToolContext) -> Path:
    """The real path of ``raw`` inside ``root``, refused when it is protected."""
    path = await _inside(root, raw)
    protected: tuple[Path, ...] = ()
    if context.workspace.protected:
        protected = await trio.to_thread.run_sync(_real_paths, context.workspace.protected)
    if is_protected(path, protected):
        raise _Refusal(
            "PROTECTED_PATH",
            f"path {raw!r} is protected: tools never write inside .git, nor the config file the "
            "runtime loaded, the CLI's settings directory or the store's files",
        )
    return path


async def _write_file(arguments: Mapping[str, Any], context: ToolContext) -> str:
    root = await _root(context)
    raw = arguments.get("path")
    content = _text_argument(arguments, "content")
    path = await _writable(root, raw, context)
    existed = await trio.Path(path).exists()
    if existed and not await trio.Path(path).is_file():
        raise _Refusal("NOT_A_FILE", f"{raw!r} is not a regular file")
    await trio.to_thread.run_sync(_write, path, content)
    verb = "Overwrote" if existed else "Created"
    return f"{verb} {_shown(root, path)} ({len(content)} characters)"


def _read_exact(path: Path) -> str:
    with path.open(encoding="utf-8", newline="") as f:
        return f.read()


def _occurrences(text: str, old: str) -> list[int]:
    """Start offsets of ``old`` in ``text``, overlapping ones included."""
    found = []
    start = text.find(old)
    while start != -1:
        found.append(start)
        start = text.find(old, start + 1)
    return found


async def _edit_file(arguments: Mapping[str, Any], context: ToolContext) -> str:
    root = await _root(context)
    raw = arguments.get("path")
    old = _text_argument(arguments, "old", empty=False)
    new = _text_argument(arguments, "new")
    await _writable(root, raw, context)
    path = await _existing_file(root, raw)
    try:
        text = await trio.to_thread.run_sync(_read_exact, path)
    except UnicodeDecodeError:
        raise _Refusal("NOT_TEXT", f"{raw!r} is not UTF-8 text") from None
    found = _occurrences(text, old)
    if not found:
        raise _Refusal("EDIT_NO_MATCH", f"the old text was not found in {raw!r}")
    if len(found) > 1:
        raise _Refusal(
            "EDIT_AMBIGUOUS",
            f"the old text occurs {len(found)} times in {raw!r}; "
            "include more surrounding text so that it matches exactly once",
        )
    at = found[0]
    await trio.to_thread.run_sync(_write, path, text[:at] + new + text[at + len(old) :])
    line = text.count("\n", 0, at) + 1
    return f"Edited {_shown(root, path)}: replaced 1 occurrence at line {line}"


# --- run_command ------------------------------------------------------------------------------


def _timeout(arguments: Mapping[str, Any], sandbox: Sandbox) -> tuple[float, str]:
    """The seconds a command may run, capped at ``sandbox.max_timeout_s``, and a note if capped."""
    most = sandbox.max_timeout_s
    value = arguments.get("timeout_s")
    if value is None:
        return min(DEFAULT_COMMAND_TIMEOUT_S, most), ""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (isinstance(value, float) and not math.isfinite(value))
        or value <= 0
    ):
        raise _Refusal("INVALID_ARGUMENTS", "timeout_s must be a positive, finite number")
    if value > most:
        return most, f"[timeout_s was over the maximum: capped at {most:g}s]\n"
    return float(value), ""


async def _confined(
    command: str, root: Path, context: ToolContext, timeout_s: float
) -> tuple[Output, int | None]:
    """Run ``command`` in the sandbox; ``SANDBOX_UNAVAILABLE`` where it cannot be set up."""
    workspace = context.workspace
    env = confined_environment(os.environ, workspace.sandbox)
    try:
        confinement = await trio.to_thread.run_sync(
            prepare, root, workspace, abandon_on_cancel=True
        )
        await probe(confinement, env)
    except SandboxUnavailable as exc:
        raise _Refusal("SANDBOX_UNAVAILABLE", str(exc)) from None
    seccomp = filter_fd()
    try:
        argv = partial(bwrap_argv, confinement, command, seccomp_fd=seccomp)
        fds = () if seccomp is None else (seccomp,)
        return await run_confined(argv, env, root, timeout_s, fds)
    finally:
        if seccomp is not None:
            os.close(seccomp)


async def _run_command(arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
    root = await _root(context)
    command = _text_argument(arguments, "command", empty=False)
    sandbox = context.workspace.sandbox
    timeout_s, note = _timeout(arguments, sandbox)
    if sandbox.mode == "off":
        output, code = await run_unconfined(command, root, timeout_s)
    else:
        output, code = await _confined(command, root, context, timeout_s)
    text = output.text() or "(no output)\n"
    if not text.endswith("\n"):
        text += "\n"
    text += note
    meta = {
        "exit_code": code,
        "timed_out": code is None,
        "output_bytes": output.total,
        "sandbox": sandbox.mode,
        "timeout_s": timeout_s,
    }
    if code is None:
        return ToolResult(
            content=f"{text}[timed out after {timeout_s:g}s; the command was killed]",
            error="TIMEOUT",
            meta=meta,
        )
    return ToolResult(content=f"{text}[exit code: {code}]", meta=meta)


# --- registry ---------------------------------------------------------------------------------


def _schema(required: list[str], **properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


_PATH = {"type": "string", "description": "A path relative to the working directory."}
_DIR = {**_PATH, "default": "."}


_READ_FILE = Tool(
    name="read_file",
    description="Read a UTF-8 text file, optionally a window of its lines.",
    parameters=_schema(
        ["path"],
        path=_PATH,
        offset={"type": "integer", "minimum": 1, "description": "First line (1-based)."},
        limit={"type": "integer", "minimum": 1, "description": "Most lines to return."},
    ),
    handler=_guarded(_read_file),
)

_LIST_DIR = Tool(
    name="list_dir",
    description="List a directory: subdirectories end in '/', symlinks in '@'.",
    parameters=_schema([], path=_DIR),
    handler=_guarded(_list_dir),
)

_SEARCH_TEXT = Tool(
    name="search_text",
    description=(
        "Search files under a path for lines matching a Python regular expression; "
        "answers 'path:line: text'. Skips binary files and VCS, cache and vendor dirs."
    ),
    parameters=_schema(
        ["pattern"],
        pattern={"type": "string", "minLength": 1},
        path=_DIR,
        max_results={
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_SEARCH_RESULTS,
            "default": DEFAULT_SEARCH_RESULTS,
        },
    ),
    handler=_guarded(_search_text),
)

_WRITE_FILE = Tool(
    name="write_file",
    description="Create or overwrite a text file (parent directories are created).",
    parameters=_schema(["path", "content"], path=_PATH, content={"type": "string"}),
    handler=_guarded(_write_file),
    execution_mode="exclusive",
)

_EDIT_FILE = Tool(
    name="edit_file",
    description="Replace the one occurrence of `old` in a file with `new`.",
    parameters=_schema(
        ["path", "old", "new"],
        path=_PATH,
        old={"type": "string", "minLength": 1, "description": "Exact text, unique."},
        new={"type": "string"},
    ),
    handler=_guarded(_edit_file),
    execution_mode="exclusive",
)

_RUN_COMMAND = Tool(
    name="run_command",
    description=(
        "Run a shell command in the working directory; answers its combined stdout "
        "and stderr (long output is truncated in the middle) and its exit code. "
        "Unless configured otherwise, commands run sandboxed: only the working directory "
        "and a private /tmp are writable, .git is read-only, there is no network, and "
        "nothing started outlives the command. timeout_s is capped by a configured maximum."
    ),
    parameters=_schema(
        ["command"],
        command={"type": "string", "minLength": 1},
        timeout_s={
            "type": "number",
            "exclusiveMinimum": 0,
            "default": DEFAULT_COMMAND_TIMEOUT_S,
        },
    ),
    handler=_guarded(_run_command),
    execution_mode="exclusive",
)

#: The built-in tools by name. None is active unless named (``AgentOptions(tools=[...])``).
BUILTIN_TOOLS: Final[Mapping[str, Tool]] = MappingProxyType(
    {
        t.name: t
        for t in (_READ_FILE, _LIST_DIR, _SEARCH_TEXT, _WRITE_FILE, _EDIT_FILE, _RUN_COMMAND)
    }
)


def builtin_tool(name: str) -> Tool:
    """The built-in tool called ``name``.

    Raises:
        KeyError: no built-in tool has that name (the message lists the names).
    """
    try:
        return BUILTIN_TOOLS[name]
    except KeyError:
        known = ", ".join(BUILTIN_TOOLS)
        raise KeyError(f"unknown built-in tool {name!r} (built-ins: {known})") from None
