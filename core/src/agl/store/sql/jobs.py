"""The writes a SQL store's group commit runs: each caller's :class:`Job`, and what it runs
(an :class:`Insert`, a claim or a finish, or any function of a cursor)."""

from __future__ import annotations

import _thread
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from agl.schema import now
from agl.store.claims import Claim, Finish


class GroupCommit(Protocol):
    """What a job runs its writes through (:class:`~agl.store.sql.commit.GroupCommit`, the SQL store)."""

    _queue: Any
    """The store's :class:`~agl.store.claims.RolloutQueue`."""

    def _insert_ignore(self, cur: Any, table: str, columns: Sequence[str], rows: list[tuple]) -> None:
        """Insert ``rows``, ignoring ids already stored."""

    def _with_tasks(self, cur: Any, claimed: Any) -> Any:
        """The claimed rollouts with their tasks."""


class Insert:
    """A write that only inserts rows into one table, ignoring ids already stored.

    Calling it inserts its rows on a cursor (how a job runs alone). A group commit
    runs the inserts of all its jobs first, the rows of each table together in
    multi-row statements: jobs in one group were queued concurrently, so running
    their inserts before their other writes is one of the orders they could have
    run in, and inserts of different tables do not depend on each other.
    """

    __slots__ = ("columns", "rows", "store", "table")

    def __init__(self, store: GroupCommit, table: str, columns: Sequence[str], rows: list[tuple]):
        self.store = store
        self.table = table
        self.columns = tuple(columns)
        self.rows = rows

    def __call__(self, cur) -> None:
        self.store._insert_ignore(cur, self.table, self.columns, self.rows)


class QueueJob:
    """A claim or a finish as a write: run alone on a cursor, or merged with the group's other
    claims or finishes (see :mod:`agl.store.claims`)."""

    __slots__ = ("op", "store")

    def __init__(self, store: GroupCommit, op: Claim | Finish):
        self.store = store
        self.op = op


class ClaimJob(QueueJob):
    __slots__ = ()

    def __call__(self, cur):
        store = self.store
        return store._with_tasks(cur, store._queue.claim(cur, self.op, now()))


class FinishJob(QueueJob):
    __slots__ = ()

    def __call__(self, cur):
        return self.store._queue.finish(cur, self.op, now())


class Job:
    """One caller's write: the function to run in the group's transaction and its outcome.

    ``lock`` is held from creation; the caller blocks on it and is woken exactly
    once: when a leader has settled the job, or when it is made the leader itself.
    """

    __slots__ = ("abandoned", "created", "done", "fn", "lead", "lock", "ok", "value")

    def __init__(self, fn: Callable[[Any], Any]):
        self.fn = fn
        self.created = time.monotonic()  # a caller's wait for a locked database counts from here
        self.lock = _thread.allocate_lock()
        self.lock.acquire()
        self.done = False
        self.ok = False
        self.value: Any = None
        self.lead = False  # this job's caller is (or was made) the leader: settling must not wake it
        self.abandoned = False  # its caller stopped waiting (interrupted): never hand it the lead

    def settle(self, ok: bool, value: Any) -> None:
        self.ok = ok
        self.value = value
        self.done = True
        if not self.lead:
            self.lock.release()

    def outcome(self) -> Any:
        if self.ok:
            return self.value
        raise self.value
