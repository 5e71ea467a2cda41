"""Runs one step's tool calls in model order (docs/design.md#tools).

Admission in model order, a bounded rolling pool, exclusive barriers, keyed serialisation,
and results committed in model order.

Admission walks the calls in model order, one at a time: resolve the tool, parse and validate
the arguments, run ``tools/pre-execute``. A rejected call gets its ``tool/call`` and error result
at its place. A parallel call then takes a pool slot (``trio.CapacityLimiter``, first come first
served because admission is sequential) and only then is dispatched: its ``tool/call`` is
appended. Calls dispatched in one scheduler pass share one flush, and no handler starts before
the flush that covers its ``tool/call`` (a side effect exists only if its call was durable). An
exclusive call waits for every earlier call, runs alone, and holds back every later one.

Results are appended strictly in model order as they become ready, whatever the completion
order. On cancel or failure, ``close_remaining`` (synchronous) settles every call: dispatched
ones without a result get ``ABORTED`` (or ``ABORTED_BEFORE_DISPATCH`` if their handler never
started); calls never dispatched get a ``tool/call`` and ``ABORTED_BEFORE_DISPATCH``.

After ``tools/pre-execute``, the agent's permission policy judges the call
(``_agent/_permissions.py``: deny, then ask, then allow, then the mode). A denied call gets its
``tool/call`` and a ``DENIED`` result naming the rule or mode. A call that asks is deferred at its
place in admission order: its ``tool/call`` and a ``tool/approval-requested`` are appended, it
gets no result in this turn, and the batch flushes them before it returns; the turn then ends
``awaiting-approval`` (``_agent/approvals.py``). ``run_decided`` settles such calls in the
continuation turn once each is decided.

One call's bad outcome is that call's result, never the batch's or the agent's end: a handler
raising an ``Exception`` (even one whose ``str()`` fails) is ``TOOL_ERROR``, and a returned value
the log cannot hold is replaced or escaped by ``tools.results.checked_result``. A
``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``,
cancellation) is not an answer: it propagates, as trio expects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, final

import attrs
import trio

from .._frozen import FrozenDict, freeze
from .._session.projections import NEXT_STEP
from .._session.records import approval_requested_data, tool_call_data, tool_result_data
from .._tools.base import (
    ArgumentsError,
    Tool,
    ToolContext,
    ToolResult,
    make_context,
    parse_arguments,
)
from .._tools.pipeline import ABORTED_BEFORE_DISPATCH_TEXT, ABORTED_TEXT, Deny
from .._tools.results import bounded_text, checked_result, escape_surrogates
from ..events import (
    HOOK_TOOLS_EXECUTE,
    HOOK_TOOLS_POST_EXECUTE,
    HOOK_TOOLS_PRE_EXECUTE,
    HOOK_TOOLS_RESULT,
    TOOL_APPROVAL_REQUESTED,
    TOOL_CALL,
    TOOL_RESULT,
    make_event,
)
from ._judge import gate
from ._tool_invoke import invoke, raised

if TYPE_CHECKING:
    from .._hooks import HookChain
    from .._session.log import Session
    from ._turn_context import TurnContext

__all__ = ["ToolBatch"]

_ERROR_NAMES = {
    "UNKNOWN_TOOL": "UnknownTool",
    "INVALID_ARGUMENTS": "InvalidArguments",
    "DENIED": "Denied",
    "ABORTED": "Aborted",
    "ABORTED_BEFORE_DISPATCH": "AbortedBeforeDispatch",
    "TOOL_ERROR": "TooManyToolCalls",  # the one rejection with this code (``Limits``)
}
#: The result slot of a deferred call: it is skipped by the commits (no result this turn).
_DEFERRED = ToolResult("")


class _Call:
    __slots__ = (
        "arguments",
        "block",
        "call_seq",
        "done",
        "error_name",
        "result",
        "started",
        "tool",
    )

    def __init__(self, block: FrozenDict) -> None:
        self.block = block
        self.tool: Tool | None = None
        self.arguments: dict[str, Any] | None = None
        self.call_seq: int | None = None
        self.started = False
        self.result: ToolResult | str | None = None
        """A plain string is a successful text result (no ``ToolResult`` built for it)."""
        self.error_name: str | None = None
        self.done: trio.Event | None = None
        """Made when something must wait for this call (an exclusive call, an equal key)."""

    def finish(self, result: ToolResult | str, error_name: str | None = None) -> None:
        self.result = result
        self.error_name = error_name
        if self.done is not None:
            self.done.set()


@final
class ToolBatch:
    """The tool calls of one assistant message, from admission to committed results."""

    __slots__ = (
        "_agent",
        "_calls",
        "_head",
        "_hooks",
        "_key_tails",
        "_key_wait",
        "_limiter",
        "_max_bytes",
        "_session",
        "_step",
        "_to_start",
        "_tools",
        "_turn",
        "concludes_turn",
        "deferred",
    )

    def __init__(
        self,
        agent: TurnContext,
        tools: Mapping[str, Tool],
        blocks: Sequence[FrozenDict],
        turn: int,
        step: int,
    ) -> None:
        self._agent = agent
        self._session: Session = agent.log
        self._hooks: HookChain = agent.hooks
        self._tools = tools
        self._calls = [_Call(b) for b in blocks]
        self._turn = turn
        self._step = step
        self._limiter: trio.CapacityLimiter | None = None
        self._head = 0
        self._to_start: list[_Call] = []
        # made on the first call with a concurrency key (one batch per step: most have none)
        self._key_tails: dict[Any, trio.Event] | None = None
        self._key_wait: dict[int, trio.Event] | None = None
        self.concludes_turn = False
        """True when a committed result asked to end the turn."""
        self.deferred: tuple[str, ...] = ()
        """Call ids deferred for approval, in model order."""
        self._max_bytes = agent.services.limits.max_tool_result_bytes

    def __len__(self) -> int:
        return len(self._calls)

    # -- admission ---------------------------------------------------------------------------
    async def run(self) -> None:
        """Admit, run and commit every call (cancellation leaves work for ``close_remaining``)."""
        if len(self._calls) == 1:
            await self._run_single(self._calls[0])
            return
        self._make_limiter()
        cap = self._agent.services.limits.max_tool_calls_per_reply
        async with trio.open_nursery() as nursery:
            for index, call in enumerate(self._calls):
                if index < cap:
                    await self._admit(call, nursery)
                else:  # past the cap: the model reads why, nothing runs
                    self._reject(call, "TOOL_ERROR", _too_many(len(self._calls), cap))
            await self._start_pending(nursery)
        if self.deferred:
            await self._agent.flush()  # the requests are durable before the turn ends

    def _make_limiter(self) -> None:
        """The step's pool (none when there are fewer calls than slots: none would wait)."""
        limit = max(1, self._agent.services.max_parallel_tool_calls())
        if len(self._calls) > limit:
            self._limiter = trio.CapacityLimiter(limit)

    async def _run_single(self, call: _Call) -> None:
        # One call needs no nursery, no pool slot and no completion event: admit, flush, run.
        if await self._policy(call):
            self._append_call(call)
            await self._agent.flush()
            await self._execute(call, held_slot=False)
        elif self.deferred:
            await self._agent.flush()

    async def _admit(self, call: _Call, nursery: trio.Nursery) -> None:
        if await self._policy(call):
            await self._schedule(call, nursery)

    async def _schedule(self, call: _Call, nursery: trio.Nursery) -> None:
        """Run an admitted call: alone after every earlier one (exclusive), or in the pool."""
        assert call.tool is not None
        if call.tool.execution_mode == "exclusive":
            await self._start_pending(nursery)
            await self._wait_all_before(call)
            self._dispatch(call)
            await self._agent.flush()
            await self._execute(call, held_slot=False)
            return
        limiter = self._limiter
        if limiter is not None:
            try:
                limiter.acquire_on_behalf_of_nowait(call)
            except trio.WouldBlock:
                await self._start_pending(nursery)
                await limiter.acquire_on_behalf_of(call)
        self._dispatch(call)
        self._to_start.append(call)

    async def _start_pending(self, nursery: trio.Nursery) -> None:
        if not self._to_start:
            return
        batch, self._to_start = self._to_start, []
        await self._agent.flush()
        for call in batch:
            nursery.start_soon(self._execute, call, True)

    async def _wait_all_before(self, call: _Call) -> None:
        for other in self._calls:
            if other is call:
                return
            if other.result is None:  # admitted earlier and still running
                if other.done is None:
                    other.done = trio.Event()
                await other.done.wait()

    async def _policy(self, call: _Call) -> bool:
        """Resolve, validate, ask ``tools/pre-execute``, then the permission policy.

        False: the call was rejected or deferred (it is not dispatched now).
        """
        name = call.block["name"]
        tool = self._tools.get(name)
        if tool is None:
            self._reject(call, "UNKNOWN_TOOL", f"Error: unknown tool {name!r}")
            return False
        try:
            arguments = parse_arguments(tool, call.block.get("arguments", ""))
        except ArgumentsError as exc:
            self._reject(call, "INVALID_ARGUMENTS", f"Error: invalid arguments for {name}: {exc}")
            return False
        if self._hooks.has("waterfall", HOOK_TOOLS_PRE_EXECUTE):
            payload = {
                "agent": self._agent.facade,
                "call_id": call.block["call_id"],
                "name": name,
                "arguments": arguments,
                "turn": self._turn,
                "step": self._step,
            }

            async def allow(p: Any) -> Any:
                return p

            decision = await self._hooks.waterfall(HOOK_TOOLS_PRE_EXECUTE, payload, allow)
            if isinstance(decision, Deny):
                self._reject(call, "DENIED", f"Error: tool call denied: {decision.reason}")
                return False
            if isinstance(decision, Mapping) and decision.get("arguments") is not arguments:
                try:
                    arguments = dict(decision["arguments"])
                    tool.validate(arguments)
                except (ArgumentsError, KeyError, TypeError, ValueError) as exc:
                    self._reject(
                        call, "INVALID_ARGUMENTS", f"Error: invalid arguments for {name}: {exc}"
                    )
                    return False
        call.tool = tool
        call.arguments = arguments
        verdict = gate(self._agent).check(tool, arguments)
        if verdict is None:
            return True
        if verdict.denied:
            self._reject(call, "DENIED", verdict.text)
        else:  # a deferred call waits for approval: like a rejected one, it is not dispatched now
            self._defer(call, arguments)
        return False

    def _defer(self, call: _Call, arguments: dict[str, Any]) -> None:
        """Defer ``call`` for a person's decision (durable approval)."""
        self._append_call(call)
        block = call.block
        data = approval_requested_data(
            self._turn, self._step, block["call_id"], block["name"], freeze(arguments)
        )
        self._session.add(TOOL_APPROVAL_REQUESTED, data)
        self.deferred += (block["call_id"],)
        call.finish(_DEFERRED)
        self._commit_ready()

    def _append_call(self, call: _Call) -> None:
        data = tool_call_data(self._turn, self._step, call.block)
        call.call_seq = self._session.add(TOOL_CALL, data).seq

    def _reject(self, call: _Call, code: str, text: str) -> None:
        self._append_call(call)
        # The text may echo model output or a policy's reason: keep it encodable.
        call.finish(ToolResult(content=escape_surrogates(text), error=code), _ERROR_NAMES[code])
        self._commit_ready()

    def _dispatch(self, call: _Call) -> None:
        if call.call_seq is None:  # a decided call's tool/call is stored already
            self._append_call(call)
        if (
            call.tool is not None
            and call.tool.concurrency_key is not None
            and call.arguments is not None
        ):
            key = call.tool.concurrency_key(call.arguments)
            if key is not None:
                if self._key_tails is None:
                    self._key_tails, self._key_wait = {}, {}
                assert self._key_wait is not None
                previous = self._key_tails.get(key)
                call.done = trio.Event()  # the next call with this key waits for it
                self._key_tails[key] = call.done
                if previous is not None:
                    self._key_wait[id(call)] = previous

    # -- execution --------------------------------------------------------------------------
    async def _execute(self, call: _Call, held_slot: bool) -> None:
        result: ToolResult | str | None = None
        error_name: str | None = None
        try:
            key_wait = self._key_wait
            previous = key_wait.pop(id(call), None) if key_wait else None
            if previous is not None:
                await previous.wait()
            call.started = True
            hooks = self._hooks
            if hooks.any("waterfall") and (
                hooks.has("waterfall", HOOK_TOOLS_EXECUTE)
                or hooks.has("waterfall", HOOK_TOOLS_POST_EXECUTE)
            ):
                result, error_name = await self._invoke(call)
            else:  # no middleware: the handler directly (two coroutine levels fewer)
                tool, arguments = call.tool, call.arguments
                assert tool is not None
                assert arguments is not None
                try:
                    value = await tool.handler(arguments, self._context(call))
                except Exception as exc:  # a raising tool is a result the model reads
                    result, error_name = raised(exc)
                else:
                    result, error_name = checked_result(value)
        finally:
            if held_slot and self._limiter is not None:
                self._limiter.release_on_behalf_of(call)
            if result is None:
                if call.started:
                    result, error_name = ToolResult(ABORTED_TEXT, error="ABORTED"), "Aborted"
                else:
                    result = ToolResult(
                        ABORTED_BEFORE_DISPATCH_TEXT, error="ABORTED_BEFORE_DISPATCH"
                    )
                    error_name = "AbortedBeforeDispatch"
            call.finish(result, error_name)
            self._commit_ready()

    def _context(self, call: _Call) -> ToolContext:
        agent = self._agent
        return make_context(
            agent.id,
            self._session.id,
            call.block["call_id"],
            agent.options.cwd,
            self._turn,
            self._step,
            agent.workspace,
        )

    async def _invoke(self, call: _Call) -> tuple[ToolResult | str, str | None]:
        """Run the handler inside the ``tools/execute`` and ``tools/post-execute`` chains."""
        tool, arguments = call.tool, call.arguments
        assert tool is not None
        assert arguments is not None
        payload = {
            "agent": self._agent.facade,
            "call_id": call.block["call_id"],
            "name": tool.name,
            "arguments": arguments,
            "turn": self._turn,
            "step": self._step,
        }
        return await invoke(self._hooks, tool, payload, self._context(call))

    # -- commits ----------------------------------------------------------------------------
    def _commit_ready(self) -> None:
        calls = self._calls
        while self._head < len(calls) and calls[self._head].result is not None:
            self._commit(calls[self._head])
            self._head += 1

    def _commit(self, call: _Call) -> None:
        result = call.result
        assert result is not None
        assert call.call_seq is not None
        if type(result) is str:
            if len(result) > self._max_bytes >> 2:  # it may be over the cap (Limits)
                result = bounded_text(result, self._max_bytes)
            data = tool_result_data(self._turn, self._step, call.block, result)
            event = self._session.add(TOOL_RESULT, data, source_event_seqs=(call.call_seq,))
        else:
            if result is _DEFERRED:
                return
            assert isinstance(result, ToolResult)
            result = self._bounded(result)
            error = (
                None if result.error is None else (call.error_name or result.error, result.error)
            )
            meta = None if result.meta is None else freeze(result.meta)
            data = tool_result_data(
                self._turn, self._step, call.block, result.content, error=error, meta=meta
            )
            event = self._session.add(TOOL_RESULT, data, source_event_seqs=(call.call_seq,))
            if result.concludes_turn:
                self.concludes_turn = True
            for text in result.additional_contexts:
                self._agent.inbox.insert(text, NEXT_STEP, source="tool-result")
        if self._hooks.has("on", HOOK_TOOLS_RESULT):
            if type(result) is str:
                result = ToolResult(content=result)
            self._hooks.emit(
                HOOK_TOOLS_RESULT,
                make_event(
                    HOOK_TOOLS_RESULT,
                    None,
                    event.time,
                    FrozenDict(agent=self._agent.facade, event=event, result=result),
                ),
            )

    def _bounded(self, result: ToolResult) -> ToolResult:
        """``result`` with its content and injected contexts cut to the size cap (``Limits``)."""
        limit = self._max_bytes
        quarter = limit >> 2
        if len(result.content) <= quarter and all(
            len(t) <= quarter for t in result.additional_contexts
        ):
            return result
        return attrs.evolve(
            result,
            content=bounded_text(result.content, limit),
            additional_contexts=tuple(bounded_text(t, limit) for t in result.additional_contexts),
        )

    def close_remaining(self) -> None:
        """Settle every call without a committed result (after a cancel or a failure)."""
        for call in self._calls[self._head :]:
            if call.result is None:
                if call.call_seq is None:
                    self._append_call(call)
                if call.started:
                    call.finish(ToolResult(ABORTED_TEXT, error="ABORTED"), "Aborted")
                else:
                    call.finish(
                        ToolResult(ABORTED_BEFORE_DISPATCH_TEXT, error="ABORTED_BEFORE_DISPATCH"),
                        "AbortedBeforeDispatch",
                    )
            elif call.call_seq is None:
                self._append_call(call)
            self._commit_ready()  # each synthetic tool/call is followed by its result
        for call in self._calls:  # deferred, but the turn ends without waiting for a decision
            if call.result is _DEFERRED:
                call.finish(
                    ToolResult(ABORTED_BEFORE_DISPATCH_TEXT, error="ABORTED_BEFORE_DISPATCH"),
                    "AbortedBeforeDispatch",
                )
                self._commit(call)

    # -- approvals (the continuation turn) --------------------------------------------------
    def preset(
        self, index: int, call_seq: int, arguments: Mapping[str, Any], denial: str | None
    ) -> None:
        """Mark call ``index`` as decided: its ``tool/call`` is stored; a denial is its result."""
        call = self._calls[index]
        call.call_seq = call_seq
        call.arguments = dict(arguments)
        if denial is not None:
            call.finish(ToolResult(escape_surrogates(denial), error="DENIED"), "Denied")

    async def run_decided(self, tools: Mapping[str, Tool]) -> None:
        """Settle the preset calls: denials are committed, approved calls run as in any step.

        The decisions are made durable before any approved handler starts; approved calls then
        run in model order under the step's pool, exclusive barriers and concurrency keys, and
        their results are committed in model order.
        """
        self._tools = tools
        self._commit_ready()
        if self.settled:
            return
        await self._agent.flush()
        self._make_limiter()
        async with trio.open_nursery() as nursery:
            for call in self._calls:
                if call.result is None and self._resolve_decided(call, tools):
                    await self._schedule(call, nursery)
            await self._start_pending(nursery)

    def _resolve_decided(self, call: _Call, tools: Mapping[str, Tool]) -> bool:
        """Find an approved call's tool and check its arguments again; False: it got a result."""
        name = call.block["name"]
        tool, arguments = tools.get(name), call.arguments
        assert arguments is not None
        try:
            if tool is None:
                raise LookupError(name)
            tool.validate(arguments)
        except LookupError:
            text = escape_surrogates(f"Error: unknown tool {name!r}")
            call.finish(ToolResult(text, error="UNKNOWN_TOOL"), "UnknownTool")
        except ArgumentsError as exc:
            text = escape_surrogates(f"Error: invalid arguments for {name}: {exc}")
            call.finish(ToolResult(text, error="INVALID_ARGUMENTS"), "InvalidArguments")
        else:
            call.tool = tool
            return True
        self._commit_ready()
        return False

    @property
    def settled(self) -> bool:
        """True when every call has a committed result."""
        return self._head == len(self._calls)


def _too_many(calls: int, cap: int) -> str:
    return (
        f"Error: this reply asked for {calls} tool calls; at most {cap} run per reply "
        "(max_tool_calls_per_reply), so this call did not run"
    )
