"""Every skip and expected failure keeps its reason, those raised inside a trio fixture too.

pytest-trio runs a test and its async fixtures in one ``trio.run`` whose fixtures live in a
nursery, so a ``pytest.skip(REASON)`` raised there (the PostgreSQL fixtures skip when
``DSH_TEST_POSTGRES_DSN`` is unset) leaves it as an exception group. pytest-trio unwraps a group
whose only leaf is a skip by raising a new, bare ``pytest.skip()`` while handling it: ``pytest
-rs`` would then show ``_pytest/python.py: Skipped`` with no reason. The wrapper below puts the
original skip (or xfail) back: it is the one leaf of the group the bare one was raised from.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

Skipped = pytest.skip.Exception
XFailed = pytest.xfail.Exception


def _single_leaf(error: BaseException | None) -> BaseException | None:
    """The only leaf exception of ``error`` (itself when it is not a group), else None."""
    while isinstance(error, BaseExceptionGroup):
        if len(error.exceptions) != 1:
            return None
        error = error.exceptions[0]
    return error


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
    """Re-raise the skip or xfail a trio fixture raised, with its reason, instead of a bare one."""
    try:
        return (yield)
    except (Skipped, XFailed) as bare:
        original = _single_leaf(bare.__context__)
        if bare.msg or type(original) is not type(bare):
            raise
        assert isinstance(original, Skipped | XFailed)
        raise original from None
