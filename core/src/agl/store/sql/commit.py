"""A SQL store's group commits, led by its callers.

Writes are committed in groups on one writer connection per store: every caller
waiting at the same moment shares one transaction. There is no writer thread:
the first caller to find the writer free leads, running its own write and
whatever else is queued, and hands the lead to the next waiting caller when its
own write has committed, so a lone caller never waits on another thread. A group
runs without savepoints; if one caller's write fails, the group is rolled back
and run again with each write in its own savepoint, so one caller's bad input
fails only that caller. Within a group, inserts into one table go in multi-row
statements, and claims and finishes in one merged statement each
(:mod:`agl.store.claims`).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from agl.errors import IdConflict, StoreUnavailable
from agl.schema import now
from agl.store.claims import RolloutQueue
from agl.store.sql.connections import Connections
from agl.store.sql.jobs import ClaimJob, FinishJob, Insert, Job

MAX_GROUP = 256
"""Writes in one group transaction at most."""
INSERT_ROWS = 64
"""Rows in one multi-row INSERT statement at most (and so distinct statement texts per table)."""
OWNED_IDS = {"spans": "span_id", "llm_calls": "call_id", "rewards": "reward_id"}
"""The tables whose ids belong to their rollout (:class:`~agl.errors.IdConflict`), and each one's id column."""


def statement_sizes(n: int, most: int) -> list[int]:
    """The row counts of the multi-row INSERTs that write ``n`` rows, ``most`` rows a statement at most.

    Each is a power of two up to ``INSERT_ROWS`` (as many of the largest as fit, then the
    binary digits of the rest), so that a table has at most seven statement texts, whatever
    its batches' sizes: each text is a compiled statement the connection keeps (a 64-row
    insert is tens of KiB), and one per row count made the writer's statement cache the
    largest part of a capturing process's added memory.
    """
    top = 1 << (min(INSERT_ROWS, max(1, most)).bit_length() - 1)
    sizes = [top] * (n // top)
    rest = n % top
    while rest:
        size = 1 << (rest.bit_length() - 1)
        sizes.append(size)
        rest -= size
    return sizes


class _GroupRun:
    """How far one group has got across its tries: whether its jobs run in savepoints now, and
    the failure of a lone job (rolled back: nothing to commit)."""

    __slots__ = ("failed", "guarded")

    def __init__(self) -> None:
        self.guarded = False
        self.failed: list[tuple[bool, Any]] = []


class GroupCommit(Connections):
    """The write half of :class:`~agl.store.sql.SqlStore` (a mixin over :class:`Connections`: the store
    sets ``_pending``, ``_mutex``, ``_idle``, ``_leading``, ``_closed``, ``_insert_texts`` and ``_queue``;
    the rollouts mixin, :mod:`agl.store.sql.rollouts`, gives the claims their tasks with ``_with_tasks``)."""

    _pending: deque[Job]
    _mutex: Any
    _idle: Any
    _leading: bool
    _closed: bool
    _insert_texts: dict[tuple[str, int], str]
    _queue: RolloutQueue

    def _run_in_transaction(self, jobs: list[Job]) -> None:
        """Run every job in one transaction on the writer connection and settle each one.

        The group first runs without savepoints. If a job fails (not transiently),
        the transaction is rolled back and the group runs again with each job in its
        own savepoint, so the failure is that job's alone. A transient error anywhere
        rolls the whole group back and runs it again, so each job must be safe to run
        twice (they are: inserts ignore duplicates and a claim is found again by its
        claim id).
        """
        run = _GroupRun()
        try:
            # jobs that queued behind a group stuck on a lock have waited already
            oldest = min(job.created for job in jobs)
            results = self._with_retries(
                lambda: self._try_group(jobs, run), on_transient=self._drop_broken_writer, started=oldest
            )
        except BaseException as exc:
            for job in jobs:
                job.settle(False, exc)
            return
        for job, (ok, value) in zip(jobs, results, strict=False):
            job.settle(ok, value)

    def _try_group(self, jobs: list[Job], run: _GroupRun) -> list[tuple[bool, Any]]:
        """One try of the group's transaction: each job's ``(ok, result or exception)``."""
        cur = self._writer_connection().cursor()
        cur.execute(self.dialect.begin)
        try:
            results = self._run_group(cur, jobs, run)
            if results is None:
                return run.failed
            cur.execute("COMMIT")
        except BaseException:
            # The connection may be gone (or the transaction already ended); the retry reconnects.
            with contextlib.suppress(Exception):
                cur.execute("ROLLBACK")
            raise
        self._committed(len(jobs))
        return results

    def _run_group(self, cur, jobs: list[Job], run: _GroupRun) -> list[tuple[bool, Any]] | None:
        """The group's results in the open transaction: all together, else (after a job failed) each
        job in its own savepoint. None where a lone job failed: rolled back, its failure in ``run``."""
        if not run.guarded:
            try:
                return self._run_together(cur, jobs)
            except Exception as exc:
                if self.dialect.is_transient(exc):
                    raise
                cur.execute("ROLLBACK")
                if len(jobs) == 1:
                    run.failed = [(False, exc)]
                    return None
                run.guarded = True  # run again, each job in its own savepoint
                cur.execute(self.dialect.begin)
        return self._run_guarded(cur, jobs)

    def _run_together(self, cur, jobs: list[Job]) -> list[tuple[bool, Any]]:
        """Every job, inserts and merged claims and finishes first; the first failure raises."""
        self._run_inserts(cur, jobs)
        merged = self._run_merged(cur, jobs)
        results: list[tuple[bool, Any]] = []
        for i, job in enumerate(jobs):
            if type(job.fn) is Insert:
                results.append((True, None))
            elif i in merged:
                results.append((True, merged[i]))
            else:
                results.append((True, job.fn(cur)))
        return results

    def _run_guarded(self, cur, jobs: list[Job]) -> list[tuple[bool, Any]]:
        """Every job in its own savepoint: a failed one is rolled back alone."""
        results: list[tuple[bool, Any]] = []
        for i, job in enumerate(jobs):
            cur.execute(f"SAVEPOINT j{i}")
            try:
                results.append((True, job.fn(cur)))
                cur.execute(f"RELEASE SAVEPOINT j{i}")
            except Exception as exc:
                if self.dialect.is_transient(exc):
                    raise
                cur.execute(f"ROLLBACK TO SAVEPOINT j{i}")
                cur.execute(f"RELEASE SAVEPOINT j{i}")
                results.append((False, exc))
        return results

    def _run_inserts(self, cur, jobs: list[Job]) -> None:
        """Run the group's inserts (see :class:`Insert`), each table's rows in as few statements as can be."""
        inserts = [job.fn for job in jobs if type(job.fn) is Insert]
        if len(inserts) == 1:
            inserts[0](cur)
            return
        tables: dict[tuple[str, tuple[str, ...]], list[tuple]] = {}
        for op in inserts:
            rows = tables.get((op.table, op.columns))
            if rows is None:
                tables[op.table, op.columns] = list(op.rows)
            else:
                rows.extend(op.rows)
        for (table, columns), rows in tables.items():
            self._insert_ignore(cur, table, columns, rows)

    def _run_merged(self, cur, jobs: list[Job]) -> dict[int, Any]:
        """Run the group's claims together and its finishes together, where it has several of
        either (see :mod:`agl.store.claims`); their results by the job's place in the group.
        Jobs in one group were queued concurrently, so running these first is one of the
        orders they could have run in; what cannot be merged runs alone afterwards."""
        if len(jobs) < 2:
            return {}
        claims = [(i, job.fn.op) for i, job in enumerate(jobs) if type(job.fn) is ClaimJob]
        finishes = [(i, job.fn.op) for i, job in enumerate(jobs) if type(job.fn) is FinishJob]
        merged: dict[int, Any] = {}
        if len(claims) < 2 and len(finishes) < 2:
            return merged
        t = now()
        if len(claims) > 1:
            for (i, _), rows in zip(claims, self._queue.claim_all(cur, [c for _, c in claims], t), strict=False):
                if rows is not None:
                    merged[i] = self._with_tasks(cur, rows)
        if len(finishes) > 1:
            for (i, _), row in zip(finishes, self._queue.finish_all(cur, [f for _, f in finishes], t), strict=False):
                if row is not None:
                    merged[i] = row
        return merged

    def _committed(self, jobs: int) -> None:
        """Called on the writer after each commit (the SQLite store schedules checkpoints here)."""

    def _write(self, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(cursor)`` in a group transaction; return its result once committed."""
        [job] = self._write_all([fn])
        return job.outcome()

    def _write_all(self, fns: Sequence[Callable[[Any], Any]]) -> list[Job]:
        """Queue several writes at once (they share a group) and return their settled jobs."""
        jobs = [Job(fn) for fn in fns]
        if not jobs:
            return jobs
        with self._mutex:
            if self._closed:
                raise StoreUnavailable(f"{self.dialect.describe()} is closed")
            self._pending.extend(jobs)
            if self._leading:
                lead = False
            else:
                self._leading = lead = jobs[0].lead = True
        if lead:
            self._lead()
        for job in jobs:
            if job.done:
                continue
            try:
                job.lock.acquire()  # woken once: settled, or made the leader
            except BaseException:
                # Interrupted while waiting: the writes stay queued (they may still commit),
                # and a lead handed to this caller must not be lost.
                with self._mutex:
                    handed = False
                    for other in jobs:
                        other.abandoned = True
                        handed = handed or (other.lead and not other.done)
                if handed:
                    self._lead()
                raise
            if not job.done:
                self._lead()  # made the leader: this job heads the queue, so the first group runs it
        return jobs

    def _writer_free(self) -> bool:
        """Whether no write is running or queued right now (a write would lead at once)."""
        return not self._leading and not self._pending

    def _lead(self) -> None:
        """Run the queued jobs as group transactions, then pass the lead to the next caller in line.

        The leader's own job is in the first group. The lead passes to the caller
        at the head of the queue, who wakes to run the next group; a caller that
        stopped waiting (interrupted) is skipped by running its group here.
        """
        while True:
            group: list[Job] = []
            try:
                with self._mutex:
                    group = [self._pending.popleft() for _ in range(min(len(self._pending), MAX_GROUP))]
                self._run_in_transaction(group)
            except BaseException as exc:  # an interrupt on the leader's thread: fail its group, not the others
                for job in group:
                    if not job.done:
                        job.settle(False, exc)
                self._pass_lead()
                raise
            if self._pass_lead():
                return

    def _pass_lead(self) -> bool:
        """Hand the lead on; False when the head of the queue stopped waiting (lead on)."""
        with self._mutex:
            if not self._pending:
                self._leading = False
                if self._closed:  # only close() waits for the lead to end
                    self._idle.notify_all()
                return True
            nxt = self._pending[0]
            if nxt.abandoned:
                return False
            nxt.lead = True
            nxt.lock.release()  # the next caller in line runs the next group
            return True

    def _insert_ignore(self, cur, table: str, columns: Sequence[str], rows: Sequence[tuple]) -> None:
        """Insert rows, ignoring those whose unique id is stored already: up to ``INSERT_ROWS``
        rows a statement (one statement runs in the database in one go; ``executemany``
        would step the database once a row)."""
        n = len(rows)
        if not n:
            return
        owned = table in OWNED_IDS
        if n == 1:
            cur.execute(self._insert_sql(table, columns, 1), rows[0])
            if owned and cur.rowcount != 1:
                self._check_owners(cur, table, rows)
        else:
            i = 0
            # 999: the fewest parameters a statement may have (old SQLite)
            for size in statement_sizes(n, 999 // len(columns)):
                part = rows[i : i + size]
                i += size
                cur.execute(self._insert_sql(table, columns, size), [v for row in part for v in row])
                if owned and cur.rowcount != size:
                    self._check_owners(cur, table, part)
        self._inserted(cur, table, rows)

    def _inserted(self, cur, table: str, rows: Sequence[tuple]) -> None:
        """Called in the transaction after rows were inserted into ``table`` (the rewards mixin keeps
        each rollout's final reward up to date here)."""

    def _check_owners(self, cur, table: str, rows: Sequence[tuple]) -> None:
        """Some of ``rows`` (id, rollout id, …) were not inserted: their id is stored already. A
        retry of the same rollout's write is what idempotence is for; an id stored under another
        rollout is an :class:`~agl.errors.IdConflict` (the group's other writes are unaffected:
        a failed group runs again with each write in its own savepoint)."""
        column = OWNED_IDS[table]
        ids = sorted({row[0] for row in rows})
        owners: dict[str, str | None] = {}
        for i in range(0, len(ids), 500):
            part = ids[i : i + 500]
            marks = ", ".join("?" for _ in part)
            cur.execute(self._sql(f"SELECT {column}, rollout_id FROM {table} WHERE {column} IN ({marks})"), part)
            owners.update(cur.fetchall())
        for row in rows:
            if owners.get(row[0], row[1]) != row[1]:
                raise IdConflict(f"{table}.{column}", row[0])

    def _insert_sql(self, table: str, columns: Sequence[str], n: int) -> str:
        key = (table, n)
        text = self._insert_texts.get(key)
        if text is None:
            marks = "(" + ", ".join("?" for _ in columns) + ")"
            text = self._sql(
                f"INSERT INTO {table} ({', '.join(columns)}) VALUES {', '.join(marks for _ in range(n))}"
                " ON CONFLICT DO NOTHING"
            )
            self._insert_texts[key] = text
        return text
