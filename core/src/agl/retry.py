"""One retry policy: which failures are worth another try, how long to wait, when to stop.

Every call agl retries goes through a :class:`RetryPolicy`: the HTTP store client's
requests, the SQL stores' transactions, the runner's claims and finishes while the store
is away, the capture writer's batches. What is retried is decided by the error's type,
never by its message: :class:`~agl.errors.Transient` (the store or a server away,
overloaded or failing inside; :class:`~agl.errors.StoreUnavailable` is one) and the
standard library's ``ConnectionError`` and ``TimeoutError``. Anything else (a refused
token, bad input, an unknown id, a bug) fails the same way every time and is raised at once.

The wait after the n-th failure in a row is ``first_delay_s * 2 ** (n - 1)``, capped at
``max_delay_s``, and drawn at random from its upper half (jitter), so that clients that
failed together do not all come back at the same moment. A policy gives up after
``max_attempts`` tries or once ``deadline_s`` has passed since the first one, whichever
comes first; the last wait is cut short so that the last try falls on the deadline.

    policy = RetryPolicy(max_attempts=6, first_delay_s=0.05)
    answer = policy.call(lambda: store.claim(runner_id))           # or: await policy.acall(...)

The clock, the sleeps and the random source are fields, so a test passes its own instead
of waiting. A loop that cannot be one call (a stream that resumes, a background thread)
keeps an :class:`Attempts` from :meth:`RetryPolicy.start` and asks it how long to wait.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from agl.errors import ConfigError, Transient

T = TypeVar("T")

TRANSIENT: tuple[type[BaseException], ...] = (Transient, ConnectionError, TimeoutError)
"""The error types a policy retries unless told otherwise."""

OnRetry = Callable[[BaseException, float], None]
"""Called with the error and the seconds about to be waited, before each wait."""
GiveUp = Callable[[BaseException, "Attempts"], BaseException]
"""Makes the error to raise (from the last one) when the policy stops retrying a transient failure."""


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is of a type that may pass if the call is tried again (see :data:`TRANSIENT`)."""
    return isinstance(exc, TRANSIENT)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a call that failed with one of ``retry_on``.

    ``max_attempts`` counts every try, the first included (None: no bound by count);
    ``deadline_s`` bounds the time from the first try (None: no bound by time).
    ``jitter=False`` makes every wait its full length (for callers that need it exact).
    """

    max_attempts: int | None = 6
    deadline_s: float | None = None
    first_delay_s: float = 0.05
    max_delay_s: float = 2.0
    jitter: bool = True
    retry_on: tuple[type[BaseException], ...] = TRANSIENT
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    async_sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, repr=False)
    random: Callable[[], float] = field(default=random.random, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ConfigError(f"max_attempts: must be at least 1 (or None), got {self.max_attempts}")
        if self.deadline_s is not None and self.deadline_s < 0:
            raise ConfigError(f"deadline_s: must be 0 or more (or None), got {self.deadline_s}")
        if self.first_delay_s < 0:
            raise ConfigError(f"first_delay_s: must be 0 or more, got {self.first_delay_s}")
        if self.max_delay_s < self.first_delay_s:
            raise ConfigError(
                f"max_delay_s: must be at least first_delay_s ({self.first_delay_s}), got {self.max_delay_s}"
            )

    def retries(self, exc: BaseException) -> bool:
        """Whether this policy retries ``exc`` (by its type: ``retry_on``)."""
        return isinstance(exc, self.retry_on)

    def delay_s(self, failures: int) -> float:
        """The wait after ``failures`` failed tries in a row (1 after the first), before the deadline's cut."""
        full = min(self.max_delay_s, self.first_delay_s * 2 ** min(max(failures - 1, 0), 60))
        return full * (0.5 + 0.5 * self.random()) if self.jitter else full

    def start(self, started: float | None = None) -> Attempts:
        """A fresh count of tries; the deadline counts from ``started`` (on ``clock``'s scale), else now."""
        return Attempts(self, started)

    def call(
        self,
        fn: Callable[[], T],
        *,
        on_retry: OnRetry | None = None,
        give_up: GiveUp | None = None,
        started: float | None = None,
    ) -> T:
        """``fn()``, retried while it fails with a retried type and the policy has tries and time left.

        An error of another type is raised at once. When the policy stops retrying, the last
        error is raised, or ``give_up(last_error, attempts)`` raised from it when given.
        ``started`` moves the deadline's start back (a call that waited in a queue first).
        """
        attempts = self.start(started)
        while True:
            try:
                return fn()
            except Exception as exc:
                wait = attempts.wait_or_raise(exc, on_retry, give_up)
            self.sleep(wait)

    async def acall(
        self,
        fn: Callable[[], Awaitable[T]],
        *,
        on_retry: OnRetry | None = None,
        give_up: GiveUp | None = None,
        started: float | None = None,
    ) -> T:
        """:meth:`call` for a coroutine function: ``await fn()``, waiting with ``async_sleep``."""
        attempts = self.start(started)
        while True:
            try:
                return await fn()
            except Exception as exc:
                wait = attempts.wait_or_raise(exc, on_retry, give_up)
            await self.async_sleep(wait)


class Attempts:
    """One sequence of tries under a policy: the failures in a row and the time since the first try."""

    def __init__(self, policy: RetryPolicy, started: float | None = None):
        self.policy = policy
        self.failures = 0
        self.started = policy.clock() if started is None else started

    @property
    def elapsed_s(self) -> float:
        """Seconds since the first try (or the last :meth:`reset`)."""
        return self.policy.clock() - self.started

    def reset(self) -> None:
        """Start counting again (the call made progress: a stream yielded, a store answered)."""
        self.failures = 0
        self.started = self.policy.clock()

    def failed(self, exc: BaseException) -> float | None:
        """Note a failed try; the seconds to wait before the next one, or None to stop.

        None when ``exc`` is not of a retried type, or the tries or the time are spent.
        """
        policy = self.policy
        if not policy.retries(exc):
            return None
        self.failures += 1
        if policy.max_attempts is not None and self.failures >= policy.max_attempts:
            return None
        wait = policy.delay_s(self.failures)
        if policy.deadline_s is not None:
            left = policy.deadline_s - self.elapsed_s
            if left <= 0:
                return None
            wait = min(wait, left)
        return wait

    def wait_or_raise(self, exc: Exception, on_retry: OnRetry | None = None, give_up: GiveUp | None = None) -> float:
        """:meth:`failed`, raising instead of answering None: ``exc`` itself, or ``give_up``'s error
        (from ``exc``) when the policy stopped retrying a retried type."""
        wait = self.failed(exc)
        if wait is None:
            if give_up is None or not self.policy.retries(exc):
                raise exc
            raise give_up(exc, self) from exc
        if on_retry is not None:
            on_retry(exc, wait)
        return wait


__all__ = ["TRANSIENT", "Attempts", "GiveUp", "OnRetry", "RetryPolicy", "is_transient"]
