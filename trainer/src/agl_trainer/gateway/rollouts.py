"""Which rollouts the gateway serves, and the order of calls within each.

A rollout id in the URL must name a rollout the store knows; the store is asked
once per rollout and the answer cached. Unknown ids are not cached, so a rollout
enqueued a moment later is found on the next call.

A call made with a rollout key (see :mod:`agl_trainer.gateway.auth`) is served only
while the key's attempt runs: :meth:`RolloutRegistry.check_attempt` asks the store for
the rollout's status and attempt and keeps a "running" answer ``status_ttl_s`` (1 s) in
the cache the store server keeps too (:class:`agl_trainer.http.running.RunningRollouts`),
so a key stops working at most that long after its rollout ended or was given to a new
attempt; any other answer is asked again on the next call. A rollout's first call asks the
store once for everything the gateway needs of it: its status and
attempt, its settings and its next ``seq`` (:meth:`RolloutRegistry.check_attempt` then
:meth:`RolloutRegistry.next_seq` share that answer). A SQLite store is asked on the event loop
itself: a read on its own reader connection takes ~50-75 us, less than the CPU of a hop to a
thread and back (~95 us), and on a loaded host the hop's wait for the thread to be scheduled
was most of a first call's extra time. A store across a network (PostgreSQL, the store
server) is asked in a thread, one lookup a rollout at a time, so the loop never waits on it.
Same-run figures (``python -m tests.benchmarks.bench_gateway_ab --other <28dbf9d checkout>``,
300 rollouts of 4 calls each, one client; 28dbf9d asked the store twice, each in a thread), a
rollout's first call's p50 minus its later calls' p50, 2026-11-29 on the shared 2-core host:
0.11-0.17 ms (median 0.12) against 28dbf9d's 0.32-0.55 ms (0.36), seven rounds in two runs at
load average 11-17; 0.16-0.25 ms against 0.56-0.97 ms in three more at 9.6. With the one lookup still in a
thread the gap was 0.48-1.16 ms at load 9.5, against 0.16-0.24 ms asked on the loop.
A call the admin token makes for a rollout is served whatever its status (late calls
are data; the store keeps late observations by design).

The rollout's settings for its calls (``max_response_tokens``, ``seed``) come with that
answer and are cached with it: :meth:`RolloutRegistry.settings` gives them.

``seq`` numbers a rollout's calls in the order the gateway received them, continuing
from what the store already holds, so a restarted gateway does not reuse numbers.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple, TypeVar

from agl.errors import NotFound
from agl.schema import Rollout, RolloutStatus
from agl.store.base import Store
from agl.store.sqlite import SqliteStore
from agl_trainer.gateway.errors import GatewayError
from agl_trainer.http.running import RunningRollouts, expired_reason

T = TypeVar("T")


class RolloutSettings(NamedTuple):
    """What the gateway applies to every call of a rollout."""

    max_response_tokens: int | None = None
    seed: int | None = None

    def call_seed(self, seq: int) -> int | None:
        """The sampling seed of the rollout's call number ``seq`` (None when the rollout has no seed)."""
        if self.seed is None:
            return None
        digest = hashlib.blake2b(f"{self.seed}:{seq}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") >> 1  # 63 bits: a non-negative int64


_NO_SETTINGS = RolloutSettings()


class _Facts(NamedTuple):
    """What one store lookup tells the gateway of a rollout it has not served yet."""

    next_seq: int
    settings: RolloutSettings
    status: RolloutStatus
    attempt: int


class RolloutRegistry:
    """Caches known rollouts and hands out per-rollout sequence numbers."""

    def __init__(self, store: Store, *, max_cached: int = 100_000, status_ttl_s: float = 1.0):
        self.store = store
        self.max_cached = max_cached
        self.running = RunningRollouts(ttl_s=status_ttl_s, max_cached=max_cached)
        self._status_pending: dict[str, asyncio.Future] = {}
        self._seq: OrderedDict[str, itertools.count] = OrderedDict()
        self._settings: dict[str, RolloutSettings] = {}  # only rollouts that have some
        self._pending: dict[str, asyncio.Future] = {}
        self._production_seq = itertools.count()
        self._on_loop = isinstance(store, SqliteStore)  # local reads: cheaper than a thread hop

    @property
    def status_ttl_s(self) -> float:
        """How long a "running" answer of the store is trusted (seconds)."""
        return self.running.ttl_s

    @status_ttl_s.setter
    def status_ttl_s(self, seconds: float) -> None:
        self.running.ttl_s = seconds

    async def next_seq(self, rollout_id: str | None) -> int:
        """The next sequence number for this rollout; 404 for a rollout the store does not know."""
        if rollout_id is None:
            return next(self._production_seq)
        counter = self._seq.get(rollout_id)
        if counter is None:
            await self._load(rollout_id)
            counter = self._seq[rollout_id]
        return next(counter)

    def settings(self, rollout_id: str | None) -> RolloutSettings:
        """The settings of a rollout seen by :meth:`next_seq` or :meth:`check` (none for production calls)."""
        return _NO_SETTINGS if rollout_id is None else self._settings.get(rollout_id, _NO_SETTINGS)

    async def check(self, rollout_id: str) -> None:
        """Raise the 404 for a rollout the store does not know."""
        if rollout_id not in self._seq:
            await self._load(rollout_id)

    async def check_attempt(self, rollout_id: str, attempt: int) -> None:
        """Raise 401 ``rollout_key_expired`` unless attempt ``attempt`` of the rollout is running now.

        A rollout not served yet is looked up whole (its ``seq`` and settings with its status),
        so the :meth:`next_seq` that follows asks the store nothing more.
        """
        current = self.running.attempt(rollout_id)
        status = RolloutStatus.RUNNING
        if current is None:
            if rollout_id in self._seq:
                status, current = await self._ask(self._status_pending, rollout_id, self.status_of)
                self.running.remember(rollout_id, status, current)
            else:
                facts = await self._load(rollout_id)
                status, current = facts.status, facts.attempt
        reason = expired_reason(rollout_id, attempt, status, current)
        if reason is not None:
            raise GatewayError(401, reason, type="authentication_error", code="rollout_key_expired")

    def status_of(self, rollout_id: str) -> tuple[RolloutStatus, int]:
        """The rollout's status and attempt, asked of the store now (404 for an unknown rollout)."""
        rollout = self._rollout(rollout_id)
        return rollout.status, rollout.attempt

    def _rollout(self, rollout_id: str) -> Rollout:
        """The stored rollout; a 404 for one the store does not know."""
        try:
            return self.store.get_rollout(rollout_id)
        except NotFound:
            raise GatewayError(
                404, f"unknown rollout {rollout_id!r}", param="rollout_id", code="rollout_not_found"
            ) from None

    async def _load(self, rollout_id: str) -> _Facts:
        """Look the rollout up (once, however many calls ask meanwhile) and keep what it says."""
        facts = await self._ask(self._pending, rollout_id, self._lookup)
        self.running.remember(rollout_id, facts.status, facts.attempt)
        if rollout_id not in self._seq:
            self._seq[rollout_id] = itertools.count(facts.next_seq)
            if facts.settings != _NO_SETTINGS:
                self._settings[rollout_id] = facts.settings
            if len(self._seq) > self.max_cached:
                evicted, _ = self._seq.popitem(last=False)
                self._settings.pop(evicted, None)
        return facts

    async def _ask(self, pending: dict[str, asyncio.Future[T]], rollout_id: str, call: Callable[[str], T]) -> T:
        """``call(rollout_id)``: here for a SQLite store, else in a thread (see the module's docstring)."""
        if self._on_loop:
            return call(rollout_id)
        return await _shared_call(pending, rollout_id, call)

    def _lookup(self, rollout_id: str) -> _Facts:
        """The rollout's next free ``seq``, settings, status and attempt, from the store."""
        rollout = self._rollout(rollout_id)
        last = -1
        for call in self.store.query_llm_calls(rollout_id=rollout_id):
            last = max(last, call.seq)
        settings = RolloutSettings(rollout.max_response_tokens, rollout.seed)
        return _Facts(last + 1, settings, rollout.status, rollout.attempt)


async def _shared_call(pending: dict[str, asyncio.Future[T]], rollout_id: str, call: Callable[[str], T]) -> T:
    """``call(rollout_id)`` in a thread, one at a time a rollout: callers who ask while it runs share its answer."""
    future = pending.get(rollout_id)
    if future is None:
        future = asyncio.ensure_future(asyncio.to_thread(call, rollout_id))
        pending[rollout_id] = future
        future.add_done_callback(lambda _: pending.pop(rollout_id, None))
    return await asyncio.shield(future)
