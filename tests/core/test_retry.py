"""agl.retry: the one retry policy. A fake clock and sleep stand in for time, so the policy's
tests never wait; the runner's test runs on a real SqliteStore."""

from __future__ import annotations

import asyncio

import pytest

from agl.errors import ConfigError, NotFound, Refused, StoreUnavailable, Transient
from agl.retry import RetryPolicy, is_transient
from agl.runner import Runner
from agl.schema import Rollout, RolloutStatus, Task
from agl.store.http import StoreServerError, error_from
from agl.store.sqlite import SqliteStore


class FakeTime:
    """A clock that moves only when something sleeps on it."""

    def __init__(self):
        self.now = 100.0
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)


def policy(t: FakeTime, **options) -> RetryPolicy:
    return RetryPolicy(clock=t.clock, sleep=t.sleep, async_sleep=t.async_sleep, **options)


def failing(times: int, error: Exception, answer: str = "ok"):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= times:
            raise error
        return answer

    return fn, calls


def test_transient_failures_are_retried_with_doubling_capped_waits():
    t = FakeTime()
    fn, calls = failing(5, StoreUnavailable("away"))
    assert policy(t, max_attempts=10, first_delay_s=0.1, max_delay_s=0.5, jitter=False).call(fn) == "ok"
    assert len(calls) == 6
    assert t.waits == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])


def test_jitter_draws_each_wait_from_the_upper_half():
    t = FakeTime()
    low = policy(t, first_delay_s=1.0, max_delay_s=8.0, random=lambda: 0.0)
    high = policy(t, first_delay_s=1.0, max_delay_s=8.0, random=lambda: 0.999999)
    assert [low.delay_s(n) for n in (1, 2, 3, 4, 5)] == pytest.approx([0.5, 1.0, 2.0, 4.0, 4.0])
    assert [high.delay_s(n) for n in (1, 2, 3, 4, 5)] == pytest.approx([1.0, 2.0, 4.0, 8.0, 8.0])


def test_after_max_attempts_the_last_error_is_raised_or_give_up_s():
    t = FakeTime()
    error = StoreUnavailable("away")
    fn, calls = failing(99, error)
    with pytest.raises(StoreUnavailable) as info:
        policy(t, max_attempts=3, jitter=False).call(fn)
    assert info.value is error and len(calls) == 3 and len(t.waits) == 2

    fn, calls = failing(99, ConnectionResetError("reset"))
    with pytest.raises(StoreUnavailable, match="gave up after 4 tries: reset") as info:
        policy(t, max_attempts=4).call(
            fn, give_up=lambda exc, a: StoreUnavailable(f"gave up after {a.failures} tries: {exc}")
        )
    assert isinstance(info.value.__cause__, ConnectionResetError) and len(calls) == 4


def test_a_deadline_stops_retrying_and_the_last_try_falls_on_it():
    t = FakeTime()
    fn, calls = failing(99, TimeoutError("slow"))
    with pytest.raises(TimeoutError):
        policy(t, max_attempts=None, deadline_s=1.0, first_delay_s=0.3, jitter=False).call(fn)
    assert t.waits == pytest.approx([0.3, 0.6, 0.1])  # 0.3 + 0.6 = 0.9; the third wait is cut to the deadline
    assert len(calls) == 4


def test_errors_of_other_types_are_raised_at_once():
    t = FakeTime()
    for error in (ValueError("bad field"), NotFound("rollout", "ro-1"), PermissionError("token"), Refused("400")):
        fn, calls = failing(1, error)
        with pytest.raises(type(error)):
            policy(t).call(fn, give_up=lambda exc, a: AssertionError("not a transient failure"))
        assert len(calls) == 1
    assert t.waits == []


def test_retry_on_narrows_what_is_retried():
    t = FakeTime()
    only_store = policy(t, retry_on=(StoreUnavailable,))
    fn, calls = failing(1, ConnectionError("refused"))
    with pytest.raises(ConnectionError):
        only_store.call(fn)
    fn, calls = failing(2, StoreUnavailable("503"))
    assert only_store.call(fn) == "ok" and len(calls) == 3


def test_on_retry_hears_each_error_and_wait():
    t = FakeTime()
    heard = []
    fn, _ = failing(2, StoreUnavailable("away"))
    policy(t, first_delay_s=0.5, jitter=False).call(fn, on_retry=lambda exc, wait: heard.append((str(exc), wait)))
    assert heard == [("away", 0.5), ("away", 1.0)]


def test_the_async_form_waits_with_async_sleep():
    t = FakeTime()
    tries = []

    async def fn():
        tries.append(1)
        if len(tries) < 3:
            raise StoreUnavailable("away")
        return "answer"

    assert asyncio.run(policy(t, first_delay_s=0.2, jitter=False).acall(fn)) == "answer"
    assert t.waits == pytest.approx([0.2, 0.4])


def test_attempts_reset_after_progress():
    t = FakeTime()
    attempts = policy(t, max_attempts=2, jitter=False).start()
    assert attempts.failed(StoreUnavailable("away")) == pytest.approx(0.05)
    attempts.reset()  # e.g. a resumed stream yielded again
    assert attempts.failed(StoreUnavailable("away")) == pytest.approx(0.05)
    assert attempts.failed(StoreUnavailable("away")) is None


def test_transient_is_decided_by_type():
    assert issubclass(StoreUnavailable, Transient)
    assert (
        is_transient(StoreUnavailable("x")) and is_transient(ConnectionRefusedError()) and is_transient(TimeoutError())
    )
    assert (
        not is_transient(ValueError("x")) and not is_transient(PermissionError()) and not is_transient(RuntimeError())
    )
    # the HTTP store's answers: 5xx transient (502/503/504 as StoreUnavailable), 4xx final, whatever the message
    for status in (502, 503, 504):
        assert isinstance(error_from(status, {"reason": "answered 400"}), StoreUnavailable)
    server_error = error_from(500, {"reason": "a bug"})
    assert isinstance(server_error, StoreServerError) and is_transient(server_error) and server_error.status == 500
    for status in (400, 405, 429):
        refused = error_from(status, {"reason": "answered 503"})
        assert isinstance(refused, Refused) and not is_transient(refused)


@pytest.mark.parametrize(
    "options, field",
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"deadline_s": -1}, "deadline_s"),
        ({"first_delay_s": -0.1}, "first_delay_s"),
        ({"first_delay_s": 2.0, "max_delay_s": 1.0}, "max_delay_s"),
    ],
)
def test_bad_settings_name_the_field(options, field):
    with pytest.raises(ConfigError, match=f"^{field}: "):
        RetryPolicy(**options)


class _FlakyClaims(SqliteStore):
    """A real SqliteStore whose first claims fail with ``errors`` (one per claim), messages and all."""

    def __init__(self, path, errors):
        super().__init__(path)
        self.errors = list(errors)

    def claim(self, *args, **kwargs):
        if self.errors:
            raise self.errors.pop(0)
        return super().claim(*args, **kwargs)


def _one_rollout(store) -> None:
    store.add_tasks([Task(task_id="t0", input={"i": 0})])
    store.enqueue([Rollout(rollout_id="ro0", task_id="t0")])


def test_the_runner_rides_out_a_5xx_and_stops_on_a_4xx_whatever_the_message(tmp_path):
    store = _FlakyClaims(tmp_path / "agl.db", [StoreServerError(500, "store server answered 400: misleading")])
    _one_rollout(store)
    runner = Runner(lambda task: 1.0, store, poll_s=0.01)
    try:
        assert runner.run_sync(until_idle=True) == {"succeeded": 1}
        assert store.errors == []
    finally:
        runner.close()
        store.close()

    store = _FlakyClaims(tmp_path / "other.db", [Refused("store server answered 503: misleading")])
    _one_rollout(store)
    runner = Runner(lambda task: 1.0, store, poll_s=0.01)
    try:
        with pytest.raises(Refused, match="misleading"):
            runner.run_sync(until_idle=True)
        assert store.get_rollout("ro0").status == RolloutStatus.QUEUED
    finally:
        runner.close()
        store.close()
