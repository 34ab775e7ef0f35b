"""The suite's one polling helper, ``tests.conftest.wait_until``: what it returns, and what a
timed-out wait says."""

from __future__ import annotations

import threading
import time

import pytest

from tests.conftest import wait_until


def test_returns_once_the_condition_holds_with_the_seconds_it_took():
    flag = threading.Event()
    threading.Timer(0.05, flag.set).start()
    started = time.monotonic()
    took = wait_until(flag.is_set, "the flag is set", 10)
    assert flag.is_set() and 0 <= took <= time.monotonic() - started


def test_a_timed_out_wait_names_what_it_waited_for_and_the_detail():
    with pytest.raises(pytest.fail.Exception, match=r"timed out after 0\.\d s waiting until the sky falls\nstill up"):
        wait_until(lambda: False, "the sky falls", 0.05, detail=lambda: "still up")


def test_an_exception_from_the_condition_ends_the_wait_at_once():
    calls = []

    def dead() -> bool:
        calls.append(1)
        raise AssertionError("the helper process exited")

    with pytest.raises(AssertionError, match="the helper process exited"):
        wait_until(dead, "the helper answers", 10)
    assert calls == [1]
