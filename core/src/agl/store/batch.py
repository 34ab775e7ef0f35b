"""Several callers' writes handed to a store at once: :meth:`agl.store.base.Store.write_batch`.

The store server's ``/v1/batch`` is one :class:`WriteBatch`: the observations, claims and
finishes that clients' coalescers sent together. A SQL store queues them all at once so they
share one group commit; the default (:class:`BatchWrites`, which :class:`~agl.store.base.Store`
inherits) runs each part through its own store method.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agl.schema import LLMCall, Reward, Rollout, RolloutStatus, Span


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """The arguments of one :meth:`~agl.store.base.Store.claim`."""

    runner_id: str
    limit: int = 1
    claim_id: str | None = None


@dataclass(frozen=True, slots=True)
class FinishRequest:
    """The arguments of one :meth:`~agl.store.base.Store.finish`."""

    rollout_id: str
    status: RolloutStatus
    error: str | None = None
    output: object = None
    attempt: int | None = None


@dataclass(frozen=True, slots=True)
class WriteBatch:
    """Observations to store, claims to make and rollouts to finish, all at once."""

    spans: Sequence[Span] = ()
    llm_calls: Sequence[LLMCall] = ()
    rewards: Sequence[Reward] = ()
    claims: Sequence[ClaimRequest] = ()
    finishes: Sequence[FinishRequest] = ()


@dataclass(slots=True)
class BatchOutcome:
    """What each claim and each finish of a :class:`WriteBatch` came to, in the batch's order:
    its result, or the exception it raised."""

    claims: list[list[Rollout] | Exception]
    finishes: list[Rollout | Exception]


def _run_write(write, items: Sequence[object], failure: Exception | None) -> Exception | None:
    """``write(items)`` where there are items; the first failure so far."""
    if not items:
        return failure
    try:
        write(items)
    except Exception as exc:
        return failure or exc
    return failure


class BatchWrites:
    """The batched writes of :class:`~agl.store.base.Store`, by default one part at a time (a mixin
    of the interface: ``self`` is the store)."""

    def write_batch(self, batch: WriteBatch) -> BatchOutcome:
        """Several callers' writes at once (the store server's ``/v1/batch``): each claim's and finish's
        outcome is its result or the exception it raised; a failed observation write raises once the
        rest has run. A SQL store commits them together; this default calls each part's own method:
        the observations, then each claim, then each finish."""
        failure: Exception | None = None
        for write, items in ((self.add_spans, batch.spans), (self.add_llm_calls, batch.llm_calls)):
            failure = _run_write(write, items, failure)
        failure = _run_write(self.add_rewards, batch.rewards, failure)
        claims: list[list[Rollout] | Exception] = []
        for c in batch.claims:
            try:
                claims.append(self.claim(c.runner_id, limit=c.limit, claim_id=c.claim_id))
            except Exception as exc:
                claims.append(exc)
        finishes: list[Rollout | Exception] = []
        for f in batch.finishes:
            try:
                finishes.append(self.finish(f.rollout_id, f.status, error=f.error, output=f.output, attempt=f.attempt))
            except Exception as exc:
                finishes.append(exc)
        if failure is not None:
            raise failure
        return BatchOutcome(claims, finishes)

    def writer_idle(self) -> bool:
        """Whether :meth:`write_batch` called now would run at once on the calling thread, queued
        behind no other write: a hint for a caller on an event loop (the store server then runs a
        batch on its loop instead of a worker thread). A store that cannot tell says False."""
        return False
