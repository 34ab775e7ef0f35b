"""Tasks, rollouts and claims on a SQL store: queueing, claiming, heartbeats, finishing, expiry.

Claims and finishes are jobs of the group commit (:mod:`agl.store.sql.jobs`), so a group's
claims run as one merged statement and its finishes as another (:mod:`agl.store.claims`).
Claimed rollouts come with their tasks, from a cache of task bodies (tasks never change
once stored) or read in the claim's transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Unpack

from agl.errors import InvalidTransition, NotFound
from agl.schema import INT64_MAX, Attempt, Rollout, RolloutStatus, Task, check_json, new_id, now
from agl.store.base import FinishOptions, with_defaults
from agl.store.claims import Claim, Finish
from agl.store.sql.commit import GroupCommit
from agl.store.sql.connections import PAGE_SIZE
from agl.store.sql.jobs import ClaimJob, FinishJob, Insert
from agl.store.sql.rows import NULL, ROLLOUT_COLUMNS, ROLLOUT_SELECT, json_body, json_text, rollout_from_row
from agl.tokens import STORED

TASK_CACHE_BYTES = 8 * 1024 * 1024
"""Task bodies a store keeps in memory for claims (tasks never change once stored)."""


class RolloutsAndClaims(GroupCommit):
    """Tasks, rollouts and claims (a mixin of :class:`~agl.store.sql.SqlStore`, which sets
    ``_task_bodies`` and ``_task_bytes``)."""

    _task_bodies: dict[str, str]
    _task_bytes: int

    # -- tasks ---------------------------------------------------------------------
    def add_tasks(self, tasks: Iterable[Task]) -> None:
        rows = [(t.task_id, t.split, json_body(t)) for t in tasks]
        self._write(Insert(self, "tasks", ("task_id", "split", "body"), rows))

    def get_task(self, task_id: str) -> Task:
        rows = self._read("SELECT body FROM tasks WHERE task_id = ?", [task_id])
        if not rows:
            raise NotFound("task", task_id)
        return Task.model_validate_json(rows[0][0], context=STORED)

    def query_tasks(self, *, split: str | None = None) -> Iterator[Task]:
        where, params = ["1 = 1"], []
        if split is not None:
            where.append("split = ?")
            params.append(split)
        for (body,) in self._paged("tasks", "body", where, params):
            yield Task.model_validate_json(body, context=STORED)

    # -- rollouts ------------------------------------------------------------------
    def enqueue(self, rollouts: Sequence[Rollout]) -> list[Rollout]:
        rollouts = list(rollouts)
        task_ids = sorted({r.task_id for r in rollouts})

        def run(cur):
            if task_ids:
                marks = ", ".join("?" for _ in task_ids)
                cur.execute(self._sql(f"SELECT task_id FROM tasks WHERE task_id IN ({marks})"), task_ids)
                missing = set(task_ids) - {row[0] for row in cur.fetchall()}
                if missing:
                    raise NotFound("task", min(missing))
            rows = []
            for r in rollouts:
                if r.status != RolloutStatus.QUEUED:
                    raise InvalidTransition(
                        f"rollout {r.rollout_id}: enqueue needs status 'queued', got {r.status.value!r}"
                    )
                rows.append(
                    (
                        r.rollout_id,
                        r.task_id,
                        r.status.value,
                        0,
                        r.max_attempts,
                        r.timeout_s,
                        r.model_version,
                        r.step,
                        r.mode,
                        None,
                        None,
                        r.created_at,
                        None,
                        None,
                        None,
                        None,
                        json_text(r.output),
                        r.max_response_tokens,
                        r.seed,
                        json_text(r.resources) if r.resources else None,
                        r.resources_version,
                    )
                )
            self._insert_ignore(cur, "rollouts", ROLLOUT_COLUMNS, rows)

        self._write(run)
        return rollouts

    def claim(self, runner_id: str, *, limit: int = 1, claim_id: str | None = None) -> list[Rollout]:
        fn, post = self._claim_op(runner_id, limit, claim_id)
        return post(self._write(fn))

    def _claim_op(self, runner_id: str, limit: int, claim_id: str | None):
        if limit < 1:
            raise ValueError(f"limit: must be at least 1, got {limit}")
        # A claim id made here cannot have been used before: only the caller's own can repeat.
        claim = Claim(runner_id, limit, claim_id or new_id("claim-"), repeatable=claim_id is not None)
        return ClaimJob(self, claim), self._claimed

    def _with_tasks(self, cur, rows: list[tuple]) -> tuple[list[tuple], dict[str, str], dict[str, str] | None]:
        """Claimed rows with their tasks' bodies: from the cache (tasks never change once
        stored), else read here (``read``, for :meth:`_claimed` to cache)."""
        bodies = self._task_bodies
        found, missing = {}, []
        for task_id in {row[1] for row in rows}:
            body = bodies.get(task_id)
            if body is None:
                missing.append(task_id)
            else:
                found[task_id] = body
        read = None
        if missing:
            marks = ", ".join("?" for _ in missing)
            cur.execute(self._sql(f"SELECT task_id, body FROM tasks WHERE task_id IN ({marks})"), sorted(missing))
            read = dict(cur.fetchall())
            found.update(read)
        return rows, found, read

    def _claimed(self, result) -> list[Rollout]:
        rows, found, read = result
        if read:
            self._remember_tasks(read)
        rollouts = []
        for row in rows:
            rollout = rollout_from_row(row)
            body = found.get(rollout.task_id)
            rollout.task = None if body is None else Task.model_validate_json(body, context=STORED)
            rollouts.append(rollout)
        rollouts.sort(key=lambda r: r.created_at)
        return rollouts

    def _remember_tasks(self, bodies: dict[str, str]) -> None:
        """Cache task bodies (bounded by total size; tasks are immutable once stored)."""
        size = sum(len(b) for b in bodies.values())
        if self._task_bytes + size > TASK_CACHE_BYTES:
            self._task_bodies = {}  # claims in flight keep the dict they started with
            self._task_bytes = 0
        self._task_bodies.update(bodies)
        self._task_bytes += size

    def heartbeat(self, rollout_ids: Sequence[str], runner_id: str) -> None:
        ids = list(rollout_ids)
        if not ids:
            return
        t = now()

        def run(cur):
            cur.executemany(
                self._sql("UPDATE rollouts SET heartbeat_at = ? WHERE rollout_id = ? AND runner_id = ? AND status = ?"),
                [(t, rid, runner_id, RolloutStatus.RUNNING.value) for rid in ids],
            )

        self._write(run)

    def finish(self, rollout_id: str, status: RolloutStatus, **options: Unpack[FinishOptions]) -> Rollout:
        fn, post = self._finish_op(rollout_id, status, **with_defaults(FinishOptions, options, "finish"))
        return post(self._write(fn))

    def _finish_op(
        self, rollout_id: str, status: RolloutStatus, error: str | None, output: object, attempt: int | None = None
    ):
        status = RolloutStatus(status)
        if not status.terminal:
            raise InvalidTransition(f"status: finish needs a terminal status, got {status.value!r}")
        if attempt is not None and not 1 <= attempt <= INT64_MAX:
            raise ValueError(f"attempt: must be from 1 to {INT64_MAX}, got {attempt}")
        check_json(output, "output")
        return FinishJob(self, Finish(rollout_id, status, error, json_text(output), attempt)), rollout_from_row

    def cancel(self, rollout_ids: Sequence[str]) -> None:
        ids = list(rollout_ids)
        t = now()

        def run(cur):
            for rid in ids:
                cur.execute(
                    self._sql(f"SELECT {ROLLOUT_SELECT} FROM rollouts WHERE rollout_id = ?{self.dialect.for_update}"),
                    (rid,),
                )
                row = cur.fetchone()
                if row is None:
                    raise NotFound("rollout", rid)
                if RolloutStatus(row[2]).terminal:
                    continue
                if row[2] == RolloutStatus.RUNNING.value:
                    self._queue.end_attempt(cur, row, RolloutStatus.CANCELLED, "cancelled", NULL, t)
                else:
                    cur.execute(
                        self._sql("UPDATE rollouts SET status = ?, ended_at = ?, error = ? WHERE rollout_id = ?"),
                        (RolloutStatus.CANCELLED.value, t, "cancelled", rid),
                    )

        self._write(run)

    def expire(self, *, heartbeat_timeout_s: float, now: float | None = None) -> list[Rollout]:
        from agl.schema import now as _now

        t = _now() if now is None else now

        def run(cur):
            cur.execute(
                self._sql(
                    f"""SELECT {ROLLOUT_SELECT} FROM rollouts WHERE status = ? AND (
                        heartbeat_at < ?
                        OR (timeout_s IS NOT NULL AND started_at + timeout_s < ?)){self.dialect.for_update}"""
                ),
                (RolloutStatus.RUNNING.value, t - heartbeat_timeout_s, t),
            )
            rows = cur.fetchall()
            for row in rows:
                late = row[5] is not None and row[12] + row[5] < t
                reason = f"timed out after {row[5]}s" if late else f"no heartbeat for {heartbeat_timeout_s}s"
                self._queue.end_attempt(cur, row, RolloutStatus.TIMED_OUT, reason, NULL, t)
            return [row[0] for row in rows]

        return [self.get_rollout(rid) for rid in self._write(run)]

    def get_rollout(self, rollout_id: str) -> Rollout:
        rows = self._read(f"SELECT {ROLLOUT_SELECT} FROM rollouts WHERE rollout_id = ?", [rollout_id])
        if not rows:
            raise NotFound("rollout", rollout_id)
        return rollout_from_row(rows[0])

    def query_rollouts(self, *, task_id=None, status=None, step=None, since=None, until=None, rollout_ids=None):
        where, params = ["1 = 1"], []
        given = ("task_id = ?", task_id), ("step = ?", step), ("created_at >= ?", since), ("created_at < ?", until)
        self._where_given(where, params, *given)
        if status is not None:
            statuses = [status] if isinstance(status, (str, RolloutStatus)) else list(status)
            self._in("status", [RolloutStatus(s).value for s in statuses], where, params)
        if rollout_ids is not None:
            ids = list(rollout_ids)
            for i in range(0, max(len(ids), 1), PAGE_SIZE):
                chunk_where, chunk_params = list(where), list(params)
                self._in("rollout_id", ids[i : i + PAGE_SIZE], chunk_where, chunk_params)
                for row in self._paged("rollouts", ROLLOUT_SELECT, chunk_where, chunk_params):
                    yield rollout_from_row(row)
            return
        for row in self._paged("rollouts", ROLLOUT_SELECT, where, params):
            yield rollout_from_row(row)

    def attempts(self, rollout_id: str) -> list[Attempt]:
        # Ended attempts are in their table; a running one is the rollout's own row (see
        # agl.store.claims). One statement, so one snapshot of both.
        rows = self._read(
            f"""SELECT rollout_id, attempt, runner_id, status, started_at, ended_at, error, heartbeat_at
                FROM attempts WHERE rollout_id = ?
            UNION ALL
            SELECT rollout_id, attempt, runner_id, status, started_at, NULL, NULL, heartbeat_at FROM rollouts
                WHERE rollout_id = ? AND status = '{RolloutStatus.RUNNING.value}' AND NOT EXISTS (
                    SELECT 1 FROM attempts WHERE attempts.rollout_id = rollouts.rollout_id
                    AND attempts.attempt = rollouts.attempt)
            ORDER BY attempt""",
            [rollout_id, rollout_id],
        )
        keys = ("rollout_id", "attempt", "runner_id", "status", "started_at", "ended_at", "error", "heartbeat_at")
        return [Attempt.model_validate(dict(zip(keys, row, strict=False))) for row in rows]

    def get_tasks(self, task_ids: Sequence[str]) -> dict[str, Task]:
        """These tasks by id; ids not in the store are left out."""
        out = {}
        for (body,) in self._read_in("SELECT body FROM tasks WHERE", "task_id", task_ids):
            task = Task.model_validate_json(body, context=STORED)
            out[task.task_id] = task
        return out
