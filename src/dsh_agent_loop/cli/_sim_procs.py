"""Simulation worker processes as the parent runs them: started, read, failed, reported.

Shared by the memory shards (``_sim_workers.py``) and the fleet workers (``_sim_fleet.py``):
a worker writes JSON report lines on its stdout (``Reporting``); the parent runs it
(``watch``), hands each record to a ``Reports``, keeps its last ``STDERR_TAIL`` stderr lines,
and turns a non-zero exit, a missing summary or a malformed line into ``WorkerFailed``.
See ``_sim_workers.py`` for the lines themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final, Protocol, TextIO, final

import attrs
import trio
from rich.console import Console
from rich.progress import Progress

from ._simulate import Counts

__all__ = [
    "SHARD_VARIABLE",
    "STDERR_TAIL",
    "Reporting",
    "Reports",
    "Worker",
    "WorkerFailed",
    "first_failure",
    "report_failure",
    "watch",
]

#: The environment variable holding a worker's shard index (``0`` … ``N-1``), for its tools.
SHARD_VARIABLE: Final = "DSH_AGENT_SIM_SHARD"
#: Stderr lines of a worker kept to show when it fails.
STDERR_TAIL: Final = 20
#: The longest report line a worker may write (bytes); a longer one fails the worker.
_MAX_LINE: Final = 1 << 20
#: Characters kept of one stderr line.
_MAX_STDERR_LINE: Final = 500


@final
class Reporting(Counts):
    """``Counts`` that report to the parent as JSON lines instead of drawing bars."""

    __slots__ = ("out", "sent")

    def __init__(self, out: TextIO) -> None:
        progress = Progress(disable=True, auto_refresh=False, get_time=time.perf_counter)
        super().__init__(progress, [progress.add_task("", start=False) for _ in range(3)])
        self.out = out
        self.sent = [0, 0, 0]

    def emit(self, record: Mapping[str, Any]) -> None:
        self.out.write(json.dumps(record, separators=(",", ":")) + "\n")
        self.out.flush()

    def begin(self, index: int) -> None:
        super().begin(index)
        self.emit({"sim": "begin", "phase": index})

    def end(self, index: int) -> float:
        self.sync()  # the counts first: the parent's bar is full when it stops
        elapsed = super().end(index)
        self.emit({"sim": "end", "phase": index})
        return elapsed

    def sync(self) -> None:
        counts = [done - sent for done, sent in zip(self.done, self.sent, strict=True)]
        if any(counts):
            self.sent = list(self.done)
            self.emit({"sim": "done", "counts": counts})


class Reports(Protocol):
    """What takes a worker's report records (``_Phases``, or the fleet's)."""

    def take(self, record: Mapping[str, Any], worker: Worker) -> None:
        """Take one record ``worker`` wrote."""
        ...


@attrs.define
class Worker:
    """One worker process as the parent sees it."""

    shard: int
    record: dict[str, Any] | None = None
    stderr: deque[str] = attrs.field(factory=lambda: deque(maxlen=STDERR_TAIL))
    failure: str = ""


@final
class WorkerFailed(Exception):
    def __init__(self, worker: Worker, why: str) -> None:
        super().__init__(why)
        self.worker = worker
        self.why = why


@final
class _Lines:
    """The lines of a byte stream, fed its chunks; one longer than ``limit`` is cut there."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pending = b""

    def feed(self, chunk: bytes | bytearray) -> list[bytes]:
        """The lines ``chunk`` completes (without their newline)."""
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        if len(self.pending) > self.limit:
            lines.append(self.pending)
            self.pending = b""
        return lines

    def end(self) -> list[bytes]:
        """The last line, had it no newline."""
        rest, self.pending = self.pending, b""
        return [rest] if rest else []


async def _read_reports(stream: trio.abc.ReceiveStream, worker: Worker, phases: Reports) -> None:
    lines = _Lines(_MAX_LINE)
    async for chunk in stream:
        for line in lines.feed(chunk):
            _take(line, worker, phases)
    for line in lines.end():
        _take(line, worker, phases)


def _take(line: bytes, worker: Worker, phases: Reports) -> None:
    if len(line) > _MAX_LINE:
        raise WorkerFailed(worker, f"wrote a report line longer than {_MAX_LINE:,} bytes")
    try:
        record = json.loads(line)
    except ValueError:
        return  # not a report (a tool printing on stdout): not ours to read
    if isinstance(record, dict) and "sim" in record:
        try:
            phases.take(record, worker)
        except (LookupError, TypeError, ValueError):
            raise WorkerFailed(worker, f"wrote a malformed report: {line[:200]!r}") from None


async def _keep_tail(stream: trio.abc.ReceiveStream, worker: Worker) -> None:
    lines = _Lines(_MAX_STDERR_LINE)
    async for chunk in stream:
        for line in lines.feed(chunk):
            worker.stderr.append(line[:_MAX_STDERR_LINE].decode(errors="replace"))
    for line in lines.end():
        worker.stderr.append(line[:_MAX_STDERR_LINE].decode(errors="replace"))


async def watch(
    command: Sequence[str],
    worker: Worker,
    phases: Reports,
    *,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one worker to its end (``started`` with its ``trio.Process``); ``WorkerFailed``."""
    env = {**os.environ, SHARD_VARIABLE: str(worker.shard)}
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                check=False,
                env=env,
                start_new_session=True,  # a terminal's Ctrl-C is the parent's to handle
            )
        )
        assert process.stdout is not None
        assert process.stderr is not None
        task_status.started(process)
        nursery.start_soon(_keep_tail, process.stderr, worker)
        await _read_reports(process.stdout, worker, phases)
    if process.returncode != 0:
        raise WorkerFailed(worker, f"exited with code {process.returncode}")
    if worker.record is None:
        raise WorkerFailed(worker, "exited without its summary")


def first_failure(group: BaseExceptionGroup[WorkerFailed]) -> WorkerFailed:
    leaves: list[WorkerFailed] = []
    pending: list[BaseException] = [group]
    while pending:
        error = pending.pop()
        if isinstance(error, BaseExceptionGroup):
            pending.extend(error.exceptions)
        elif isinstance(error, WorkerFailed):
            leaves.append(error)
    return min(leaves, key=lambda error: error.worker.shard)


def report_failure(failed: WorkerFailed, workers: int, errors: Console) -> None:
    worker = failed.worker
    tail = list(worker.stderr)
    said = f"; its last {len(tail)} stderr lines:" if tail else " (nothing on stderr)"
    lines = [f"simulate: the worker of shard {worker.shard} of {workers} {failed.why}{said}"]
    lines.extend(f"  {line}" for line in tail)
    for line in lines:
        errors.print(line, soft_wrap=True, markup=False, highlight=False)


def run_watched(
    main: Callable[[], Awaitable[None]],
    progress: Progress,
    workers: Sequence[Worker],
    errors: Console,
    label: str,
) -> bool:
    """``trio.run(main)`` under the bars; False when a worker failed (reported on ``errors``).

    After a good run, what each worker logged on stderr (its warnings) follows the bars, each
    line named ``<label> <shard>``.
    """
    failed: WorkerFailed | None = None
    try:
        with progress:
            trio.run(main)
    except* WorkerFailed as group:
        failed = first_failure(group)
    if failed is not None:
        report_failure(failed, len(workers), errors)
        return False
    for worker in workers:
        for line in worker.stderr:
            errors.print(f"{label} {worker.shard}: {line}", soft_wrap=True, markup=False)
    return True
