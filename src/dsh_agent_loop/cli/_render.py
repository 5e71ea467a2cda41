"""Terminal rendering: live assistant streams, tool panels, and the words of failures and reasons.

The live view is driven by runtime observers (``agent/assistant-stream`` frames and the
``tools/result`` notification), which fire synchronously in the order the driver produces
them, so a tool result is never shown before the call that caused it. Text is written as it
streams; reasoning is dimmed; tool calls and results are compact panels. A tool call's panel
holds its whole arguments, wrapped to the terminal and never cut (the text a person approves is
the text they saw); a result's panel shows its first lines. With several agents
every line is prefixed by the agent id, so output is line-buffered per agent and block.

Model text is printed as ``rich.text.Text``, never as markup, so ``[brackets]`` in a reply
stay literal, and through ``visible`` (``_terminal.py``), so control sequences in it are shown,
never sent to the terminal. An ``agent/error`` saying the agent's store failed or its session
was taken over (``STORE_FAILURES``) is one line, and is kept in ``store_failures``: the verbs exit
1 on it, since what the agent did after it is not stored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, final

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from .._agent.request import MAX_ATTEMPTS, Retry
from .._hooks import Disposer, HookBus
from ..events import (
    AGENT_ERROR,
    ASSISTANT_STREAM,
    HOOK_REQUEST_ERROR,
    HOOK_TOOLS_RESULT,
    Event,
)
from ..llm import BlockEnd, BlockStart, Failure, ReasoningDelta, TextDelta, ToolCallDelta
from ._terminal import json_visible, visible

__all__ = [
    "STORE_FAILURES",
    "StreamRenderer",
    "failure_words",
    "message_text",
    "reason_text",
    "retry_line",
    "snippet",
    "store_failure_line",
]

#: Lines of a tool result shown in its panel.
RESULT_LINES: Final = 6
#: Characters of a detail shown on one summary line.
SNIPPET: Final = 72
#: ``agent/error`` codes that stop the agent: its store failed, or another process owns its
#: session now. What it did after that is not stored.
STORE_FAILURES: Final = frozenset({"OWNERSHIP_LOST", "STORE_FAILED"})


def snippet(text: str, limit: int = SNIPPET) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def message_text(message: Mapping[str, Any], kinds: Sequence[str] = ("text",)) -> str:
    """The concatenated text of a message's blocks of the given kinds."""
    parts = []
    for block in message.get("content", ()) or ():
        if isinstance(block, Mapping) and block.get("type") in kinds:
            parts.append(str(block.get("text", "")))
    return "".join(parts)


def reason_text(reason: Mapping[str, Any] | None) -> str:
    """A turn-end reason in short form: ``completed``, ``aborted:user``, ``error:CODE``."""
    if reason is None:
        return "-"
    kind = str(reason.get("kind", "?"))
    if kind == "aborted":
        return f"aborted:{reason.get('cause', '?')}"
    if kind == "error":
        error = reason.get("error") or {}
        return f"error:{error.get('code', '?')}"
    return kind


def tool_call_names(message: Mapping[str, Any]) -> list[str]:
    """The names of the tools ``message`` asks to run, in model order."""
    return [
        str(b.get("name"))
        for b in message.get("content", ()) or ()
        if isinstance(b, Mapping) and b.get("type") == "tool-call"
    ]


def failure_words(failure: Mapping[str, Any], provider: str | None = None) -> str:
    """A model-call failure as a sentence: ``HTTP 429 from deepseek: rate limited``."""
    source = provider or "the model"
    code = str(failure.get("code", "?"))
    message = " ".join(str(failure.get("message", "")).split())
    status = failure.get("status")
    if status is not None:
        detail = message.removeprefix(f"HTTP {status}").lstrip(": ")
        return f"HTTP {status} from {source}" + (f": {detail}" if detail else "")
    if code == "TIMEOUT":
        return f"{source} timed out: {message}"
    if code == "CONNECTION":
        return f"cannot reach {source}: {message}"
    if code == "STREAM_CUT":
        return f"{source} cut the reply off: {message.removeprefix('stream cut: ')}"
    if code == "ABORTED":
        return "cancelled before anything arrived"
    return f"{code} from {source}: {message}" if message else f"{code} from {source}"


def retry_line(failure: Failure, provider: str | None, attempt: int, decision: Any) -> str | None:
    """What a failed model call led to, in words; None when the turn fails on it.

    ``HTTP 429 from deepseek, retrying in 1.2 s (attempt 2 of 5): rate limited``, or
    ``..., giving up after 5 attempts`` when a retry was asked for but none is left.
    """
    words = failure_words(failure.to_data(), provider)
    head, sep, detail = words.partition(": ") if failure.status is not None else (words, "", "")
    tail = f"{sep}{detail}" if detail else ""
    if not isinstance(decision, Retry):
        return None
    if attempt >= MAX_ATTEMPTS:
        return f"{head}, giving up after {attempt} attempts{tail}"
    delay = max(0.0, decision.delay)
    return f"{head}, retrying in {delay:.1f} s (attempt {attempt + 1} of {MAX_ATTEMPTS}){tail}"


def store_failure_line(agent_id: str, code: str, message: str) -> str:
    """The one line saying an agent stopped on ``OWNERSHIP_LOST`` or ``STORE_FAILED``."""
    if code == "OWNERSHIP_LOST":
        what = "another process took its session over"
    else:
        what = "its session store failed"
    return f"{agent_id}: stopped, {what}; its events not yet stored are lost ({code}: {message})"


class _Block:
    """One streaming block of one agent's attempt."""

    __slots__ = ("arguments", "kind", "line", "name")

    def __init__(self, kind: str, name: str | None) -> None:
        self.kind = kind
        self.name = name
        self.arguments: list[str] = []
        self.line = ""


@final
class StreamRenderer:
    """Shows agents' live output on ``console``; attach it with ``attach(hooks)``.

    Args:
        console: Where output goes.
        prefix: Prefix every line with the agent id (several agents stream at once).
        errors: Where ``agent/error`` notifications go (default: ``console``).
    """

    def __init__(self, console: Console, *, prefix: bool, errors: Console | None = None) -> None:
        self.console = console
        self.errors = errors or console
        self.prefix = prefix
        self._blocks: dict[tuple[str, int], _Block] = {}
        self._mid_line = False
        self.store_failures: dict[str, str] = {}
        """Agent id → the ``STORE_FAILURES`` code its ``agent/error`` reported."""
        self.failures: list[str] = []
        """Observer failures (rendering must never raise into an agent's driver)."""

    def attach(self, hooks: HookBus) -> list[Disposer]:
        """Register the observers on ``hooks``; returns their disposers."""
        return [
            hooks.on(ASSISTANT_STREAM, self._guard(self.on_stream)),
            hooks.on(HOOK_TOOLS_RESULT, self._guard(self.on_tool_result)),
            hooks.on(AGENT_ERROR, self._guard(self.on_error)),
            hooks.waterfall(HOOK_REQUEST_ERROR, self.on_request_error),
        ]

    def _guard(self, fn: Any) -> Any:
        def observer(event: Event) -> None:
            try:
                fn(event)
            # An observer's exception would end the agent's turn; rich turns a closed stdout
            # (``| head``) into SystemExit after pointing stdout at /dev/null.
            except (Exception, SystemExit) as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")

        return observer

    # -- output helpers ----------------------------------------------------------------------
    def _label(self, agent_id: str) -> Text:
        return Text(f"{agent_id} │ ", style="bold blue") if self.prefix else Text()

    def end_line(self) -> None:
        """Finish a partly written line (before a panel, a prompt or a summary)."""
        if self._mid_line:
            self.console.print()
            self._mid_line = False

    def _write(self, agent_id: str, block: _Block, text: str) -> None:
        text = visible(text)
        style = "dim italic" if block.kind == "reasoning" else ""
        if not self.prefix:
            self.console.print(Text(text, style=style), end="", soft_wrap=True)
            self._mid_line = not text.endswith("\n")
            return
        block.line += text
        *lines, block.line = block.line.split("\n")
        for line in lines:
            self.console.print(self._label(agent_id) + Text(line, style=style), soft_wrap=True)

    def _flush(self, agent_id: str, block: _Block) -> None:
        if self.prefix:
            if block.line:
                style = "dim italic" if block.kind == "reasoning" else ""
                self.console.print(
                    self._label(agent_id) + Text(block.line, style=style), soft_wrap=True
                )
                block.line = ""
        else:
            self.end_line()

    # -- observers ---------------------------------------------------------------------------
    def on_stream(self, event: Event) -> None:
        """An ``agent/assistant-stream`` frame."""
        data = event.data
        agent_id = str(data.get("agent_id", "?"))
        frame = data.get("frame")
        if frame == "chunk":
            self._chunk(agent_id, data.get("chunk"))
        elif frame == "end":
            for key in [k for k in self._blocks if k[0] == agent_id]:
                self._flush(agent_id, self._blocks.pop(key))

    def _chunk(self, agent_id: str, chunk: Any) -> None:
        if isinstance(chunk, BlockStart):
            self._blocks[agent_id, chunk.index] = _Block(chunk.kind, chunk.name)
        elif isinstance(chunk, TextDelta | ReasoningDelta):
            block = self._blocks.setdefault(
                (agent_id, chunk.index),
                _Block("reasoning" if isinstance(chunk, ReasoningDelta) else "text", None),
            )
            self._write(agent_id, block, chunk.text)
        elif isinstance(chunk, ToolCallDelta):
            block = self._blocks.setdefault((agent_id, chunk.index), _Block("tool-call", None))
            block.arguments.append(chunk.arguments)
        elif isinstance(chunk, BlockEnd):
            ended = self._blocks.pop((agent_id, chunk.index), None)
            if ended is None:
                return
            if ended.kind == "tool-call":
                self._tool_call(agent_id, ended)
            else:
                self._flush(agent_id, ended)

    def _tool_call(self, agent_id: str, block: _Block) -> None:
        self.end_line()
        raw = "".join(block.arguments)
        try:
            shown = json_visible(json.dumps(json.loads(raw), ensure_ascii=False)) if raw else "{}"
        except (ValueError, RecursionError):
            shown = raw
        title = f"{agent_id} · " if self.prefix else ""
        self.console.print(
            Panel(
                # Whole, wrapped, never cut: a person approving a call reads all of it.
                Text(visible(shown), overflow="fold"),
                title=Text(visible(f"{title}tool call: {block.name}"), style="bold cyan"),
                title_align="left",
                border_style="cyan",
                expand=False,
            )
        )

    def on_tool_result(self, event: Event) -> None:
        """A ``tools/result`` notification (its ``event`` is the stored ``tool/result``)."""
        data = event.data
        stored = data.get("event")
        if not isinstance(stored, Event):
            return
        agent = data.get("agent")
        agent_id = str(getattr(agent, "id", "?"))
        message = stored.data.get("message") or {}
        text = "".join(
            str(b.get("text", ""))
            for b in message.get("content", ()) or ()
            if isinstance(b, Mapping)
        )
        lines = text.splitlines() or [""]
        if len(lines) > RESULT_LINES:
            lines = [*lines[:RESULT_LINES], f"… ({len(lines) - RESULT_LINES} more lines)"]
        error = stored.data.get("error")
        style = "red" if error else "green"
        status = f" ({error.get('code')})" if error else ""
        title = f"{agent_id} · " if self.prefix else ""
        self.end_line()
        self.console.print(
            Panel(
                Text(visible("\n".join(snippet(line, 160) for line in lines))),
                title=Text(
                    visible(f"{title}result: {message.get('name', '?')}{status}"), style=style
                ),
                title_align="left",
                border_style=style,
                expand=False,
            )
        )

    async def on_request_error(self, payload: Any, next: Any) -> Any:
        """``agent/request-error`` middleware: say what the decision about a failed call was.

        It passes the payload on unchanged and returns the decision of the listeners inside it
        (the default retry policy innermost), so it only reports and never decides.
        """
        decision = await next(payload)
        try:
            line = retry_line(
                payload["failure"], payload.get("provider"), int(payload["attempt"]), decision
            )
            if line is not None:
                agent_id = str(getattr(payload.get("agent"), "id", "?"))
                self.end_line()
                self.errors.print(
                    self._label(agent_id) + Text(visible(line), style="yellow"), soft_wrap=True
                )
        except (Exception, SystemExit) as exc:  # rendering must not change the decision
            self.failures.append(f"{type(exc).__name__}: {exc}")
        return decision

    def on_error(self, event: Event) -> None:
        """An ``agent/error`` notification: the turn failed."""
        data = event.data
        error = data.get("error") or {}
        agent_id, code = str(data.get("agent_id", "?")), str(error.get("code", "?"))
        message = " ".join(str(error.get("message", "")).split())
        if code in STORE_FAILURES:
            self.store_failures.setdefault(agent_id, code)
            line = store_failure_line(agent_id, code, message)
        else:
            line = f"{agent_id}: turn {data.get('turn')} failed: {code}: {message}"
        self.end_line()
        self.errors.print(Text(visible(line), style="bold red"), soft_wrap=True)
