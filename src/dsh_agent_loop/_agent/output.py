"""Structured output: a turn that must end with a ``final_result`` tool call.

See docs/design.md#structured-output.

A caller registers an output type for a pending message (``run(..., output_type=...)``,
``_agent/calls.py``); the turn that claims that message is a structured-output turn. Its requests
offer one more tool, ``final_result``, whose parameters are the type's JSON schema (an object type
as is, anything else wrapped as ``{"result": ...}``). The call runs through the ordinary tool
pipeline, so it is logged as a ``tool/call`` + ``tool/result`` pair like any other: the schema
check (fastjsonschema, in ``parse_arguments``) and the cattrs structuring both turn bad arguments
into an ``INVALID_ARGUMENTS`` result the model reads; a valid call keeps the value and concludes
the turn (``turn/end`` completed, no further request).

A step is a failed try when it has no valid ``final_result`` call and either called
``final_result`` badly or called no tool at all (a plain-text answer; it gets one steer message
asking for the tool, appended to ``next-step`` so the log shows it). Steps that only call other
tools are work, not tries. After ``retries`` retries (``retries + 1`` failed tries, as in
pydantic-ai) the turn fails ``NO_STRUCTURED_OUTPUT``.

Registrations and values live in memory on the agent's ``OutputRegistry``: a resumed session
knows nothing of them, and a turn without a registered message pays one ``is None`` test.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import types
import typing
from collections.abc import Mapping, MutableMapping, MutableSequence, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, Final, Literal, NotRequired, Required, final

import attrs
import cattrs
from cattrs.preconf.json import make_converter

from .._errors import AgentLoopError
from .._frozen import FrozenDict, thaw
from .._session.projections import NEXT_STEP
from .._tools.base import ArgumentsError, Tool, ToolContext, ToolResult

if TYPE_CHECKING:
    from .._session.projections import InboxProjection
    from .inbox import Inbox

__all__ = [
    "FINAL_RESULT",
    "STEER_TEXT",
    "NoStructuredOutputError",
    "OutputRegistry",
    "OutputSpec",
    "OutputState",
    "SchemaOutput",
    "output_schema",
]

#: The name of the tool that carries a structured answer.
FINAL_RESULT: Final = "final_result"
#: The steer a plain-text answer gets in a structured-output turn.
STEER_TEXT: Final = (
    f"Give your answer by calling the `{FINAL_RESULT}` tool, with the result as its arguments; "
    "a plain-text answer cannot be used."
)
STEER_SOURCE: Final = "structured-output"
_DESCRIPTION: Final = (
    "Give the final result of this task. Call it exactly once, when you have the answer; "
    "its arguments are the result."
)
_SIMPLE: Final[Mapping[Any, Mapping[str, Any]]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    Any: {},
}
_ARRAYS: Final = (list, tuple, set, frozenset, Sequence, MutableSequence, AbstractSet)


@final
class NoStructuredOutputError(AgentLoopError):
    """The model gave no valid ``final_result`` call within the allowed tries."""

    code = "NO_STRUCTURED_OUTPUT"


# --- JSON schema of a type ----------------------------------------------------------------------


def _is_class_type(tp: Any) -> bool:
    """An attrs class, a dataclass or a TypedDict: a JSON object with named fields."""
    return isinstance(tp, type) and (
        attrs.has(tp) or dataclasses.is_dataclass(tp) or typing.is_typeddict(tp)
    )


def _first_paragraph(tp: Any) -> str:
    if not isinstance(tp, type):
        return ""
    doc = tp.__dict__.get("__doc__")
    if not doc or (dataclasses.is_dataclass(tp) and doc.startswith(f"{tp.__name__}(")):
        return ""  # none, or the signature a dataclass writes for itself
    return inspect.cleandoc(doc).split("\n\n", 1)[0].replace("\n", " ").strip()


class _SchemaBuilder:
    """Builds an inline JSON schema; refuses recursive and non-JSON types with ``TypeError``."""

    def __init__(self) -> None:
        self._open: list[type] = []

    def schema(self, tp: Any) -> dict[str, Any]:
        if tp in _SIMPLE:
            return dict(_SIMPLE[tp])
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is typing.Annotated:
            schema = self.schema(args[0])
            for extra in args[1:]:
                if isinstance(extra, str):
                    schema["description"] = extra
            return schema
        if origin is Literal:
            return {"enum": list(args)}
        if origin in (typing.Union, types.UnionType):
            return {"anyOf": [self.schema(a) for a in args]}
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return {"enum": [member.value for member in tp]}
        if origin in _ARRAYS or tp in _ARRAYS:
            return self._array(origin or tp, args)
        if origin in (dict, Mapping, MutableMapping) or tp is dict:
            if args and args[0] is not str:
                raise TypeError(f"JSON object keys are strings: {tp!r} cannot be an output type")
            values = self.schema(args[1]) if args else {}
            return {"type": "object", "additionalProperties": values}
        if _is_class_type(tp):
            return self._object(tp)
        raise TypeError(f"{tp!r} is not a JSON-compatible output type")

    def _array(self, kind: Any, args: tuple[Any, ...]) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "array"}
        if kind is tuple and args and args[-1] is not Ellipsis:  # a fixed-length tuple
            schema["items"] = [self.schema(a) for a in args]
            schema["minItems"] = schema["maxItems"] = len(args)
        elif args:
            schema["items"] = self.schema(args[0])
        if kind in (set, frozenset, AbstractSet):
            schema["uniqueItems"] = True
        return schema

    def _object(self, cls: type) -> dict[str, Any]:
        if cls in self._open:
            raise TypeError(f"{cls.__name__} is recursive: not supported as an output type")
        self._open.append(cls)
        try:
            hints = typing.get_type_hints(cls, include_extras=True)
            properties: dict[str, Any] = {}
            required: list[str] = []
            for name, hint, needed in _fields(cls, hints):
                properties[name] = self.schema(hint)
                if needed:
                    required.append(name)
        finally:
            self._open.pop()
        schema: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            schema["required"] = required
        schema["additionalProperties"] = False
        description = _first_paragraph(cls)
        if description:
            schema["description"] = description
        return schema


def _fields(cls: type, hints: Mapping[str, Any]) -> list[tuple[str, Any, bool]]:
    """``(key, type, required)`` of each field the structured value is built from."""
    if attrs.has(cls):
        return [
            (a.name, hints.get(a.name, a.type), a.default is attrs.NOTHING)
            for a in attrs.fields(cls)
            if a.init
        ]
    if dataclasses.is_dataclass(cls):
        missing = dataclasses.MISSING
        return [
            (
                f.name,
                hints.get(f.name, f.type),
                f.default is missing and f.default_factory is missing,
            )
            for f in dataclasses.fields(cls)
            if f.init
        ]
    out = []
    for name, hint in hints.items():  # a TypedDict
        needed = name in cls.__required_keys__  # type: ignore[attr-defined]  # TypedDict only
        if needed and typing.get_origin(hint) is NotRequired:  # what cattrs would require
            raise TypeError(
                f"{cls.__name__}.{name}: this Python cannot see NotRequired in a class body "
                "under `from __future__ import annotations`; use TypedDict's functional form"
            )
        while typing.get_origin(hint) in (Required, NotRequired):
            hint = typing.get_args(hint)[0]
        out.append((name, hint, needed))
    return out


def output_schema(output_type: Any) -> tuple[dict[str, Any], bool]:
    """The ``final_result`` parameters for ``output_type``, and whether the value is wrapped.

    An attrs class, dataclass or TypedDict is the arguments object itself; any other type is
    wrapped as ``{"result": <schema>}``.

    Raises:
        TypeError: the type has no JSON schema (not JSON-compatible, or recursive).
    """
    schema = _SchemaBuilder().schema(output_type)
    if _is_class_type(output_type):
        return schema, False
    wrapped = {
        "type": "object",
        "properties": {"result": schema},
        "required": ["result"],
        "additionalProperties": False,
    }
    return wrapped, True


# --- registrations and the per-turn state -------------------------------------------------------


def _problem(exc: BaseException) -> str:
    """A readable account of a structuring failure (cattrs' paths, the cause's own words)."""

    def describe(error: BaseException, tp: Any) -> str:
        text = cattrs.v.format_exception(error, tp)
        detail = str(error)
        if isinstance(error, KeyError) or not detail or detail in text:
            return text
        return f"{text} ({detail})"

    try:
        return "; ".join(cattrs.transform_error(exc, format_exception=describe))
    except Exception:  # not a cattrs error shape: its own words
        return f"{type(exc).__name__}: {exc}"


@final
@attrs.frozen(eq=False)
class SchemaOutput:
    """An output type known only by its ``final_result`` schema (a fleet client's type).

    The worker that runs the turn has the schema, not the caller's Python type: the tool checks
    the arguments against the schema and keeps them as plain data; the client structures them
    into its type (``fleet/_follow.py``).
    """

    parameters: Mapping[str, Any]
    """The ``final_result`` parameters (``output_schema``'s first value)."""
    wrapped: bool
    """The value is ``arguments["result"]``."""


@final
@attrs.frozen
class OutputSpec:
    """What one structured-output turn must produce: its ``final_result`` tool and retries."""

    output_type: Any
    tool: Tool
    retries: int
    """Retries after a failed try; the turn fails at try ``retries + 1``."""


def _plain(raw: Any, _type: Any) -> Any:
    """A ``SchemaOutput`` value: the checked arguments as plain data."""
    return thaw(raw)


@final
class OutputRegistry:
    """One agent's structured-output registrations (by message id) and values (by turn)."""

    __slots__ = ("_converter", "_tools", "carried", "specs", "values")

    def __init__(self) -> None:
        self.specs: dict[str, OutputSpec] = {}
        """Pending messages whose turn must produce structured output."""
        self.carried: OutputState | None = None
        """The output a turn that ended awaiting approval still owes: its continuation's."""
        self.values: dict[int, Any] = {}
        """Structured values by turn number, until taken."""
        self._tools: dict[Any, Tool] = {}
        self._converter = make_converter()

    def expect(self, message_id: str, output_type: Any, retries: int) -> None:
        """Register that the turn claiming ``message_id`` must produce ``output_type``.

        Raises:
            TypeError: ``output_type`` has no JSON schema or cattrs cannot structure it.
            ValueError: ``retries`` is negative.
        """
        if retries < 0:
            raise ValueError(f"output_retries must be >= 0, got {retries}")
        self.specs[message_id] = OutputSpec(output_type, self._tool(output_type), retries)

    def _tool(self, output_type: Any) -> Tool:
        try:
            found = self._tools.get(output_type)
        except TypeError:  # an unhashable type expression: build it each time
            found = None
        if found is not None:
            return found
        tool = self._make_tool(output_type)
        try:
            self._tools[output_type] = tool
        except TypeError:
            pass
        return tool

    def _make_tool(self, output_type: Any) -> Tool:
        structure_hook: Any
        if isinstance(output_type, SchemaOutput):
            parameters, wrapped = dict(output_type.parameters), output_type.wrapped
            structure_hook = _plain
        else:
            parameters, wrapped = output_schema(output_type)
            try:
                structure_hook = self._converter.get_structure_hook(output_type)
            except Exception as exc:  # cattrs refuses the type (an ambiguous union, ...)
                raise TypeError(f"cattrs cannot structure {output_type!r}: {exc}") from exc
        values = self.values

        async def handler(arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
            raw = arguments["result"] if wrapped else arguments
            try:
                value = structure_hook(raw, output_type)
            except Exception as exc:  # the model's arguments, not the loop's failure
                text = f"Error: invalid arguments for {FINAL_RESULT}: {_problem(exc)}"
                return ToolResult(text, error="INVALID_ARGUMENTS")
            values.setdefault(context.turn, value)  # the first valid call wins
            return ToolResult("ok", concludes_turn=True)

        if isinstance(output_type, SchemaOutput):
            about = str(output_type.parameters.get("description", ""))
        else:
            about = _first_paragraph(output_type)
        description = " ".join(filter(None, (_DESCRIPTION, about)))
        tool = Tool(FINAL_RESULT, description, parameters, handler)
        try:
            tool.validate({})  # compile the schema now (a bad one is the caller's error)
        except ArgumentsError:
            pass
        return tool

    def claim(
        self, turn: int, claimed: Sequence[FrozenDict], pending: InboxProjection
    ) -> OutputState | None:
        """The output state of turn ``turn`` if a claimed message was registered, else None.

        Registrations whose message is no longer pending (removed, cleared) are dropped here.
        """
        specs = self.specs
        if not specs:
            return None
        spec = None
        for message in claimed:
            found = specs.pop(message["id"], None)
            if spec is None:
                spec = found
        for message_id in [m for m in specs if not pending.has_id(m)]:
            del specs[message_id]
        return None if spec is None else OutputState(self, turn, spec)

    def carry(self, state: OutputState) -> None:
        """A turn ended awaiting approval before it produced its output: its continuation must."""
        self.carried = None if state.done else state

    def resume(self, turn: int) -> OutputState | None:
        """The carried output state, now owed by continuation turn ``turn`` (tries counted on)."""
        state, self.carried = self.carried, None
        if state is None:
            return None
        resumed = OutputState(self, turn, state.spec)
        resumed.failures = state.failures
        return resumed

    def take(self, turn: int) -> Any:
        """The structured value of turn ``turn`` (forgotten now), or None."""
        return self.values.pop(turn, None)


@final
class OutputState:
    """One structured-output turn: its offered tool and its failed tries."""

    __slots__ = ("failures", "registry", "spec", "turn")

    def __init__(self, registry: OutputRegistry, turn: int, spec: OutputSpec) -> None:
        self.registry = registry
        self.turn = turn
        self.spec = spec
        self.failures = 0

    @property
    def done(self) -> bool:
        """True once a valid ``final_result`` call gave this turn its value."""
        return self.turn in self.registry.values

    def offer(
        self, tools: dict[str, Tool], schemas: tuple[FrozenDict, ...]
    ) -> tuple[dict[str, Tool], tuple[FrozenDict, ...]]:
        """The step's tools and schemas with ``final_result`` (replacing one of that name)."""
        tool = self.spec.tool
        tools = {**tools, FINAL_RESULT: tool}
        kept = tuple(s for s in schemas if s["name"] != FINAL_RESULT)
        return tools, (*kept, tool.schema)

    def after_step(self, inbox: Inbox, calls: Sequence[FrozenDict]) -> None:
        """Count a failed try; steer after a plain-text answer, or fail the turn.

        Raises:
            NoStructuredOutputError: the tries are used up.
        """
        if self.done:
            return
        if calls and all(c["name"] != FINAL_RESULT for c in calls):
            return  # other tools at work: not a try
        self.failures += 1
        if self.failures > self.spec.retries:
            tries = "try" if self.failures == 1 else "tries"
            raise NoStructuredOutputError(
                f"no valid {FINAL_RESULT} call in {self.failures} {tries} "
                f"(output_retries={self.spec.retries})"
            )
        if not calls:  # a plain-text answer: ask for the tool (the invalid call's result did)
            inbox.insert(STEER_TEXT, NEXT_STEP, source=STEER_SOURCE)
