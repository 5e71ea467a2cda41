"""The seeded replies of ``dsh-agent simulate``: ``SimScript`` and its tool, ``sim_tool``."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final, final

from .._frozen import FrozenDict
from .._tools.base import tool
from ..llm import ModelRequest, Reply
from ._render import message_text

__all__ = ["REPLY_WORDS", "TEXT_REPLIES", "SimScript", "sim_tool"]

#: Words a simulated text reply draws from.
_VOCABULARY: Final = ("append", "cancel", "commit", "event", "flush", "inbox", "turn", "step")
#: Words in a simulated text reply.
REPLY_WORDS: Final = 8
#: Distinct text replies a simulation draws from (each built on first use, then reused).
TEXT_REPLIES: Final = 1024


@tool
async def sim_tool(n: int = 0) -> str:
    """Simulation tool: answer ``ok <n>`` at once."""
    return f"ok {n}"


@final
class SimScript:
    """Seeded replies: ``tools`` tool-call steps per turn, then a text reply.

    Each reply is drawn from a BLAKE2b digest of ``(seed, prompt, step)``: the same inputs give
    the same reply in any run, at a few µs per reply (seeding a ``random.Random`` from a string
    costs more than the rest of a simulated step). Replies are built once and reused: a
    ``Reply`` is immutable, names no call id, and keeps the chunks its streams give (built on
    its first stream). A tool-call reply is one of ``1,000`` argument values; a text reply is
    one of ``TEXT_REPLIES`` texts of ``REPLY_WORDS`` words, each drawn from the digest of
    ``(seed, text number)``. Building a new text reply and its chunks for every turn cost more
    than a tenth of a simulated turn.
    """

    def __init__(self, seed: int, tools: int) -> None:
        self.seed = seed
        self.tools = tools
        self._calls: dict[int, Reply] = {}
        self._texts: dict[int, Reply] = {}

    def reply(self, request: ModelRequest) -> Reply:
        """The reply to ``request``, decided by the turn's prompt and the step within it."""
        step = 0
        last_user: Mapping[str, Any] | None = None
        for message in request.messages:  # a few messages: forwards is cheaper than reversed()
            role = message["role"]
            if role == "assistant":
                step += 1
            elif role == "user":
                last_user = message
                step = 0
        prompt = _prompt_text(last_user) if last_user is not None else ""
        digest = hashlib.blake2b(f"{self.seed}|{prompt}|{step}".encode(), digest_size=16).digest()
        if step < self.tools:
            n = int.from_bytes(digest[:4], "little") % 1000
            reply = self._calls.get(n)
            if reply is None:
                reply = self._calls[n] = Reply.tool_calls((sim_tool.name, {"n": n}))
            return reply
        k = int.from_bytes(digest[4:8], "little") % TEXT_REPLIES
        reply = self._texts.get(k)
        if reply is None:
            reply = self._texts[k] = Reply.text(self._text(k))
        return reply

    def _text(self, k: int) -> str:
        """Text reply number ``k``: ``REPLY_WORDS`` words drawn from ``(seed, k)``."""
        digest = hashlib.blake2b(f"{self.seed}|text|{k}".encode(), digest_size=16).digest()
        words = len(_VOCABULARY)
        return " ".join(_VOCABULARY[b % words] for b in digest[:REPLY_WORDS])


def _prompt_text(message: Mapping[str, Any]) -> str:
    """The text of a user message: its one text block's, else ``message_text``'s."""
    content = message.get("content")
    if type(content) is tuple and len(content) == 1:
        block = content[0]
        if type(block) is FrozenDict and block.get("type") == "text":
            text = block.get("text")
            if type(text) is str:
                return text
    return message_text(message)
