"""Per-request decisions: pre-step, retry, and the request records.

Pre-step decisions and retry requests (docs/design.md#step-inputs), the default retry policy
(docs/design.md#retry-policy), and which ``request/header`` / ``request/context`` records a
request writes (docs/design.md#request-records).
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal, final

import attrs

from .._frozen import FrozenDict
from ..llm import TRANSIENT_CODES, Failure, PreparedCall

__all__ = [
    "MAX_ATTEMPTS",
    "PreStepDecision",
    "Retry",
    "context_record",
    "default_retry_delay",
    "header_reason",
]

#: Attempts per step, the first included (docs/design.md#retry-policy).
MAX_ATTEMPTS: Final = 5
#: Cap on a provider's ``Retry-After``.
MAX_RETRY_AFTER: Final = 60.0


def _to_tuple(value: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(value)


@final
@attrs.frozen
class PreStepDecision:
    """What ``agent/pre-step`` decides: enter the step with messages, or reject the turn."""

    kind: Literal["enter", "reject"]
    messages: tuple[Any, ...] = attrs.field(default=(), converter=_to_tuple)
    starts_request_series: bool = False
    reason: str | None = None

    @classmethod
    def enter(cls, messages: Sequence[Any], starts_request_series: bool = False) -> PreStepDecision:
        """Enter the step with ``messages`` (the user messages to admit)."""
        return cls("enter", tuple(messages), starts_request_series)

    @classmethod
    def reject(cls, reason: str = "") -> PreStepDecision:
        """End the turn ``blocked`` without a step."""
        return cls("reject", reason=reason)


@final
@attrs.frozen
class Retry:
    """Returned by an ``agent/request-error`` listener to retry after ``delay`` seconds."""

    delay: float = 0.0


def retry_after_seconds(value: str | float | None, now: float | None = None) -> float | None:
    """Parse ``Retry-After`` (seconds or an HTTP date) into seconds, capped at 60."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return max(0.0, min(MAX_RETRY_AFTER, float(value)))
    text = value.strip()
    try:
        return max(0.0, min(MAX_RETRY_AFTER, float(text)))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError):
        return None
    now = time.time() if now is None else now
    return max(0.0, min(MAX_RETRY_AFTER, when - now))


def default_retry_delay(failure: Failure, attempt: int, rng: random.Random) -> float | None:
    """Delay before attempt ``attempt + 1`` under the default policy, or None: do not retry.

    Transient codes only, at most ``MAX_ATTEMPTS`` attempts. ``Retry-After`` (capped at 60 s) when
    given, else ``min(8, 0.5 * 2**(attempt-1)) * (1 + 0.25 * u)`` with ``u`` from ``rng``.
    """
    if failure.code not in TRANSIENT_CODES or attempt >= MAX_ATTEMPTS:
        return None
    if failure.retry_after is not None:
        return min(MAX_RETRY_AFTER, max(0.0, float(failure.retry_after)))
    return min(8.0, 0.5 * 2.0 ** (attempt - 1)) * (1 + 0.25 * rng.random())


def header_record(
    config: Mapping[str, Any], prepared: PreparedCall, tools: tuple[FrozenDict, ...]
) -> FrozenDict:
    """The canonical request header ``{config, adapter_defaults?, tools?}``."""
    header: dict[str, Any] = {"config": config}
    if prepared.adapter_defaults:
        header["adapter_defaults"] = prepared.adapter_defaults
    if tools:
        header["tools"] = tools
    return FrozenDict(header)


def header_reason(
    previous: FrozenDict | None,
    header: FrozenDict,
    *,
    first_request: bool,
    new_series: bool,
) -> str | None:
    """Which ``request/header`` reason this request writes, or None (it inherits)."""
    if first_request:
        return "initial" if previous is None else "resume"
    if previous != header:
        return "change"
    return "series" if new_series else None


def context_record(prepared: PreparedCall, previous: FrozenDict | None) -> FrozenDict | None:
    """The ``request/context`` data to write, or None when nothing differs from ``previous``."""
    record: dict[str, Any] = {
        "provider": prepared.config.get("provider"),
        "model": prepared.config.get("model"),
    }
    if prepared.context_window is not None:
        record["context_window"] = prepared.context_window
    if prepared.system_prompt_update is not None:
        record["system_prompt_update"] = prepared.system_prompt_update
    frozen = FrozenDict(record)
    return None if previous == frozen else frozen
