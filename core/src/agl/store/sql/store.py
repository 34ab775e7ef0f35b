"""The :class:`SqlStore` class: the store on a SQL database, put together from one mixin per concern."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from agl.schema import StoreStats
from agl.store.base import Store
from agl.store.batch import BatchOutcome, WriteBatch
from agl.store.bulk import TransitionRows
from agl.store.claims import RolloutQueue
from agl.store.sql.connections import ReaderPool, close_quietly
from agl.store.sql.dashboard import DashboardReads
from agl.store.sql.dialect import Dialect, create_schema
from agl.store.sql.jobs import Job
from agl.store.sql.observations import SpansAndCalls
from agl.store.sql.rewards import Rewards
from agl.store.sql.rollouts import RolloutsAndClaims
from agl.store.sql.rows import ROLLOUT_SELECT
from agl.store.sql.steps import StepsAndVersions

_BATCHED_METHODS = ("add_spans", "add_llm_calls", "add_rewards", "claim", "finish")
"""The methods a :class:`~agl.store.batch.WriteBatch` stands for."""


class SqlStore(RolloutsAndClaims, SpansAndCalls, Rewards, StepsAndVersions, DashboardReads, Store):
    """A :class:`Store` on a SQL database, with group commits led by its callers.

    ``retries`` bounds how often a transient failure (a lock, a dropped connection,
    a serialization failure: what :meth:`Dialect.is_transient` says) is retried, with
    :mod:`agl.retry`'s exponential backoff from ``retry_delay_s``, before the call fails
    with :class:`StoreUnavailable`.
    ``max_readers`` bounds the reader connections.
    """

    def __init__(self, dialect: Dialect, *, retries: int = 8, retry_delay_s: float = 0.02, max_readers: int = 8):
        if retries < 0:
            raise ValueError(f"retries: must be at least 0, got {retries}")
        if max_readers < 1:
            raise ValueError(f"max_readers: must be at least 1, got {max_readers}")
        self.dialect = dialect
        self.retries = retries
        self.retry_delay_s = retry_delay_s
        self.max_wait_s: float | None = None
        """Give up retrying a transient failure once this long has passed (None: after ``retries``)."""
        self._pool = ReaderPool(lambda: dialect.connect(writer=False), max_readers)
        self._pending: deque[Job] = deque()
        self._mutex = threading.Lock()
        self._leading = False  # some caller is running a group (or about to)
        self._idle = threading.Condition(self._mutex)  # notified when the lead is given up
        self._closed = False
        self._writer_conn: Any = None
        self._task_bodies: dict[str, str] = {}
        self._task_bytes = 0
        self._insert_texts: dict[tuple[str, int], str] = {}
        self._queue = RolloutQueue(
            self._sql, ROLLOUT_SELECT, skip_locked=dialect.skip_locked, for_update=dialect.for_update
        )
        # A subclass that changed a method a batch stands for gets its batches through those methods.
        cls = type(self)
        self._own_batches = all(getattr(cls, name) is getattr(SqlStore, name) for name in _BATCHED_METHODS)
        schema = Job(lambda cur: create_schema(cur, dialect))
        schema.lead = True
        self._run_in_transaction([schema])
        schema.outcome()

    # -- batched writes --------------------------------------------------------------
    def write_batch(self, batch: WriteBatch) -> BatchOutcome:
        """Every part of the batch queued at once, so they share one group commit."""
        if not self._own_batches:
            return super().write_batch(batch)
        fns: list[Callable[[Any], Any]] = []
        if batch.spans:
            fns.append(self._spans_op(batch.spans))
        if batch.llm_calls:
            fns.append(self._llm_calls_op(batch.llm_calls))
        if batch.rewards:
            fns.append(self._rewards_op(batch.rewards))
        observed = len(fns)
        posts: list[Callable[[Any], Any] | Exception] = []
        for c in batch.claims:
            self._queue_op(fns, posts, lambda c=c: self._claim_op(c.runner_id, c.limit, c.claim_id))
        split = len(posts)
        for f in batch.finishes:
            self._queue_op(
                fns, posts, lambda f=f: self._finish_op(f.rollout_id, f.status, f.error, f.output, f.attempt)
            )
        jobs = iter(self._write_all(fns))
        for _ in range(observed):
            next(jobs).outcome()
        outcomes: list[Any] = []
        for post in posts:
            if isinstance(post, Exception):
                outcomes.append(post)
                continue
            job = next(jobs)
            try:
                outcomes.append(post(job.outcome()))
            except Exception as exc:
                outcomes.append(exc)
        return BatchOutcome(outcomes[:split], outcomes[split:])

    @staticmethod
    def _queue_op(fns: list[Callable[[Any], Any]], posts: list[Any], make: Callable[[], tuple[Any, Any]]) -> None:
        """Add a claim's or finish's job to ``fns`` and its result's conversion to ``posts`` (or the
        exception making it raised: a bad argument fails that claim or finish alone)."""
        try:
            fn, post = make()
        except Exception as exc:
            posts.append(exc)
            return
        fns.append(fn)
        posts.append(post)

    def writer_idle(self) -> bool:
        return self._own_batches and self._writer_free()

    # -- bulk reads for building transitions ----------------------------------------
    def transition_rows(self, rollout_ids: Sequence[str]) -> TransitionRows:
        """One statement per table for up to 500 rollouts; the calls' and spans' fields come from
        the columns that copy them at write time, the rewards' are extracted from their JSON by
        the database, the token columns come as stored."""
        return TransitionRows(
            self._call_rows(rollout_ids), self._span_rows(rollout_ids), self._reward_rows(rollout_ids)
        )

    # -- the rest ------------------------------------------------------------------
    def select(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one read-only query (``?`` placeholders) and return its rows (the connection goes
        back to the pool at once): for what the :class:`Store` methods do not offer."""
        return self._read(sql, params)

    def stats(self) -> StoreStats:
        def count(table: str) -> int:
            return int(self._read(f"SELECT COUNT(*) FROM {table}")[0][0])

        rollouts = {status: int(n) for status, n in self._read("SELECT status, COUNT(*) FROM rollouts GROUP BY status")}
        return StoreStats(
            tasks=count("tasks"),
            rollouts=rollouts,
            spans=count("spans"),
            llm_calls=count("llm_calls"),
            rewards=count("rewards"),
            model_versions=count("model_versions"),
        )

    def close(self) -> None:
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            # Writes already queued are committed; later ones are refused.
            while self._leading:
                self._idle.wait()
        if self._writer_conn is not None:
            close_quietly(self._writer_conn)
        self._pool.close()
