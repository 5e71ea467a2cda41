"""Error types: every error the library raises carries a stable ``code``."""

from __future__ import annotations

__all__ = [
    "AgentAlreadyExistsError",
    "AgentClosedError",
    "AgentLoopError",
    "ConfigError",
    "InvalidOptionError",
    "SequenceConflictError",
    "SessionAlreadyExistsError",
    "SessionAlreadyOwnedError",
    "SessionNotFoundError",
    "SessionOwnershipLostError",
    "StoreError",
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


class AgentAlreadyExistsError(AgentLoopError):
    """An agent with this id is already live in the runtime."""

    code = "AGENT_ALREADY_EXISTS"


class AgentClosedError(AgentLoopError):
    """The agent is disposed (or being disposed): it takes no more messages."""

    code = "AGENT_CLOSED"


class StoreError(AgentLoopError):
    """Base of session-store errors."""

    code = "STORE_FAILED"


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
