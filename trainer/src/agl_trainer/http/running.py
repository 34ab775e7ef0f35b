"""Whether a rollout key still works: the rule both servers apply, and the cache behind it.

A rollout key (:class:`agl.credentials.RolloutKeys`) names a rollout and an attempt, and works
only while that attempt runs. Both the store server and the gateway ask their store, and keep
a *running* answer in :class:`RunningRollouts` for ``ttl_s`` (1 s): a key stops working at
most that long after its attempt ended. Any other answer is not kept, so a rollout claimed
a moment later opens its key at once. The cache holds at most ``max_cached`` rollouts, the
least recently confirmed dropped first.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from agl.schema import RolloutStatus


def expired_reason(rollout_id: str, attempt: int, status: RolloutStatus | None, current: int | None) -> str | None:
    """Why the key of ``attempt`` of ``rollout_id`` no longer works, given the rollout's ``status``
    and ``current`` attempt (None: the store does not know the rollout); None while it works."""
    if status == RolloutStatus.RUNNING and current == attempt:
        return None
    if status is None:
        return f"this rollout key has expired: the store knows no rollout {rollout_id!r}"
    state = status.value if current == attempt else f"on attempt {current}"
    return (
        f"this rollout key has expired: rollout {rollout_id!r} attempt {attempt} is no longer running "
        f"(the rollout is {state})"
    )


class RunningRollouts:
    """Rollouts the store said were running, with their attempt, each trusted ``ttl_s`` seconds.

    Safe to use from several threads (the store server's) or one event loop (the gateway's).
    """

    def __init__(self, *, ttl_s: float = 1.0, max_cached: int = 100_000):
        if ttl_s < 0:
            raise ValueError(f"ttl_s: must be at least 0, got {ttl_s}")
        if max_cached < 1:
            raise ValueError(f"max_cached: must be at least 1, got {max_cached}")
        self.ttl_s = ttl_s
        self.max_cached = max_cached
        self._seen: OrderedDict[str, tuple[float, int]] = OrderedDict()  # rollout id -> (when, attempt)
        self._lock = threading.Lock()

    def attempt(self, rollout_id: str) -> int | None:
        """The attempt that runs, when the store said so within ``ttl_s``; None: ask the store."""
        hit = self._seen.get(rollout_id)
        if hit is None or time.monotonic() - hit[0] > self.ttl_s:
            return None
        return hit[1]

    def remember(self, rollout_id: str, status: RolloutStatus, attempt: int) -> None:
        """What the store just said of the rollout: kept when it runs, forgotten otherwise."""
        with self._lock:
            if status != RolloutStatus.RUNNING:
                self._seen.pop(rollout_id, None)
                return
            self._seen[rollout_id] = (time.monotonic(), attempt)
            self._seen.move_to_end(rollout_id)
            while len(self._seen) > self.max_cached:
                self._seen.popitem(last=False)

    def __len__(self) -> int:
        return len(self._seen)
