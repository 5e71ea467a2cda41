"""Tools: the ``Tool`` record, the ``@tool`` decorator, results and argument validation.

A tool is a name, a description, a JSON-schema for its arguments (derived from the function's
type hints when omitted), an async handler and an execution mode: ``parallel`` calls share the
step's bounded pool, ``exclusive`` calls run alone and are ordering barriers. Optional
``concurrency_key(args)`` serialises calls with equal keys while others overlap, and
``requires_approval`` (``True`` or a predicate of the arguments) defers a call until a person
approves or denies it (``_agent/approvals.py``).

Arguments are parsed and validated before dispatch (schemas compiled once with fastjsonschema,
or checked by the tool's own ``validator``: MCP tools bring one built for untrusted schemas);
the outcome of a rejected call is an error result the model can read, never an exception.
"""

from __future__ import annotations

import inspect
import json
import json.scanner
import re
import types
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, final, overload

import attrs
import fastjsonschema

from .._frozen import FrozenDict, freeze, json_default
from .._sandbox import Workspace

__all__ = [
    "ArgumentsError",
    "InvalidToolResult",
    "Tool",
    "ToolContext",
    "ToolResult",
    "parse_arguments",
    "register",
    "tool",
]

ExecutionMode = Literal["parallel", "exclusive"]
#: Longest argument text echoed back to the model in an ``INVALID_ARGUMENTS`` result.
MAX_ECHO = 2_000


def _as_tuple(texts: Iterable[str]) -> tuple[str, ...]:
    return texts if type(texts) is tuple else tuple(texts)


@final
@attrs.frozen
class ToolResult:
    """What a tool returns (a plain ``str`` return is ``ToolResult(content=...)``)."""

    content: str
    """Text the model reads."""
    error: str | None = None
    """An error code (``TOOL_ERROR``, ``DENIED``, ...) when the call failed."""
    concludes_turn: bool = False
    """End the turn after this step instead of asking the model again."""
    additional_contexts: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple)
    """Texts injected into the agent's ``next-step`` inbox, in order."""
    meta: Mapping[str, Any] | None = None
    """JSON-compatible data logged with the result (not shown to the model)."""


#: The workspace of a tool called without one: the default sandbox, nothing protected.
DEFAULT_WORKSPACE = Workspace()


@final
@attrs.frozen
class ToolContext:
    """Passed to a handler that declares a parameter annotated ``ToolContext``."""

    agent_id: str
    session_id: str
    call_id: str
    cwd: str | None
    turn: int
    step: int
    workspace: Workspace = DEFAULT_WORKSPACE
    """The sandbox and the protected paths the agent's built-in tools keep to."""


_new = object.__new__
_ctx_setters = tuple(
    ToolContext.__dict__[name].__set__
    for name in ("agent_id", "session_id", "call_id", "cwd", "turn", "step", "workspace")
)


def make_context(
    agent_id: str,
    session_id: str,
    call_id: str,
    cwd: str | None,
    turn: int,
    step: int,
    workspace: Workspace = DEFAULT_WORKSPACE,
) -> ToolContext:
    """Build a ``ToolContext`` through its slots (the per-call hot path; no validation)."""
    context = _new(ToolContext)
    a, b, c, d, e, f, g = _ctx_setters
    a(context, agent_id)
    b(context, session_id)
    c(context, call_id)
    d(context, cwd)
    e(context, turn)
    f(context, step)
    g(context, workspace)
    return context


Handler = Callable[[Mapping[str, Any], ToolContext], Awaitable["ToolResult | str"]]
ApprovalRule = bool | Callable[[Mapping[str, Any]], bool]


@final
class ArgumentsError(ValueError):
    """Raw arguments are not valid JSON, not an object, or violate the schema."""


@final
class InvalidToolResult(TypeError):
    """A tool returned what cannot be a result (the call's ``TOOL_ERROR``, never the agent's)."""


def _validator(schema: Mapping[str, Any]) -> Callable[[Any], Any]:
    validate: Callable[[Any], Any] = fastjsonschema.compile(_thaw_schema(schema))
    return validate


def _thaw_schema(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw_schema(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_thaw_schema(v) for v in value]
    return value


@final
@attrs.define(eq=False)
class Tool:
    """A tool the model may call."""

    name: str
    description: str
    parameters: FrozenDict = attrs.field(converter=freeze)
    """JSON schema of the arguments object."""
    handler: Handler
    """``await handler(arguments, context)`` returns a ``ToolResult`` or a string."""
    execution_mode: ExecutionMode = "parallel"
    concurrency_key: Callable[[Mapping[str, Any]], Any] | None = None
    """Calls whose keys are equal (and not None) run one at a time, in model order."""
    requires_approval: ApprovalRule = False
    """``True``, or ``predicate(arguments) -> bool``: the call waits for ``agent.approve``."""
    validator: Callable[[Any], Any] | None = attrs.field(default=None, kw_only=True, repr=False)
    """Checks parsed arguments, raising ``ArgumentsError``. None: ``parameters`` compiled with
    fastjsonschema, which is for trusted schemas only (it fetches a ``$ref`` to a URL and runs
    ``pattern`` with backtracking ``re``); an MCP server's tools bring their own."""
    _schema_fn: Callable[[Any], Any] | None = attrs.field(default=None, init=False, repr=False)
    _wire: FrozenDict | None = attrs.field(default=None, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.execution_mode not in ("parallel", "exclusive"):
            raise ValueError(
                f"execution_mode must be 'parallel' or 'exclusive', got {self.execution_mode!r}"
            )
        if self.validator is not None:
            self._schema_fn = self.validator

    @property
    def schema(self) -> FrozenDict:
        """The schema the model sees: ``{name, description, parameters}`` (built once)."""
        if self._wire is None:
            self._wire = FrozenDict(
                name=self.name, description=self.description, parameters=self.parameters
            )
        return self._wire

    def validate(self, arguments: Any) -> None:
        """Check parsed arguments against the schema (compiled once per tool).

        Raises:
            ArgumentsError: the arguments violate the schema.
        """
        if self._schema_fn is None:
            self._schema_fn = _validator(self.parameters)
        try:
            self._schema_fn(arguments)
        except fastjsonschema.JsonSchemaException as exc:
            raise ArgumentsError(str(getattr(exc, "message", exc))) from None


_scan_once: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(
    json.JSONDecoder()  # type: ignore[arg-type]  # typeshed mis-types the argument
)
_WHITESPACE = re.compile(r"[ \t\n\r]*")


def register(tools: dict[str, Tool], tool: Tool) -> Callable[[], None]:
    """Put ``tool`` in ``tools`` under its name; returns a disposer that removes it again.

    The disposer removes only this tool: one registered later under the same name stays.
    """
    tools[tool.name] = tool

    def dispose() -> None:
        if tools.get(tool.name) is tool:
            del tools[tool.name]

    return dispose


def _not_json(raw: str, exc: BaseException) -> ArgumentsError:
    shown = raw if len(raw) <= MAX_ECHO else raw[:MAX_ECHO] + "…"
    return ArgumentsError(f"arguments are not valid JSON ({exc}): {shown}")


def parse_arguments(tool: Tool, raw: str) -> dict[str, Any]:
    """Parse and validate raw JSON arguments for ``tool``.

    Raises:
        ArgumentsError: bad JSON, a non-object, or a schema violation (message for the model).
    """
    text = raw.strip() if raw else ""
    if not text:
        value: Any = {}
    else:
        try:
            # The decoder's C scanner directly (what json.loads ends up calling), then the
            # same trailing-data rule json.loads applies.
            value, end = _scan_once(text, 0)
            if end != len(text):
                end = _WHITESPACE.match(text, end).end()  # type: ignore[union-attr]
                raise json.JSONDecodeError("Extra data", text, end)
        except StopIteration as exc:
            error = json.JSONDecodeError("Expecting value", text, exc.value)
            raise _not_json(raw, error) from None
        except (ValueError, RecursionError) as exc:  # ValueError: an int past 4,300 digits too
            raise _not_json(raw, exc) from None
    if not isinstance(value, dict):
        raise ArgumentsError(f"arguments must be a JSON object, got {type(value).__name__}")
    tool.validate(value)
    return value


# --- schema from type hints -------------------------------------------------------------------

_SIMPLE: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    Any: {},
}


def _hint_schema(hint: Any) -> dict[str, Any]:
    if hint in _SIMPLE:
        return dict(_SIMPLE[hint])
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Annotated:
        schema = _hint_schema(args[0])
        for extra in args[1:]:
            if isinstance(extra, str):
                schema["description"] = extra
        return schema
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_hint_schema(a) for a in args]}
    if origin in (list, Sequence, tuple) or hint in (list, tuple):
        array: dict[str, Any] = {"type": "array"}
        if (args and args[-1] is not Ellipsis) or args:
            array["items"] = _hint_schema(args[0])
        return array
    if origin in (dict, Mapping) or hint in (dict,):
        return {"type": "object"}
    raise TypeError(f"cannot derive a JSON schema from type hint {hint!r}")


def _signature_schema(fn: Callable[..., Any]) -> tuple[dict[str, Any], str | None]:
    """Schema of ``fn``'s parameters, and the name of its ``ToolContext`` parameter if any."""
    hints = typing.get_type_hints(fn, include_extras=True)
    properties: dict[str, Any] = {}
    required: list[str] = []
    context_param: str | None = None
    for name, param in inspect.signature(fn).parameters.items():
        hint = hints.get(name, Any)
        if hint is ToolContext:
            context_param = name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool function {fn.__name__} cannot take *args or **kwargs")
        properties[name] = _hint_schema(hint)
        if param.default is inspect.Parameter.empty:
            required.append(name)
        else:
            properties[name]["default"] = param.default
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    schema["additionalProperties"] = False
    return schema, context_param


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    return inspect.cleandoc(doc).split("\n\n", 1)[0].replace("\n", " ").strip()


def _from_function(
    fn: Callable[..., Awaitable[Any]],
    *,
    name: str | None,
    description: str | None,
    parameters: Mapping[str, Any] | None,
    execution_mode: ExecutionMode,
    concurrency_key: Callable[[Mapping[str, Any]], Any] | None,
    requires_approval: ApprovalRule = False,
) -> Tool:
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"tool function {getattr(fn, '__name__', fn)!r} must be `async def`")
    derived, context_param = _signature_schema(fn)

    async def handler(arguments: Mapping[str, Any], context: ToolContext) -> ToolResult | str:
        if context_param is None:
            result = await fn(**arguments)
        else:
            kwargs = dict(arguments)
            kwargs[context_param] = context
            result = await fn(**kwargs)
        if type(result) is str or isinstance(result, ToolResult):
            return result
        try:  # strict JSON: no NaN, and no str() of what JSON cannot hold
            return json.dumps(result, ensure_ascii=False, allow_nan=False, default=json_default)
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidToolResult(
                f"the tool returned {type(result).__name__}, which is not JSON ({exc})"
            ) from None

    return Tool(
        name=name or fn.__name__,
        description=description if description is not None else _first_paragraph(fn.__doc__),
        parameters=parameters if parameters is not None else derived,
        handler=handler,
        execution_mode=execution_mode,
        concurrency_key=concurrency_key,
        requires_approval=requires_approval,
    )


@overload
def tool(fn: Callable[..., Awaitable[Any]], /) -> Tool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    execution_mode: ExecutionMode = "parallel",
    concurrency_key: Callable[[Mapping[str, Any]], Any] | None = None,
    requires_approval: ApprovalRule = False,
) -> Callable[[Callable[..., Awaitable[Any]]], Tool]: ...
def tool(
    fn: Callable[..., Awaitable[Any]] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    execution_mode: ExecutionMode = "parallel",
    concurrency_key: Callable[[Mapping[str, Any]], Any] | None = None,
    requires_approval: ApprovalRule = False,
) -> Tool | Callable[[Callable[..., Awaitable[Any]]], Tool]:
    """Make a ``Tool`` from an async function; name and description come from the function.

    Use bare (``@tool``) or with options (``@tool(execution_mode="exclusive")``). A parameter
    annotated ``ToolContext`` receives the call's context and is not part of the schema.
    ``requires_approval=True`` (or a predicate of the arguments) makes each call wait for a
    person's decision (``agent.approve`` / ``agent.deny``). A
    non-string, non-``ToolResult`` return value is sent to the model as JSON; one that JSON
    cannot hold (bytes, a set, an object, NaN) is the call's ``TOOL_ERROR``.
    """

    def wrap(f: Callable[..., Awaitable[Any]]) -> Tool:
        return _from_function(
            f,
            name=name,
            description=description,
            parameters=parameters,
            execution_mode=execution_mode,
            concurrency_key=concurrency_key,
            requires_approval=requires_approval,
        )

    return wrap(fn) if fn is not None else wrap
