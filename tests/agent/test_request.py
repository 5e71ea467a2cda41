"""Per-request decisions (``_agent/request.py``): retry policy and request records."""

from __future__ import annotations

import email.utils
import random

import pytest

from dsh_agent_loop._agent.request import (
    MAX_ATTEMPTS,
    MAX_RETRY_AFTER,
    PreStepDecision,
    Retry,
    context_record,
    default_retry_delay,
    header_reason,
    header_record,
    retry_after_seconds,
)
from dsh_agent_loop._frozen import FrozenDict, freeze
from dsh_agent_loop.llm._base import TRANSIENT_CODES, Failure, PreparedCall


async def _no_stream(request):  # pragma: no cover
    return
    yield


def prepared(**kw) -> PreparedCall:
    return PreparedCall(config={"provider": "p", "model": "m"}, stream_fn=_no_stream, **kw)


class FixedRandom(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


def test_pre_step_decisions():
    enter = PreStepDecision.enter([{"id": "m-1"}], starts_request_series=True)
    assert (enter.kind, enter.messages, enter.starts_request_series) == (
        "enter",
        ({"id": "m-1"},),
        True,
    )
    reject = PreStepDecision.reject("no")
    assert (reject.kind, reject.messages, reject.reason) == ("reject", (), "no")
    assert PreStepDecision("enter", [1, 2]).messages == (1, 2)
    assert Retry().delay == 0.0


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None),
        (3, 3.0),
        (2.5, 2.5),
        (-4, 0.0),
        (1000, MAX_RETRY_AFTER),
        (" 7 ", 7.0),
        ("120", MAX_RETRY_AFTER),
        ("soon", None),
        ("", None),
    ],
)
def test_retry_after_seconds_parses_numbers_and_caps_them(value, seconds):
    assert retry_after_seconds(value) == seconds


def test_retry_after_seconds_parses_an_http_date_against_now():
    now = 1_700_000_000.0
    in_ten = email.utils.formatdate(now + 10, usegmt=True)
    assert retry_after_seconds(in_ten, now=now) == pytest.approx(10.0)
    past = email.utils.formatdate(now - 100, usegmt=True)
    assert retry_after_seconds(past, now=now) == 0.0
    far = email.utils.formatdate(now + 3600, usegmt=True)
    assert retry_after_seconds(far, now=now) == MAX_RETRY_AFTER


@pytest.mark.parametrize(
    ("attempt", "u", "delay"),
    [(1, 0.0, 0.5), (2, 0.0, 1.0), (3, 1.0, 2.5), (4, 0.5, 4.5)],
)
def test_default_retry_delay_backs_off_exponentially_with_jitter(attempt, u, delay):
    failure = Failure("HTTP_5XX", "down")
    assert default_retry_delay(failure, attempt, FixedRandom(u)) == pytest.approx(delay)


def test_default_retry_delay_honours_retry_after_and_gives_up():
    rng = FixedRandom(0.0)
    assert default_retry_delay(Failure("HTTP_429", "x", retry_after=3.0), 1, rng) == 3.0
    assert default_retry_delay(Failure("HTTP_429", "x", retry_after=500.0), 1, rng) == 60.0
    assert default_retry_delay(Failure("HTTP_429", "x"), MAX_ATTEMPTS, rng) is None
    for code in ("AUTH", "HTTP_4XX", "NO_ADAPTER"):
        assert code not in TRANSIENT_CODES
        assert default_retry_delay(Failure(code, "x"), 1, rng) is None
    for code in TRANSIENT_CODES:
        assert default_retry_delay(Failure(code, "x"), 1, rng) is not None


def test_header_record_leaves_out_empty_parts():
    config = freeze({"provider": "p", "model": "m"})
    assert header_record(config, prepared(), ()) == {"config": config}
    tools = (freeze({"name": "t"}),)
    full = header_record(config, prepared(adapter_defaults={"max_tokens": 9}), tools)
    assert full == {"config": config, "adapter_defaults": {"max_tokens": 9}, "tools": tools}
    assert type(full) is FrozenDict


@pytest.mark.parametrize(
    ("previous", "first", "series", "reason"),
    [
        (None, True, False, "initial"),
        ("same", True, False, "resume"),
        ("other", True, True, "resume"),
        ("other", False, False, "change"),
        ("same", False, True, "series"),
        ("same", False, False, None),
    ],
)
def test_header_reason(previous, first, series, reason):
    header = FrozenDict(config=FrozenDict(model="m"))
    before = {None: None, "same": FrozenDict(config=FrozenDict(model="m"))}.get(
        previous, FrozenDict(config=FrozenDict(model="n"))
    )
    assert header_reason(before, header, first_request=first, new_series=series) == reason


def test_context_record_is_written_only_when_it_changes():
    call = prepared(context_window=1000, system_prompt_update="in-history")
    record = context_record(call, None)
    assert record == {
        "provider": "p",
        "model": "m",
        "context_window": 1000,
        "system_prompt_update": "in-history",
    }
    assert context_record(call, record) is None
    assert context_record(prepared(), record) == {"provider": "p", "model": "m"}
