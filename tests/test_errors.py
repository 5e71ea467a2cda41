"""Error types (``_errors.py``; turn errors: ``_agent/results.py``): codes and the class tree."""

from __future__ import annotations

import pickle

import pytest

from dsh_agent_loop import _errors as errors
from dsh_agent_loop._agent.results import (
    TurnAbortedError,
    TurnBlockedError,
    TurnError,
    TurnFailedError,
)
from dsh_agent_loop._errors import (
    AgentAlreadyExistsError,
    AgentClosedError,
    AgentLoopError,
    ApprovalPendingError,
    ConfigError,
    InvalidOptionError,
    LimitExceededError,
    SequenceConflictError,
    SessionAlreadyExistsError,
    SessionAlreadyOwnedError,
    SessionNotFoundError,
    SessionOwnershipLostError,
    StoreCorruptError,
    StoreError,
    SubscriberOverflowError,
)

CODES = {
    AgentLoopError: "AGENT_LOOP_ERROR",
    ConfigError: "CONFIG_INVALID",
    InvalidOptionError: "INVALID_OPTION",
    LimitExceededError: "LIMIT_EXCEEDED",
    AgentAlreadyExistsError: "AGENT_ALREADY_EXISTS",
    AgentClosedError: "AGENT_CLOSED",
    ApprovalPendingError: "APPROVAL_PENDING",
    StoreError: "STORE_FAILED",
    SessionAlreadyExistsError: "SESSION_ALREADY_EXISTS",
    SessionNotFoundError: "SESSION_NOT_FOUND",
    SessionAlreadyOwnedError: "SESSION_ALREADY_OWNED",
    SessionOwnershipLostError: "OWNERSHIP_LOST",
    SequenceConflictError: "SEQUENCE_CONFLICT",
    StoreCorruptError: "STORE_CORRUPT",
    SubscriberOverflowError: "SUBSCRIBER_OVERFLOW",
    TurnError: "TURN_ERROR",
    TurnFailedError: "TURN_FAILED",
    TurnBlockedError: "TURN_BLOCKED",
    TurnAbortedError: "TURN_ABORTED",
}

STORE_ERRORS = (
    SessionAlreadyExistsError,
    SessionNotFoundError,
    SessionAlreadyOwnedError,
    SessionOwnershipLostError,
    SequenceConflictError,
    StoreCorruptError,
)


TURN_ERRORS = {TurnError, TurnFailedError, TurnBlockedError, TurnAbortedError}


def test_every_exported_error_has_its_stable_code():
    # the turn errors carry a TurnResult: they live beside it (_agent/results.py)
    assert {getattr(errors, name) for name in errors.__all__} == set(CODES) - TURN_ERRORS
    for cls, code in CODES.items():
        assert cls.code == code
        assert cls("m").code == code


def test_codes_are_distinct():
    assert len(set(CODES.values())) == len(CODES)


@pytest.mark.parametrize("cls", list(CODES))
def test_every_error_is_an_agent_loop_error_and_an_exception(cls):
    assert issubclass(cls, AgentLoopError)
    assert issubclass(cls, Exception)
    with pytest.raises(AgentLoopError):
        raise cls("boom")


def test_store_errors_share_the_store_error_base_and_others_do_not():
    for cls in STORE_ERRORS:
        assert issubclass(cls, StoreError)
    for cls in (ConfigError, InvalidOptionError, AgentAlreadyExistsError, AgentClosedError):
        assert not issubclass(cls, StoreError)
    assert not issubclass(StoreError, tuple(STORE_ERRORS))


def test_message_is_the_first_argument_and_str_shows_it():
    exc = AgentClosedError("agent a1 is disposed")
    assert exc.message == "agent a1 is disposed"
    assert str(exc) == "agent a1 is disposed"
    assert AgentLoopError("").message == ""


def test_message_of_an_error_without_args_is_empty():
    exc = StoreError("x")
    exc.args = ()
    assert exc.message == ""


def test_a_code_given_at_raise_time_overrides_only_that_instance():
    exc = StoreError("disk full", code="STORE_FULL")
    assert exc.code == "STORE_FULL"
    assert StoreError.code == "STORE_FAILED"
    assert StoreError("other").code == "STORE_FAILED"


def test_session_already_owned_carries_its_owner():
    exc = SessionAlreadyOwnedError("taken", owner="host:123")
    assert exc.owner == "host:123"
    assert exc.code == "SESSION_ALREADY_OWNED"
    assert exc.message == "taken"
    assert SessionAlreadyOwnedError("taken").owner is None


def test_errors_survive_pickling_with_their_message():
    back = pickle.loads(pickle.dumps(SessionNotFoundError("no s1")))
    assert type(back) is SessionNotFoundError
    assert back.message == "no s1"
    assert back.code == "SESSION_NOT_FOUND"


def test_turn_errors_carry_their_result_and_the_turns_own_code():
    failed = TurnFailedError("turn 3 failed", result=None, code="HTTP_5XX")
    assert failed.code == "HTTP_5XX"
    assert isinstance(failed, TurnError)
    assert TurnBlockedError("blocked").result is None
    assert SubscriberOverflowError("behind", missed=7).missed == 7
    assert ApprovalPendingError("waiting", call_ids=("c1", "c2")).call_ids == ("c1", "c2")
    assert ApprovalPendingError("waiting").call_ids == ()
