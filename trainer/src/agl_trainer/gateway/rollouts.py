"""Which rollouts the gateway serves, and the order of calls within each.

A rollout id in the URL must name a rollout the store knows; the store is asked
once per rollout and the answer cached. A rollout that has already ended is still
served and its calls recorded (late calls are data, never dropped; the store keeps
late observations by design). Unknown ids are not cached, so a rollout enqueued a
moment later is found on the next call.

The rollout's ``max_response_tokens`` comes with that answer and is cached with it:
:meth:`RolloutRegistry.cap` gives it for every call of the rollout.

``seq`` numbers a rollout's calls in the order the gateway received them, continuing
from what the store already holds, so a restarted gateway does not reuse numbers.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict

from agl.errors import NotFound
from agl.store.base import Store
from agl_trainer.gateway.errors import GatewayError


class RolloutRegistry:
    """Caches known rollouts and hands out per-rollout sequence numbers."""

    def __init__(self, store: Store, *, max_cached: int = 100_000):
        self.store = store
        self.max_cached = max_cached
        self._seq: OrderedDict[str, itertools.count] = OrderedDict()
        self._caps: dict[str, int] = {}
        self._pending: dict[str, asyncio.Future] = {}
        self._production_seq = itertools.count()

    async def next_seq(self, rollout_id: str | None) -> int:
        """The next sequence number for this rollout; 404 for a rollout the store does not know."""
        if rollout_id is None:
            return next(self._production_seq)
        counter = self._seq.get(rollout_id)
        if counter is None:
            counter = await self._load(rollout_id)
        return next(counter)

    def cap(self, rollout_id: str | None) -> int | None:
        """The response cap of a rollout seen by :meth:`next_seq` or :meth:`check` (None: no cap)."""
        return None if rollout_id is None else self._caps.get(rollout_id)

    async def check(self, rollout_id: str) -> None:
        """Raise the 404 for a rollout the store does not know."""
        if rollout_id not in self._seq:
            await self._load(rollout_id)

    async def _load(self, rollout_id: str) -> itertools.count:
        pending = self._pending.get(rollout_id)
        if pending is None:
            pending = asyncio.ensure_future(asyncio.to_thread(self._lookup, rollout_id))
            self._pending[rollout_id] = pending
            pending.add_done_callback(lambda _: self._pending.pop(rollout_id, None))
        start, cap = await asyncio.shield(pending)
        counter = self._seq.get(rollout_id)
        if counter is None:
            counter = self._seq[rollout_id] = itertools.count(start)
            if cap is not None:
                self._caps[rollout_id] = cap
            if len(self._seq) > self.max_cached:
                evicted, _ = self._seq.popitem(last=False)
                self._caps.pop(evicted, None)
        return counter

    def _lookup(self, rollout_id: str) -> tuple[int, int | None]:
        """The rollout's next free ``seq`` and its response cap."""
        try:
            rollout = self.store.get_rollout(rollout_id)
        except NotFound:
            raise GatewayError(
                404, f"unknown rollout {rollout_id!r}", param="rollout_id", code="rollout_not_found"
            ) from None
        last = -1
        for call in self.store.query_llm_calls(rollout_id=rollout_id):
            last = max(last, call.seq)
        return last + 1, rollout.max_response_tokens
