"""Running one ``run_command`` shell command: its output kept head and tail, killed as a whole.

A command runs in a session (process group) of its own, stdin closed, stdout and stderr in one
pipe. ``run_unconfined`` (``Sandbox(mode="off")``) runs ``/bin/sh -c``; a timeout or a cancel
kills its process group, so a child that left the group (``setsid``, ``nohup ... &`` in some
shells) survives: the reason the sandbox exists.

``run_confined`` runs bubblewrap, and the command lives in a PID namespace whose init (pid 1,
bwrap's own reaper) bwrap reports on ``--info-fd`` and holds on ``--block-fd`` until released:
the init's pidfd is taken while it surely lives (no pid reuse race), before the command runs.
The kernel kills every process of a PID namespace when its init dies, and the init counts as
exited (its pidfd readable, its parent told) only once they are all gone. So a timeout or a
cancel kills the init through the pidfd and waits for bwrap, which exits when its init did;
a command that ends by itself is followed by a wait on the pidfd (bwrap exits as soon as the
command does, its init a moment later). Either way, when ``run_confined`` returns or its
cancellation completes, nothing the command started is alive: a ``nohup`` child does not
outlive the call. bwrap itself is killed only if it outlives its init by ``KILL_GRACE_S``, or
when the init's pid never arrived (then ``--die-with-parent`` takes the namespace down).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Final

import trio

__all__ = [
    "COMMAND_OUTPUT_HEAD",
    "COMMAND_OUTPUT_TAIL",
    "KILL_GRACE_S",
    "OUTPUT_GRACE_S",
    "Output",
    "run_confined",
    "run_unconfined",
]

#: Command output kept: this many bytes from the start and from the end.
COMMAND_OUTPUT_HEAD: Final = 20_000
COMMAND_OUTPUT_TAIL: Final = 10_000
#: After the command exits, how long output from its leftover children is still read.
OUTPUT_GRACE_S: Final = 1.0
#: After the sandbox's init was killed, how long bwrap may take to follow before it is killed.
KILL_GRACE_S: Final = 5.0
#: Most bytes of bwrap's ``--info-fd`` report read (it is a few hundred).
MAX_INFO_BYTES: Final = 64_000


class Output:
    """Command output kept as a head and a tail; the middle of a long output is dropped."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes | bytearray) -> None:
        """Keep ``chunk`` (or the part of it that still fits the head, the rest in the tail)."""
        self.total += len(chunk)
        room = COMMAND_OUTPUT_HEAD - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        del self.tail[:-COMMAND_OUTPUT_TAIL]

    def text(self) -> str:
        """The output as text, with a marker where bytes were dropped."""
        dropped = self.total - len(self.head) - len(self.tail)
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        if dropped <= 0:
            return head + tail
        return f"{head}\n[... {dropped} bytes of output truncated ...]\n{tail}"


def _kill_group(process: trio.Process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def _kill_group_now(process: trio.Process) -> None:
    _kill_group(process)


async def _drain(stream: trio.abc.ReceiveStream, output: Output) -> None:
    async for chunk in stream:
        output.add(chunk)


async def _run(
    args: str | Sequence[str],
    *,
    cwd: Path,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    pass_fds: Sequence[int] = (),
    init: _Init | None = None,
) -> tuple[Output, int | None]:
    """Run ``args``; its output and exit code, or None when it timed out and was killed."""
    output = Output()
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                args,
                shell=isinstance(args, str),
                cwd=cwd,
                env=env,
                pass_fds=tuple(pass_fds),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                check=False,
                start_new_session=True,
                deliver_cancel=_kill_group_now if init is None else init.deliver_cancel,
            )
        )
        if init is not None:
            init.spawned()
        assert process.stdout is not None
        with trio.move_on_after(timeout_s) as timeout:
            async with trio.open_nursery() as reading:
                reading.start_soon(_drain, process.stdout, output)
                if init is not None:
                    await init.release()
                await process.wait()
                if init is not None:
                    await init.gone()
                # A child left running may hold the pipe open: read on only briefly.
                reading.cancel_scope.deadline = trio.current_time() + OUTPUT_GRACE_S
        if timeout.cancelled_caught and process.returncode is None:
            nursery.cancel_scope.cancel()
            return output, None
    return output, process.returncode


async def run_unconfined(command: str, cwd: Path, timeout_s: float) -> tuple[Output, int | None]:
    """Run ``command`` in ``/bin/sh`` as the user, with the whole environment.

    Returns:
        The output, and the exit code or None when the command timed out and was killed.
    """
    return await _run(command, cwd=cwd, timeout_s=timeout_s)


class _Init:
    """A confined run's handle on the sandbox's init: a pidfd, taken before the command runs.

    bwrap reports the init's pid on the info pipe and then holds the init on the block pipe
    (``--block-fd``) until it is released: the pidfd is opened while the init surely lives.
    """

    def __init__(self) -> None:
        info_read, self.info_fd = os.pipe()
        self.block_fd, block_write = os.pipe()
        self.info = trio.lowlevel.FdStream(info_read)
        self.block = trio.lowlevel.FdStream(block_write)
        self.pidfd: int | None = None

    def spawned(self) -> None:
        """Hand the pipes' far ends to bwrap alone: its exit then ends our read."""
        for fd in (self.info_fd, self.block_fd):
            os.close(fd)
        self.info_fd = self.block_fd = -1

    async def release(self) -> None:
        """Read bwrap's report, open a pidfd of the init it names, then let the command run."""
        data = bytearray()
        async with self.info:
            async for chunk in self.info:
                data += chunk
                if len(data) > MAX_INFO_BYTES:
                    break
        try:
            pid = json.loads(data)["child-pid"]
            if isinstance(pid, int) and pid > 0:
                self.pidfd = os.pidfd_open(pid)
        except (ValueError, KeyError, TypeError, OSError):
            pass  # bwrap failed early: its output says why; --die-with-parent still holds
        async with self.block:
            try:
                await self.block.send_all(b"go")
            except trio.BrokenResourceError:
                pass  # bwrap is gone already

    async def gone(self) -> None:
        """Wait for the init to be gone (with it, every process of its namespace)."""
        if self.pidfd is None:
            return
        with trio.move_on_after(KILL_GRACE_S):
            await trio.lowlevel.wait_readable(self.pidfd)
            return
        self._kill()
        await trio.lowlevel.wait_readable(self.pidfd)

    def _kill(self) -> None:
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def deliver_cancel(self, process: trio.Process) -> None:
        """Kill the sandbox's init, wait for bwrap to follow; kill bwrap's group if it lags."""
        if self.pidfd is not None:
            self._kill()
            await trio.sleep(KILL_GRACE_S)
        _kill_group(process)

    def close(self) -> None:
        """Release every descriptor still held."""
        for fd in (self.info_fd, self.block_fd):
            if fd >= 0:
                os.close(fd)
        self.info_fd = self.block_fd = -1
        if self.pidfd is not None:
            trio.lowlevel.notify_closing(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = None
        self.info.close()
        self.block.close()


async def run_confined(
    argv: Callable[[int, int], Sequence[str]],
    env: Mapping[str, str],
    cwd: Path,
    timeout_s: float,
    pass_fds: Sequence[int] = (),
) -> tuple[Output, int | None]:
    """Run the bubblewrap command line ``argv(info_fd, block_fd)``.

    bwrap reports its init's pid on ``info_fd`` and holds it on ``block_fd`` until released;
    ``pass_fds`` are more descriptors bwrap inherits (the caller's to close).

    Returns:
        The output, and the exit code or None when the command timed out and was killed.
    """
    init = _Init()
    try:
        return await _run(
            argv(init.info_fd, init.block_fd),
            cwd=cwd,
            timeout_s=timeout_s,
            env=env,
            pass_fds=(init.info_fd, init.block_fd, *pass_fds),
            init=init,
        )
    finally:
        init.close()
