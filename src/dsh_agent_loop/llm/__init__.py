"""Model adapters, for people who write or wrap one: the seam and the built-in adapters.

The request a step sends (``ModelRequest``, built by ``make_request``), the chunks an adapter
streams back (``BlockStart``, ``TextDelta``, ``ReasoningDelta``, ``ToolCallDelta``, ``BlockEnd``,
``UsageChunk``, ``Finish``), ``Usage``, ``Failure``/``ModelError`` and their codes, the
``ModelAdapter`` protocol with its ``PreparedCall``; the built-in adapters (``OpenAIAdapter``
for OpenAI-compatible chat completions: DeepSeek, OpenAI, vLLM, Ollama, llama.cpp;
``AnthropicAdapter`` for the Messages API; ``ScriptedModel`` with ``Reply`` for tests and
simulations), ``ModelRouter``, the model table, ``StreamLimits``, the SSE parser and the
``Assembler`` that folds chunks into a message. The modules behind this face are internal.
"""

from __future__ import annotations

from ._anthropic import AnthropicAdapter as AnthropicAdapter
from ._anthropic import AnthropicStreamDecoder as AnthropicStreamDecoder
from ._assemble import FOLD_CHUNK as FOLD_CHUNK
from ._assemble import Assembler as Assembler
from ._base import TRANSIENT_CODES as TRANSIENT_CODES
from ._base import BlockEnd as BlockEnd
from ._base import BlockStart as BlockStart
from ._base import Chunk as Chunk
from ._base import Failure as Failure
from ._base import Finish as Finish
from ._base import ModelAdapter as ModelAdapter
from ._base import ModelError as ModelError
from ._base import ModelRequest as ModelRequest
from ._base import PreparedCall as PreparedCall
from ._base import ReasoningDelta as ReasoningDelta
from ._base import TextDelta as TextDelta
from ._base import ToolCallDelta as ToolCallDelta
from ._base import Usage as Usage
from ._base import UsageChunk as UsageChunk
from ._base import make_request as make_request
from ._models import BUILTIN_MODELS as BUILTIN_MODELS
from ._models import REASONING_REPLAY_MODES as REASONING_REPLAY_MODES
from ._models import ModelInfo as ModelInfo
from ._models import ReasoningReplay as ReasoningReplay
from ._models import lookup_model as lookup_model
from ._models import resolve_model as resolve_model
from ._openai import OpenAIAdapter as OpenAIAdapter
from ._openai import OpenAIStreamDecoder as OpenAIStreamDecoder
from ._router import ModelRouter as ModelRouter
from ._scripted import Reply as Reply
from ._scripted import ScriptedModel as ScriptedModel
from ._sse import SSEEvent as SSEEvent
from ._sse import SSELimitError as SSELimitError
from ._sse import SSEParser as SSEParser
from ._stream_limits import DEFAULT_STREAM_LIMITS as DEFAULT_STREAM_LIMITS
from ._stream_limits import StreamLimits as StreamLimits

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_STREAM_LIMITS",
    "FOLD_CHUNK",
    "REASONING_REPLAY_MODES",
    "TRANSIENT_CODES",
    "AnthropicAdapter",
    "AnthropicStreamDecoder",
    "Assembler",
    "BlockEnd",
    "BlockStart",
    "Chunk",
    "Failure",
    "Finish",
    "ModelAdapter",
    "ModelError",
    "ModelInfo",
    "ModelRequest",
    "ModelRouter",
    "OpenAIAdapter",
    "OpenAIStreamDecoder",
    "PreparedCall",
    "ReasoningDelta",
    "ReasoningReplay",
    "Reply",
    "SSEEvent",
    "SSELimitError",
    "SSEParser",
    "ScriptedModel",
    "StreamLimits",
    "TextDelta",
    "ToolCallDelta",
    "Usage",
    "UsageChunk",
    "lookup_model",
    "make_request",
    "resolve_model",
]
