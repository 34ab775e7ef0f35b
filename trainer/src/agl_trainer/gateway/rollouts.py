"""Which rollouts the gateway serves, and the order of calls within each.

A rollout id in the URL must name a rollout the store knows; the store is asked
once per rollout and the answer cached. A rollout that has already ended is still
served and its calls recorded (late calls are data, never dropped; the store keeps
late observations by design). Unknown ids are not cached, so a rollout enqueued a
moment later is found on the next call.

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
        start = await asyncio.shield(pending)
        counter = self._seq.get(rollout_id)
        if counter is None:
            counter = self._seq[rollout_id] = itertools.count(start)
            if len(self._seq) > self.max_cached:
                self._seq.popitem(last=False)
        return counter

    def _lookup(self, rollout_id: str) -> int:
        try:
            self.store.get_rollout(rollout_id)
        except NotFound:
            raise GatewayError(
                404, f"unknown rollout {rollout_id!r}", param="rollout_id", code="rollout_not_found"
            ) from None
        last = -1
        for call in self.store.query_llm_calls(rollout_id=rollout_id):
            last = max(last, call.seq)
        return last + 1
