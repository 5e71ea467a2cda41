"""Error types: every error the library raises carries a stable ``code``."""

from __future__ import annotations

__all__ = [
    "AgentAlreadyExistsError",
    "AgentClosedError",
    "AgentLoopError",
    "ApprovalPendingError",
    "ConfigError",
    "InvalidOptionError",
    "LimitExceededError",
    "SequenceConflictError",
    "SessionAlreadyExistsError",
    "SessionAlreadyOwnedError",
    "SessionNotFoundError",
    "SessionOwnershipLostError",
    "StoreCorruptError",
    "StoreError",
    "SubscriberOverflowError",
]


class AgentLoopError(Exception):
    """Base of the library's errors; ``code`` is stable and machine-readable."""

    code: str = "AGENT_LOOP_ERROR"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        """The human-readable message."""
        return str(self.args[0]) if self.args else ""


class ConfigError(AgentLoopError):
    """Invalid configuration: ``FILE: key.path: message`` (several joined by ``; ``)."""

    code = "CONFIG_INVALID"


class InvalidOptionError(AgentLoopError):
    """An invalid agent option (for example ``max_tokens <= 0``)."""

    code = "INVALID_OPTION"


class LimitExceededError(AgentLoopError):
    """A bound of ``Limits`` was reached (delegation depth, live sub-agents; ``docs/limits.md``)."""

    code = "LIMIT_EXCEEDED"


class AgentAlreadyExistsError(AgentLoopError):
    """An agent with this id is already live in the runtime."""

    code = "AGENT_ALREADY_EXISTS"


class AgentClosedError(AgentLoopError):
    """The agent is disposed (or being disposed): it takes no more messages."""

    code = "AGENT_CLOSED"


class ApprovalPendingError(AgentLoopError):
    """``run()`` refused a message that would wait behind tool calls waiting for a decision.

    Nothing was queued. Decide the calls named by ``call_ids`` first (``approve``/``deny``), or
    pass ``wait_for_approvals=True`` to queue the message behind them
    (``docs/embedding.md#tool-approval``).
    """

    code = "APPROVAL_PENDING"

    def __init__(self, message: str, *, call_ids: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.call_ids = call_ids
        """The ids of the calls waiting for a decision, in model order."""


class SubscriberOverflowError(AgentLoopError):
    """A subscriber fell ``max_buffer`` events behind; ``missed`` events never reached it.

    Raised by the subscription's ``receive()`` once the buffered events are read, in place of
    a clean end of iteration.
    """

    code = "SUBSCRIBER_OVERFLOW"

    def __init__(self, message: str, *, missed: int = 0) -> None:
        super().__init__(message)
        self.missed = missed
        """How many events the subscriber missed (counted until this error was raised)."""


class StoreError(AgentLoopError):
    """Base of session-store errors."""

    code = "STORE_FAILED"


class StoreCorruptError(StoreError):
    """Stored data breaks the log's shape (seqs not dense, an undecodable row).

    The message names the session and the seq.
    """

    code = "STORE_CORRUPT"


class SessionAlreadyExistsError(StoreError):
    """``create`` named a session id that is already taken."""

    code = "SESSION_ALREADY_EXISTS"


class SessionNotFoundError(StoreError):
    """No stored session has this id."""

    code = "SESSION_NOT_FOUND"


class SessionAlreadyOwnedError(StoreError):
    """Another live writer owns the session; ``owner`` describes it when known."""

    code = "SESSION_ALREADY_OWNED"

    def __init__(self, message: str, *, owner: str | None = None) -> None:
        super().__init__(message)
        self.owner = owner


class SessionOwnershipLostError(StoreError):
    """This handle no longer owns its session (lease expired and taken over, or fenced)."""

    code = "OWNERSHIP_LOST"


class SequenceConflictError(StoreError):
    """An append disagrees with what is stored: different content at a stored seq, or a gap."""

    code = "SEQUENCE_CONFLICT"
