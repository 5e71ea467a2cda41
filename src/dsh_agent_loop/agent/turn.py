"""The turn/step machine (SPEC §6–§12): one turn of one agent, from ``turn/start`` to ``turn/end``.

Every fact is appended before the next step is derived from it, and every exit path closes
what it opened, synchronously, before ``turn/end``: a stream in flight becomes an interrupted
``assistant/message`` carrying exactly the delivered prefix (or an ``assistant/attempt`` when
nothing was delivered), every model tool call without a result is settled by its ``ToolBatch``,
an open step gets ``step/end``. A turn ends ``aborted`` exactly when a cancel arrived before its
``turn/end`` was appended. Closing events are appended without awaiting (``Session.add`` never
blocks); only the final flush awaits, shielded and bounded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .._frozen import FrozenDict
from ..errors import AgentLoopError, StoreError
from ..events import (
    AGENT_ERROR,
    ASSISTANT_ATTEMPT,
    ASSISTANT_MESSAGE,
    ASSISTANT_STREAM,
    HOOK_ASSEMBLE,
    HOOK_PRE_STEP,
    HOOK_REQUEST,
    HOOK_REQUEST_ERROR,
    HOOK_RUNTIME_CONTEXT,
    HOOK_TURN_STOPPING,
    REQUEST_CONTEXT,
    REQUEST_HEADER,
    STEP_END,
    STEP_START,
    SYSTEM_MESSAGE,
    TURN_END,
    TURN_START,
    USER_MESSAGE,
)
from ..llm.assemble import FOLD_CHUNK, Assembler
from ..llm.base import Failure, Finish, ModelError, ModelRequest, PreparedCall, make_request
from ..session.projections import NEXT_STEP, NEXT_TURN
from ..tools.base import Tool
from ..tools.results import escape_surrogates, exception_text
from .inbox import user_message
from .prompt import PromptAssembly, PromptSection, reconcile, render, system_message
from .request import (
    MAX_ATTEMPTS,
    PreStepDecision,
    Retry,
    context_record,
    default_retry_delay,
    header_reason,
    header_record,
)
from .tool_calls import ToolBatch

if TYPE_CHECKING:
    from .driver import Agent

__all__ = ["run_turn"]

#: Seconds the closing flush of a turn may take after a cancel.
CLOSE_FLUSH_TIMEOUT = 10.0
NO_RUNTIME_CONTEXT = "no runtime context"
_NO_CONFIG = FrozenDict()
_ENTER = PreStepDecision.enter(())
# turn/end reasons without details are shared (frozen): one copy for every session.
_COMPLETED = FrozenDict(kind="completed")
_MAX_TOKENS = FrozenDict(kind="max-tokens")
_BLOCKED = FrozenDict(kind="blocked")


class TurnFailed(AgentLoopError):
    """Ends the turn ``error`` with ``code``."""


@attrs.define(eq=False)
class TurnState:
    """What the closers need to know about a turn in progress."""

    turn: int
    step: int = 0
    step_open: bool = False
    attempt: int = 0
    asm: Assembler | None = None
    batch: ToolBatch | None = None
    pending_users: tuple[FrozenDict, ...] = ()
    users_admitted: bool = False
    request_sent: bool = False
    max_tokens: bool = False
    truncated: bool = False
    continues: bool = False
    tool_calls: int = 0
    tokens: int = 0
    assembly: PromptAssembly | None = None
    tools: dict[str, Tool] = attrs.Factory(dict)
    schemas: tuple[FrozenDict, ...] = ()
    rendered: str = ""
    budget: Any = None
    step_data: FrozenDict = attrs.Factory(FrozenDict)


async def run_turn(agent: Agent, scope: trio.CancelScope) -> bool:
    """Run one turn; False when it ended ``aborted`` (pending work then waits for a wake)."""
    session = agent.log
    budget = agent.options.turn_budget or agent.services.turn_budget()
    st = TurnState(turn=session.state.turn + 1, budget=budget)
    if budget is not None and budget.max_seconds is not None:
        scope.deadline = trio.current_time() + budget.max_seconds
    session.add(TURN_START, _turn_data(st.turn))
    claimed = agent.inbox.claim(NEXT_STEP) + agent.inbox.claim(NEXT_TURN, 1)
    ended = False
    reason: Mapping[str, Any] | None = None
    try:
        try:
            with scope:
                reason = await _turn_body(agent, st, claimed)
        except Exception as exc:  # middleware, tool pipeline, store: ends the turn, not the loop
            reason = _error_reason(agent, st, exc)
        if scope.cancel_called:
            reason = _aborted_reason(agent, budget)
        _close_open_work(agent, st)
        assert reason is not None
        if reason["kind"] == "error" and not st.users_admitted and st.pending_users:
            _admit_users(agent, st)  # the session shows what was asked, even if never sent
        session.add(TURN_END, FrozenDict(turn=st.turn, reason=reason))
        ended = True
    finally:
        if not ended:  # cancelled from outside the turn scope (runtime shutdown)
            _close_open_work(agent, st)
            reason = _aborted_reason(agent, budget, default_cause="disposed")
            session.add(TURN_END, FrozenDict(turn=st.turn, reason=reason))
        agent.end_turn_scope()
        with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_FLUSH_TIMEOUT):
            try:
                await agent.flush()
            except StoreError as exc:
                _store_failed(agent, st, exc)
    return reason is not None and bool(reason["kind"] != "aborted")


def _store_failed(agent: Agent, st: TurnState, exc: StoreError) -> None:
    if agent.store_failure is not None:
        return  # already reported when the failure ended the turn
    agent.store_failure = exc
    code = "OWNERSHIP_LOST" if exc.code == "OWNERSHIP_LOST" else "STORE_FAILED"
    agent.notify(
        AGENT_ERROR,
        {"turn": st.turn, "step": st.step, "error": FrozenDict(code=code, message=str(exc))},
    )


def _primary(exc: BaseException) -> BaseException:
    """The first real failure inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup):
        leaves = [e for e in exc.exceptions if not isinstance(e, trio.Cancelled)]
        exc = leaves[0] if leaves else exc.exceptions[0]
    return exc


def _error_reason(agent: Agent, st: TurnState, exc: BaseException) -> FrozenDict:
    exc = _primary(exc)
    if isinstance(exc, StoreError):
        agent.store_failure = exc
        code = "OWNERSHIP_LOST" if exc.code == "OWNERSHIP_LOST" else "STORE_FAILED"
    elif isinstance(exc, AgentLoopError):
        code = exc.code
    else:
        code = "HOOK_FAILED"
    try:
        message = str(exc)
    except Exception:  # a __str__ that raises (or returns a non-str) still names the type
        message = ""
    message = escape_surrogates(message or type(exc).__name__)
    if not isinstance(exc, AgentLoopError):
        message = f"{type(exc).__name__}: {message}"
    error = FrozenDict(code=code, message=message)
    agent.notify(AGENT_ERROR, {"turn": st.turn, "step": st.step, "error": error})
    return FrozenDict(kind="error", error=error)


def _aborted_reason(agent: Agent, budget: Any, default_cause: str = "user") -> FrozenDict:
    cause = agent.cancel_cause
    message = agent.cancel_message
    if cause is None and budget is not None and budget.max_seconds is not None:
        cause, message = "hook", f"turn budget: maxSeconds {budget.max_seconds:g} exceeded"
    data: dict[str, Any] = {"kind": "aborted", "cause": cause or default_cause}
    if message:
        data["message"] = message
    return FrozenDict(data)


def _admit_users(agent: Agent, st: TurnState) -> None:
    for message in st.pending_users:
        agent.log.add(USER_MESSAGE, FrozenDict(message=message))
    st.users_admitted = True
    st.pending_users = ()


# -- closing --------------------------------------------------------------------------------------
def _close_open_work(agent: Agent, st: TurnState) -> None:
    """Append what keeps the log well formed after a cancel or failure (synchronous)."""
    session = agent.log
    if st.asm is not None:
        asm, st.asm = st.asm, None
        if asm.delivered:
            content = _unique_call_ids(agent, asm.content())
            data = {
                "turn": st.turn,
                "step": st.step,
                "message": FrozenDict(role="assistant", content=content),
                "stream": FrozenDict(attempt=st.attempt, finish="aborted"),
                "interrupted": True,
            }
            event = session.add(ASSISTANT_MESSAGE, FrozenDict(data))
            _frame(agent, st, {"frame": "end", "outcome": "committed", "seq": event.seq})
            calls = [b for b in content if b["type"] == "tool-call"]
            if calls:
                st.batch = ToolBatch(agent, {}, calls, st.turn, st.step)
        else:
            failure = FrozenDict(code="ABORTED", message="cancelled before anything was delivered")
            stream = FrozenDict(attempt=st.attempt)
            data = {"turn": st.turn, "step": st.step, "stream": stream, "failure": failure}
            session.add(ASSISTANT_ATTEMPT, FrozenDict(data))
            _frame(agent, st, {"frame": "end", "outcome": "abandoned"})
    if st.batch is not None:
        st.batch.close_remaining()
        st.batch = None
    if st.step_open:
        session.add(STEP_END, st.step_data)
        st.step_open = False


def _frame(agent: Agent, st: TurnState, data: dict[str, Any]) -> None:
    if agent.listening(ASSISTANT_STREAM):
        agent.notify(
            ASSISTANT_STREAM, {"turn": st.turn, "step": st.step, "attempt": st.attempt, **data}
        )


# -- the turn -------------------------------------------------------------------------------------
async def _turn_body(agent: Agent, st: TurnState, claimed: tuple[FrozenDict, ...]) -> FrozenDict:
    entering: tuple[Any, ...] = claimed
    budget = st.budget
    while True:
        step = st.step + 1
        st.pending_users = _normalise_users(agent, entering)  # kept if a hook below fails
        st.users_admitted = False
        if agent.hooks.any("waterfall"):
            assembly = await _assemble(agent, st, step)
            context_message = await _collect_context(agent, st, step)
        else:  # no middleware at all: the defaults, without a coroutine each
            assembly = _default_assembly(agent)
            context_message = _default_context(agent)
        if budget is not None:
            await _check_step_budget(agent, st, budget)
        if agent.hooks.has("waterfall", HOOK_PRE_STEP):
            decision = await _pre_step(agent, st, step, entering)
            if decision.kind == "reject":
                st.pending_users = ()  # consumed: a rejected turn admits nothing
                return _BLOCKED
            users = _normalise_users(agent, decision.messages)
        else:
            decision = _ENTER  # no listener: enter with what the inbox gave
            users = st.pending_users
        if step == 1 and not users:
            st.pending_users = ()
            return _COMPLETED
        st.pending_users = ((context_message,) if context_message is not None else ()) + users
        st.users_admitted = False
        await _run_step(agent, st, step, assembly, decision)
        if st.truncated:
            raise TurnFailed(
                "a tool call was cut by the output-token cap", code="TRUNCATED_TOOL_CALL"
            )
        if not st.continues and not agent.log.inbox.lists[NEXT_STEP]:
            await agent.hooks.serial(HOOK_TURN_STOPPING, {"agent": agent, "turn": st.turn})
            if not agent.log.inbox.lists[NEXT_STEP]:
                return _MAX_TOKENS if st.max_tokens else _COMPLETED
        entering = agent.inbox.claim(NEXT_STEP) if agent.log.inbox.lists[NEXT_STEP] else ()


def _normalise_users(agent: Agent, messages: Sequence[Any]) -> tuple[FrozenDict, ...]:
    if not messages:
        return ()
    out: list[FrozenDict] = []
    next_id = agent.log.inbox.max_id + 1
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") == "user" and "id" in message:
            out.append(
                message
                if isinstance(message, FrozenDict)
                else user_message(message["id"], message["content"], message.get("source"))
            )
        else:
            out.append(user_message(f"m-{next_id}", message))
            next_id += 1
    return tuple(out)


async def _assemble(agent: Agent, st: TurnState, step: int) -> PromptAssembly:
    async def default(payload: Any) -> PromptAssembly:
        return _default_assembly(agent)

    if not agent.hooks.has("waterfall", HOOK_ASSEMBLE):
        return _default_assembly(agent)
    payload = {"agent": agent, "turn": st.turn, "step": step}
    result = await agent.hooks.waterfall(HOOK_ASSEMBLE, payload, default)
    if not isinstance(result, PromptAssembly):
        raise TypeError(
            f"{HOOK_ASSEMBLE} must return a PromptAssembly, got {type(result).__name__}"
        )
    return result


def _default_assembly(agent: Agent) -> PromptAssembly:
    runtime_persona = agent.services.persona()
    runtime = agent.services.tools()
    scoped = agent.scope.tools
    # Rebuilt only when something it depends on changed; the same assembly (and so the same
    # cached tool schemas) is reused step after step.
    key = (runtime_persona, agent.scope.persona, tuple(runtime.values()), tuple(scoped.values()))
    cached = agent.assembly_cache
    if cached is not None and cached[0] == key:
        hit: PromptAssembly = cached[1]
        return hit
    sections = []
    if runtime_persona:
        sections.append(PromptSection("persona", runtime_persona))
    if agent.scope.persona:
        sections.append(PromptSection("persona", agent.scope.persona))
    assembly = PromptAssembly(sections, list(visible_tools(agent).values()))
    agent.assembly_cache = (key, assembly)
    return assembly


def visible_tools(agent: Agent) -> dict[str, Tool]:
    """Runtime tools the options allow, plus the agent's scoped tools."""
    runtime = agent.services.tools()
    names = agent.options.tools
    if names is None:
        tools = dict(runtime)
    else:
        tools = {}
        for name in names:
            found = runtime.get(name) or agent.services.builtin(name)
            if found is not None:
                tools[name] = found
    tools.update(agent.scope.tools)
    return tools


async def _collect_context(agent: Agent, st: TurnState, step: int) -> FrozenDict | None:
    if not agent.hooks.has("waterfall", HOOK_RUNTIME_CONTEXT):
        return _default_context(agent)

    async def default(payload: Any) -> str:
        return _cwd_text(agent)

    text = await agent.hooks.waterfall(
        HOOK_RUNTIME_CONTEXT, {"agent": agent, "turn": st.turn, "step": step}, default
    )
    return _context_message(agent, "" if text is None else str(text))


def _cwd_text(agent: Agent) -> str:
    """The default runtime context: the agent's working directory, if it has one."""
    cwd = agent.options.cwd
    return f"cwd: {cwd}" if cwd else ""


def _default_context(agent: Agent) -> FrozenDict | None:
    return _context_message(agent, _cwd_text(agent))


def _context_message(agent: Agent, text: str) -> FrozenDict | None:
    """The runtime-context user message for ``text``, or None when it is unchanged."""
    last = agent.log.state.runtime_context
    if not text:
        if last is None or last == NO_RUNTIME_CONTEXT:
            return None
        text = NO_RUNTIME_CONTEXT
    elif text == last:
        return None
    return user_message(f"m-{agent.log.inbox.max_id + 1}", text, source="runtime-context")


async def _pre_step(
    agent: Agent, st: TurnState, step: int, messages: tuple[Any, ...]
) -> PreStepDecision:

    async def default(payload: Any) -> PreStepDecision:
        return PreStepDecision.enter(payload["messages"])

    payload = {"agent": agent, "messages": messages, "turn": st.turn, "step": step}
    decision = await agent.hooks.waterfall(HOOK_PRE_STEP, payload, default)
    if not isinstance(decision, PreStepDecision):
        raise TypeError(
            f"{HOOK_PRE_STEP} must return a PreStepDecision, got {type(decision).__name__}"
        )
    return decision


async def _check_step_budget(agent: Agent, st: TurnState, budget: Any) -> None:
    message = None
    if budget.max_steps is not None and st.step >= budget.max_steps:
        message = f"turn budget: maxSteps {budget.max_steps} reached"
    elif budget.max_total_tokens is not None and st.tokens >= budget.max_total_tokens:
        message = f"turn budget: maxTotalTokens {budget.max_total_tokens} reached ({st.tokens})"
    if message is not None:
        agent.cancel(cause="hook", keep_inbox=True, message=message)
        await trio.lowlevel.checkpoint()


# -- one step -------------------------------------------------------------------------------------
async def _run_step(
    agent: Agent, st: TurnState, step: int, assembly: PromptAssembly, decision: PreStepDecision
) -> None:
    session = agent.log
    st.step_data = _step_data(st.turn, step)  # step/start and step/end share it
    session.add(STEP_START, st.step_data)
    st.step, st.step_open, st.attempt = step, True, 0
    st.continues = False
    if assembly is not st.assembly:
        st.assembly = assembly
        st.tools = {t.name: t for t in assembly.tools}
        st.schemas = tuple(t.schema for t in assembly.tools)
        st.rendered = render(assembly)
    tools, rendered = st.tools, st.rendered
    message = await _attempts(agent, st, assembly, decision, rendered)
    content = message["content"]
    calls = [b for b in content if b["type"] == "tool-call"]
    if st.truncated:
        st.batch = ToolBatch(agent, tools, calls, st.turn, st.step)
        st.batch.close_remaining()
        st.batch = None
    elif calls:
        batch = st.batch = ToolBatch(agent, tools, calls, st.turn, st.step)
        if st.budget is not None:
            await _check_tool_budget(agent, st, len(calls))
        await batch.run()
        # A handler's cleanup may have replaced its Cancelled with another exception (a
        # TOOL_ERROR result now): a cancelled turn still stops here, before another request.
        await trio.lowlevel.checkpoint_if_cancelled()
        st.tool_calls += len(calls)
        st.batch = None
        st.continues = not batch.concludes_turn
    session.add(STEP_END, st.step_data)
    st.step_open = False


async def _check_tool_budget(agent: Agent, st: TurnState, calls: int) -> None:
    budget = st.budget
    if budget.max_tool_calls is not None and st.tool_calls + calls > budget.max_tool_calls:
        agent.cancel(
            cause="hook",
            keep_inbox=True,
            message=f"turn budget: maxToolCalls {budget.max_tool_calls} exceeded",
        )
        await trio.lowlevel.checkpoint()


async def _attempts(
    agent: Agent, st: TurnState, assembly: PromptAssembly, decision: PreStepDecision, rendered: str
) -> FrozenDict:
    """Run attempts until one yields an ``assistant/message``; returns its message."""
    while True:
        st.attempt += 1
        config: FrozenDict = _NO_CONFIG
        failure: Failure | None = None
        try:
            header = agent.log.state.header
            if (
                header is not None
                and not agent.first_request
                and not agent.hooks.has("waterfall", HOOK_REQUEST)
            ):
                config = header["config"]  # frozen and validated when it was logged
            else:
                config = await _propose_config(agent, st)
            prepared = await agent.services.router.prepare_call(config)
        except ModelError as exc:
            failure = exc.failure
            data = {
                "turn": st.turn,
                "step": st.step,
                "stream": FrozenDict(attempt=st.attempt),
                "failure": FrozenDict(failure.to_data()),
            }
            agent.log.add(ASSISTANT_ATTEMPT, FrozenDict(data))
        else:
            request = _sync_phase(agent, st, prepared, config, rendered, decision)
            outcome = await _stream(agent, st, prepared, request)
            if not isinstance(outcome, Failure):
                return outcome
            failure = outcome
        retry = await _offer_failure(agent, st, failure, config)
        if retry is None:
            raise TurnFailed(failure.message, code=failure.code)
        await trio.sleep(max(0.0, retry.delay))


async def _propose_config(agent: Agent, st: TurnState) -> FrozenDict:
    opts = agent.options
    if agent.first_request or agent.log.state.header is None:
        proposal = {
            "provider": opts.provider,
            "model": opts.model,
            "reasoning_effort": opts.reasoning_effort,
            "max_tokens": opts.max_tokens,
        }
        proposal = {k: v for k, v in proposal.items() if v is not None}
    else:
        logged = agent.log.state.header["config"]
        if not agent.hooks.has("waterfall", HOOK_REQUEST):
            config: FrozenDict = logged  # already frozen and validated when it was logged
            return config
        proposal = dict(logged)

    async def default(payload: Any) -> Any:
        return payload

    if agent.hooks.has("waterfall", HOOK_REQUEST):
        payload = {
            "agent": agent,
            "turn": st.turn,
            "step": st.step,
            "attempt": st.attempt,
            "config": proposal,
        }
        result = await agent.hooks.waterfall(HOOK_REQUEST, payload, default)
        proposal = dict(result.get("config", result))
        proposal.pop("agent", None)
    if not proposal.get("provider") or not proposal.get("model"):
        raise ModelError(
            Failure(
                "NO_ROUTE",
                "the request needs both a provider and a model"
                " (set them in AgentOptions or agent/request)",
            )
        )
    return FrozenDict(proposal)


def _sync_phase(
    agent: Agent,
    st: TurnState,
    prepared: PreparedCall,
    config: FrozenDict,
    rendered: str,
    decision: PreStepDecision,
) -> ModelRequest:
    """Reconcile the prompt, admit users, write request records, build the request. No awaits."""
    session = agent.log
    surface = session.surface
    schemas = st.schemas
    logged = session.state.header
    new_series = (
        decision.starts_request_series
        or session.surface.generation != agent.seen_generation
        or (logged is not None and tuple(logged.get("tools", ())) != schemas)
    )
    nodes = surface.node_texts()
    in_history = prepared.system_prompt_update == "in-history"
    settled = agent.prompt_settled
    if (
        settled is not None
        and settled[0] is nodes
        and settled[1] is rendered
        and settled[2] == in_history
        and not new_series
    ):
        drafts: list[Any] = []  # same nodes, same prompt: the last reconcile left nothing to do
    else:
        drafts = reconcile(nodes, rendered, in_history=in_history, new_series=new_series)
    for draft in drafts:
        data = FrozenDict(turn=st.turn, step=st.step, message=system_message(draft.text))
        if draft.replaces is None:
            session.add(SYSTEM_MESSAGE, data)
        else:
            op = FrozenDict(op="replace", start_seq=draft.replaces, end_seq=draft.replaces)
            session.add(SYSTEM_MESSAGE, data, surface_op=op, source_event_seqs=(draft.replaces,))
    if not st.users_admitted:
        if st.pending_users:
            _admit_users(agent, st)
        else:
            st.users_admitted = True
    cache = agent.request_cache
    if (
        cache is not None
        and cache[0] is config
        and cache[1] is prepared
        and cache[2] is schemas
        and cache[3] is logged
    ):
        header = logged  # same inputs as the request that logged it
    else:
        header = header_record(config, prepared, schemas)
    reason = header_reason(logged, header, first_request=agent.first_request, new_series=new_series)
    if reason is not None:
        record: dict[str, Any] = {"header": header, "reason": reason}
        if reason == "change" and new_series:
            record["starts_series"] = True
        session.add(REQUEST_HEADER, FrozenDict(record))
    if cache is None or cache[1] is not prepared:
        context = context_record(prepared, session.state.context)
        if context is not None:
            session.add(REQUEST_CONTEXT, context)
    agent.request_cache = (config, prepared, schemas, session.state.header)
    # node_texts() is a new list whenever a system node changed, so identity says "unchanged".
    agent.prompt_settled = (surface.node_texts(), rendered, in_history)
    agent.first_request = False
    agent.seen_generation = session.surface.generation
    st.request_sent = True
    return make_request(prepared.config, session.derive_messages(), schemas)


async def _stream(
    agent: Agent, st: TurnState, prepared: PreparedCall, request: ModelRequest
) -> FrozenDict | Failure:
    asm = Assembler()
    st.asm = asm
    frames = agent.listening(ASSISTANT_STREAM)
    if frames:
        _frame(agent, st, {"frame": "start"})
    failure: Failure | None = None
    stream = prepared.stream_fn(request)
    fold = FOLD_CHUNK
    try:
        async for chunk in stream:
            fold[type(chunk)](asm, chunk)
            if frames:
                _frame(
                    agent,
                    st,
                    {
                        "frame": "chunk",
                        "index": getattr(chunk, "index", None),
                        "time": agent.services.clock(),
                        "chunk": chunk,
                    },
                )
    except ModelError as exc:
        failure = exc.failure
        await _close_stream(stream)
    except Exception as exc:  # an adapter bug is a coded failure, not a crashed loop
        failure = Failure("PROVIDER_ERROR", exception_text(exc))
        await _close_stream(stream)
    except BaseException:
        await _close_stream(stream)
        raise
    return _settle_stream(agent, st, asm, failure, frames)


async def _close_stream(stream: Any) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_FLUSH_TIMEOUT):
            await aclose()


def _settle_stream(
    agent: Agent, st: TurnState, asm: Assembler, failure: Failure | None, frames: bool
) -> FrozenDict | Failure:
    session = agent.log
    finish: Finish | None = asm.finish
    if failure is None:
        if finish is None:
            failure = Failure("STREAM_CUT", "the model stream ended without a finish")
        elif finish.reason == "error":
            failure = finish.failure or Failure("PROVIDER_ERROR", "the provider reported an error")
        elif finish.reason == "aborted":
            failure = Failure("PROVIDER_ERROR", "the provider aborted the stream")
    st.asm = None
    if asm.usage is not None:
        st.tokens += asm.usage.input_tokens + asm.usage.output_tokens
    if failure is not None:
        _abandon_attempt(agent, st, asm, failure, frames)
        return failure
    assert finish is not None
    stream = _stream_record(st.attempt, finish.reason, finish.stop_reason)
    message = FrozenDict(role="assistant", content=_unique_call_ids(agent, asm.content()))
    if asm.usage is not None:
        record = FrozenDict(
            turn=st.turn,
            step=st.step,
            message=message,
            stream=stream,
            usage=FrozenDict(asm.usage.to_data()),
        )
    else:
        record = FrozenDict(turn=st.turn, step=st.step, message=message, stream=stream)
    event = session.add(ASSISTANT_MESSAGE, record)
    if frames:
        _frame(agent, st, {"frame": "end", "outcome": "committed", "seq": event.seq})
    if finish.reason == "max-tokens":
        st.max_tokens = True
        st.truncated = asm.has_cut_tool_call()
    return message


def _abandon_attempt(
    agent: Agent, st: TurnState, asm: Assembler, failure: Failure, frames: bool
) -> None:
    """Append the ``assistant/attempt`` of a failed attempt (what it delivered, and why)."""
    session = agent.log
    text, reasoning = asm.delivered_text()
    stream: dict[str, Any] = {"attempt": st.attempt}
    if text:
        stream["text"] = text
    if reasoning:
        stream["reasoning"] = reasoning
    data = {
        "turn": st.turn,
        "step": st.step,
        "stream": FrozenDict(stream),
        "failure": FrozenDict(failure.to_data()),
    }
    session.add(ASSISTANT_ATTEMPT, FrozenDict(data))
    if frames:
        _frame(agent, st, {"frame": "end", "outcome": "abandoned"})


def _unique_call_ids(agent: Agent, content: tuple[FrozenDict, ...]) -> tuple[FrozenDict, ...]:
    """Rename tool-call ids already used in this session (a model may repeat or omit them).

    Every call must get exactly one ``tool/call`` and one ``tool/result``, and providers reject a
    request whose tool-call ids repeat; so a repeated (or empty) id becomes ``<id>~<n>``.
    """
    used = agent.log.state.call_ids or set()
    seen: set[str] = set()
    out: list[FrozenDict] | None = None
    for i, block in enumerate(content):
        if block["type"] != "tool-call":
            continue
        call_id = block["call_id"]
        if call_id and call_id not in used and call_id not in seen:
            seen.add(call_id)
            continue
        n = 2
        while f"{call_id}~{n}" in used or f"{call_id}~{n}" in seen:
            n += 1
        new_id = f"{call_id}~{n}"
        seen.add(new_id)
        if out is None:
            out = list(content)
        out[i] = FrozenDict({**block, "call_id": new_id})
    return content if out is None else tuple(out)


def _stream_record(attempt: int, finish: str, stop_reason: str | None) -> FrozenDict:
    """The ``stream`` field of an ``assistant/message``.

    Shared: it is frozen and nearly always one of a few values, so thousands of sessions hold
    one copy.
    """
    key = (attempt, finish, stop_reason)
    record = _STREAM_RECORDS.get(key)
    if record is None:
        data: dict[str, Any] = {"attempt": attempt, "finish": finish}
        if stop_reason is not None:
            data["stop_reason"] = stop_reason
        record = FrozenDict(data)
        if len(_STREAM_RECORDS) < _STREAM_RECORDS_MAX:
            _STREAM_RECORDS[key] = record
    return record


_STREAM_RECORDS: dict[tuple[int, str, str | None], FrozenDict] = {}
_STREAM_RECORDS_MAX = 256

# `{turn, step}` and `{turn}` payloads of early turns and steps are shared the same way: the
# agents of a simulation are at the same turns and steps, and each such record would otherwise
# be one small dict per session.
_POSITIONS: dict[tuple[int, int], FrozenDict] = {}
_SHARED_POSITIONS = 64


def _step_data(turn: int, step: int) -> FrozenDict:
    if turn > _SHARED_POSITIONS or step > _SHARED_POSITIONS:
        return FrozenDict(turn=turn, step=step)
    data = _POSITIONS.get((turn, step))
    if data is None:
        data = _POSITIONS[turn, step] = FrozenDict(turn=turn, step=step)
    return data


def _turn_data(turn: int) -> FrozenDict:
    if turn > _SHARED_POSITIONS:
        return FrozenDict(turn=turn)
    data = _POSITIONS.get((turn, 0))
    if data is None:
        data = _POSITIONS[turn, 0] = FrozenDict(turn=turn)
    return data


async def _offer_failure(
    agent: Agent, st: TurnState, failure: Failure, config: Mapping[str, Any]
) -> Retry | None:
    """Offer ``failure`` to ``agent/request-error``; the default policy is innermost."""
    rng = agent.services.rng

    async def default_policy(payload: Any) -> Retry | None:
        delay = default_retry_delay(payload["failure"], payload["attempt"], rng)
        return None if delay is None else Retry(delay)

    payload = {
        "agent": agent,
        "turn": st.turn,
        "step": st.step,
        "provider": config.get("provider"),
        "failure": failure,
        "attempt": st.attempt,
    }
    if agent.hooks.has("waterfall", HOOK_REQUEST_ERROR):
        result = await agent.hooks.waterfall(HOOK_REQUEST_ERROR, payload, default_policy)
    else:
        result = await default_policy(payload)
    if isinstance(result, Retry) and st.attempt < MAX_ATTEMPTS:
        return result
    return None
