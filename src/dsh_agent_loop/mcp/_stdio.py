"""``open_stdio``: an MCP server's process, spoken to over its stdin and stdout, messages bounded.

Design. The SDK's stdio client reads the server's stdout by re-joining a growing buffer on each
chunk until a newline comes, so one 100 MB line is held whole and costs time quadratic in its
length. This transport gives the SDK's ``ClientSession`` the same pair of memory streams, fed by
a ``LineSplitter``: a message over the limit is never held. When its JSON-RPC id is found the
request waiting for it is answered at once with an error saying so, and the connection goes on;
when none is found the read side closes (the session sees the connection end, and the next
call starts the server again). The reader keeps draining stdout after that, and while the
process is being stopped, so a server blocked writing can still exit.

Stopping follows the MCP lifecycle, shielded and bounded: close stdin, wait, then SIGTERM and
at last SIGKILL to the server's process group (it runs in a session of its own, so its
children go with it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from typing import IO, TYPE_CHECKING, Any, Final

import trio

from ._lines import LineSplitter, Oversized

if TYPE_CHECKING:
    from ._spec import McpServer

__all__ = ["EXIT_GRACE", "KILL_GRACE", "open_stdio", "too_large"]

#: Seconds the server has to exit after its stdin closes, then after SIGTERM.
EXIT_GRACE: Final = 2.0
#: Seconds to wait for the process to go after SIGKILL.
KILL_GRACE: Final = 2.0
#: Bytes read from stdout at a time.
CHUNK: Final = 64 * 1024
_PIPE_ERRORS: Final = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


def too_large(record: Oversized, limit: int) -> str:
    """What the model reads about a dropped message."""
    size = f"{record.size:,}" if record.finished else f"more than {record.size:,}"
    return (
        f"the server's message was {size} bytes, over the {limit:,}-byte limit for one MCP"
        " message (limits.mcpMaxMessageBytes); it was dropped unread"
    )


def _message(item: bytes | Oversized, limit: int) -> Any:
    """A ``SessionMessage`` (or the parse error) for a line; an error reply for an oversized one."""
    import mcp_types as types
    from mcp.shared.message import SessionMessage

    if isinstance(item, bytes):
        try:
            return SessionMessage(types.jsonrpc_message_adapter.validate_json(item, by_name=False))
        except ValueError as exc:  # pydantic's ValidationError is one
            return exc
    if item.id is None:
        return None
    error = types.ErrorData(code=types.INTERNAL_ERROR, message=too_large(item, limit))
    return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=item.id, error=error))


async def _read(
    stdout: trio.abc.ReceiveStream, read_send: Any, limit: int, note: Callable[[str], None]
) -> None:
    """Stdout to the session, a message at a time; then drain it until it ends."""
    import anyio

    splitter = LineSplitter(limit)
    delivering = True
    async with read_send:
        while True:
            try:
                data = await stdout.receive_some(CHUNK)
            except _PIPE_ERRORS:
                return
            if not data:
                return
            for item in splitter.feed(data) if delivering else ():
                message = _message(item, limit)
                if message is None:  # too large, and no id to answer: end this connection
                    assert isinstance(item, Oversized)
                    note(too_large(item, limit))
                    await read_send.aclose()
                    delivering = False
                    break
                try:
                    await read_send.send(message)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    delivering = False  # the session is gone: only draining is left
                    break


async def _write(stdin: trio.abc.SendStream, write_recv: Any, read_send: Any) -> None:
    """The session's messages to stdin, one line each."""
    try:
        async with write_recv:
            async for message in write_recv:
                line = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await stdin.send_all(line.encode() + b"\n")
    except _PIPE_ERRORS:
        await read_send.aclose()  # the server stopped reading: the session sees the end


def _signal_group(process: trio.Process, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if hasattr(os, "killpg"):
            os.killpg(process.pid, signum)  # its session's group: the server and its children
        else:  # pragma: no cover - Windows has no process groups to signal
            process.kill()


async def _stop(process: trio.Process) -> None:
    """Close stdin, wait; SIGTERM, wait; SIGKILL, wait (call it shielded)."""
    assert process.stdin is not None
    with contextlib.suppress(*_PIPE_ERRORS):
        await process.stdin.aclose()
    for signum in (None, signal.SIGTERM, signal.SIGKILL):
        if signum is not None:
            _signal_group(process, signum)
        with trio.move_on_after(KILL_GRACE if signum == signal.SIGKILL else EXIT_GRACE):
            await process.wait()
        if process.returncode is not None:
            return


@contextlib.asynccontextmanager
async def open_stdio(
    spec: McpServer,
    errlog: IO[bytes],
    limit: int,
    note: Callable[[str], None],
    ended: Callable[[int], None] = lambda status: None,
) -> AsyncIterator[tuple[Any, Any]]:
    """Start ``spec``'s process; yields the session's (read, write) streams.

    ``note`` hears why the transport ended a connection (a message too large to answer);
    ``ended`` hears the process's exit status once it has gone.
    """
    import anyio
    from mcp.client.stdio import get_default_environment
    from mcp.shared.message import SessionMessage

    assert spec.command is not None
    env = {**get_default_environment(), **(spec.env or {})}
    process = await trio.lowlevel.open_process(
        [spec.command, *spec.args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errlog,
        env=env,
        cwd=spec.cwd,
        start_new_session=True,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_read, process.stdout, read_send, limit, note)
            nursery.start_soon(_write, process.stdin, write_recv, read_send)
            try:
                yield read_recv, write_send
            finally:
                read_recv.close()
                write_send.close()
                with trio.CancelScope(shield=True):
                    await _stop(process)  # the reader drains stdout meanwhile
                nursery.cancel_scope.cancel()
    finally:
        for stream in (read_send, read_recv, write_send, write_recv):
            stream.close()
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                await _stop(process)
            await process.stdout.aclose()
            if process.returncode is not None:
                ended(process.returncode)
