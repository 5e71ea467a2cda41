"""The model-adapter seam: normalised chunks, failures, requests and prepared calls.

Every provider stream is normalised to these chunks::

    block-start | text-delta | reasoning-delta | tool-call-delta | block-end | usage | finish

``finish`` is ``stop | tool-calls | max-tokens | aborted | error``; an ``error`` finish carries a
``Failure`` with a code (``HTTP_429``, ``HTTP_5XX``, ``BAD_STREAM``, ...). A block's ``index``
is its position within the attempt. A tool-call block is *complete* when its ``block-end``
arrived, or when the stream finished normally (``stop``/``tool-calls``); on a ``max-tokens``
finish an unended
tool call was cut and is dropped.

An adapter's ``prepare_call(config)`` resolves defaults (reasoning effort, max tokens), declares the
route's ``context_window`` and ``system_prompt_update`` mode, and returns a ``PreparedCall`` whose
``stream(request)`` yields chunks. Failures before streaming raise ``ModelError``; failures while
streaming are yielded as an ``error`` finish (raising ``ModelError`` from the iterator also works).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, ClassVar, Final, Literal, Protocol, final, runtime_checkable

import attrs

from .._errors import AgentLoopError
from .._frozen import FrozenDict, freeze
from .._slots import slot_constructor

__all__ = [
    "TRANSIENT_CODES",
    "BlockEnd",
    "BlockStart",
    "Chunk",
    "Failure",
    "Finish",
    "ModelAdapter",
    "ModelError",
    "ModelRequest",
    "PreparedCall",
    "ReasoningDelta",
    "TextDelta",
    "ToolCallDelta",
    "Usage",
    "UsageChunk",
]

FinishReason = Literal["stop", "tool-calls", "max-tokens", "aborted", "error"]
BlockKind = Literal["text", "reasoning", "tool-call"]
SystemPromptUpdate = Literal["in-history"] | None

#: Failure codes the default retry policy retries (docs/design.md#retry-policy).
TRANSIENT_CODES: Final = frozenset({"HTTP_429", "HTTP_5XX", "TIMEOUT", "CONNECTION", "STREAM_CUT"})


@final
@attrs.frozen(slots=True)
class Failure:
    """A normalised model-call failure."""

    code: str
    """Stable code: ``HTTP_429``, ``HTTP_5XX``, ``HTTP_4XX``, ``AUTH``, ``TIMEOUT``, ..."""
    message: str
    """Human-readable message (the provider's message when it sent one)."""
    status: int | None = None
    """HTTP status, when there was one."""
    retry_after: float | None = None
    """Seconds the provider asked to wait (``Retry-After``), when given."""

    def to_data(self) -> dict[str, Any]:
        """The JSON form stored in events: ``{code, message, status?, retry_after?}``."""
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.status is not None:
            out["status"] = self.status
        if self.retry_after is not None:
            out["retry_after"] = self.retry_after
        return out


class ModelError(AgentLoopError):
    """A model call failed; ``failure`` holds the normalised failure."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message, code=failure.code)
        self.failure = failure


@final
@attrs.frozen(slots=True)
class Usage:
    """Token usage of one model call, or summed over the calls of a turn (``TurnResult``)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int | None = None
    reasoning_tokens: int | None = None
    requests: int = 1
    """Model calls counted (one for an adapter's record; not stored in events)."""

    def to_data(self) -> dict[str, int]:
        """JSON form: ``{input_tokens, output_tokens, cache_read_tokens?, reasoning_tokens?}``."""
        out = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}
        if self.cache_read_tokens is not None:
            out["cache_read_tokens"] = self.cache_read_tokens
        if self.reasoning_tokens is not None:
            out["reasoning_tokens"] = self.reasoning_tokens
        return out


@final
@attrs.frozen(slots=True)
class BlockStart:
    """A content block opens at ``index``."""

    type: ClassVar[str] = "block-start"
    index: int
    kind: BlockKind
    call_id: str | None = None
    """Tool calls: the provider's call id."""
    name: str | None = None
    """Tool calls: the tool name."""


@final
@attrs.frozen(slots=True)
class TextDelta:
    """Text appended to block ``index``."""

    type: ClassVar[str] = "text-delta"
    index: int
    text: str


@final
@attrs.frozen(slots=True)
class ReasoningDelta:
    """Reasoning text appended to block ``index``."""

    type: ClassVar[str] = "reasoning-delta"
    index: int
    text: str


@final
@attrs.frozen(slots=True)
class ToolCallDelta:
    """Raw JSON argument text appended to tool-call block ``index``."""

    type: ClassVar[str] = "tool-call-delta"
    index: int
    arguments: str


@final
@attrs.frozen(slots=True)
class BlockEnd:
    """Block ``index`` is complete; ``metadata`` is opaque provider data kept on the block."""

    type: ClassVar[str] = "block-end"
    index: int
    metadata: Mapping[str, Any] | None = None


@final
@attrs.frozen(slots=True)
class UsageChunk:
    """Token usage (may arrive before or after the finish)."""

    type: ClassVar[str] = "usage"
    usage: Usage


@final
@attrs.frozen(slots=True)
class Finish:
    """The model finished; ``failure`` is set exactly when ``reason == "error"``."""

    type: ClassVar[str] = "finish"
    reason: FinishReason
    stop_reason: str | None = None
    """The provider's own finish reason (``end_turn``, ``content_filter``, ...)."""
    failure: Failure | None = None
    model: str | None = attrs.field(default=None, eq=False)
    """The model that answered, as the provider named it (``None``: not reported)."""
    response_id: str | None = attrs.field(default=None, eq=False)
    """The provider's id of the response (``chatcmpl-…``, ``msg_…``; ``None``: not reported).

    ``model`` and ``response_id`` describe the response, not its outcome: they are left out of
    equality, so two finishes with the same reason and failure compare equal."""


Chunk = BlockStart | TextDelta | ReasoningDelta | ToolCallDelta | BlockEnd | UsageChunk | Finish


def _freeze_mapping(value: Mapping[str, Any]) -> FrozenDict:
    return freeze(value)  # type: ignore[no-any-return]


def _freeze_tuple(value: Sequence[Any]) -> Sequence[Any]:
    return value if type(value) is tuple else tuple(value)


@final
@attrs.frozen(slots=True)
class ModelRequest:
    """What one model attempt is asked: ``{**config, messages, tools}``, frozen.

    ``messages`` are derived messages (``role`` + ``content`` blocks,
    docs/design.md#derived-history) in log order,
    system nodes included; there is no separate system field. ``tools`` are
    ``{name, description, parameters}`` schemas.
    """

    config: FrozenDict = attrs.field(converter=_freeze_mapping)
    messages: Sequence[FrozenDict]
    tools: tuple[FrozenDict, ...] = attrs.field(default=(), converter=_freeze_tuple)

    @property
    def provider(self) -> str:
        """The provider (route) name."""
        return str(self.config.get("provider", ""))

    @property
    def model(self) -> str:
        """The model name."""
        return str(self.config.get("model", ""))

    @property
    def reasoning_effort(self) -> str | None:
        """Reasoning effort, when set."""
        value = self.config.get("reasoning_effort")
        return None if value is None else str(value)

    @property
    def max_tokens(self) -> int | None:
        """Output-token cap, when set."""
        value = self.config.get("max_tokens")
        return None if value is None else int(value)


# Constructors of frozen classes built on hot paths: they write the slots directly (half the
# cost of ``object.__setattr__``), from parts that are already frozen; see ``_slots``.
make_request: Final[
    Callable[[FrozenDict, Sequence[FrozenDict], tuple[FrozenDict, ...]], ModelRequest]
] = slot_constructor(ModelRequest)
"""Build a ``ModelRequest`` from parts that are already frozen (the driver's hot path)."""
make_tool_call_start: Final[Callable[[int, str, str], BlockStart]] = slot_constructor(
    BlockStart, ("index", "call_id", "name"), fixed={"kind": "tool-call"}
)
"""Build the ``BlockStart`` of a tool call (the adapters' hot path)."""
make_usage: Final[Callable[[int, int], Usage]] = slot_constructor(
    Usage, ("input_tokens", "output_tokens")
)
"""Build a ``Usage`` with just the two token counts (the adapters' hot path)."""


StreamFn = Callable[[ModelRequest], AsyncIterator[Chunk]]


@final
@attrs.frozen(slots=True)
class PreparedCall:
    """A route resolved by ``prepare_call``: effective config, declared capabilities, stream."""

    config: FrozenDict = attrs.field(converter=_freeze_mapping)
    """The effective request config (explicit fields plus adapter defaults)."""
    stream_fn: StreamFn
    """``stream_fn(request)`` yields the attempt's chunks."""
    adapter_defaults: FrozenDict = attrs.field(factory=FrozenDict, converter=_freeze_mapping)
    """Config fields the adapter filled in (recorded in the header, dropped before the next
    ``agent/request`` so the route resolves them again)."""
    context_window: int | None = None
    system_prompt_update: SystemPromptUpdate = None

    def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        """Stream one attempt of ``request``."""
        return self.stream_fn(request)


@runtime_checkable
class ModelAdapter(Protocol):
    """A provider adapter (``openai``, ``anthropic``, ``scripted``, or your own)."""

    async def prepare_call(self, config: Mapping[str, Any]) -> PreparedCall:
        """Resolve ``config`` for this route.

        Raises:
            ModelError: the config is unusable (missing key → ``AUTH``, bad option, ...).
        """
        ...

    async def aclose(self) -> None:
        """Release pooled connections (called when the runtime closes)."""
        ...
