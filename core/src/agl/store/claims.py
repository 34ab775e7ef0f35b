"""Claiming and finishing rollouts on a SQL store: one at a time, or a whole group's at once.

A group commit (see :mod:`agl.store.sql`) often holds many claims and finishes from
concurrent callers. One at a time, each is two or three statements. Together, a
group's claims are one UPDATE that takes rollouts in queue order and hands each
claim its share, and its finishes are one UPDATE joined to a list of VALUES, each
followed by one statement for the attempts. Fewer statements is less time holding
the writer, and in Python fewer hand-offs of the interpreter lock, which every
statement gives up while the database runs it.

An attempt is written to the ``attempts`` table when it ends; while it runs, the
rollout's own row (attempt number, runner, start time) is its record, so a claim
writes nothing but that row.

Merged statements are written for up to ``MERGE_MAX`` claims or finishes and cached
by their count; a larger group runs in several of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agl.errors import InvalidTransition, NotFound
from agl.schema import ALLOWED_TRANSITIONS, RolloutStatus

MERGE_MAX = 32
"""Claims (or finishes) in one merged statement at most."""

_QUEUED = RolloutStatus.QUEUED.value
_RUNNING = RolloutStatus.RUNNING.value
_RETRYABLE = frozenset({RolloutStatus.FAILED, RolloutStatus.TIMED_OUT})
# Positions in a rollout row (see agl.store.sql._ROLLOUT_COLUMNS).
_ID, _STATUS, _ATTEMPT, _MAX_ATTEMPTS, _RUNNER_ID, _CLAIM_ID, _STARTED_AT, _HEARTBEAT_AT = 0, 2, 3, 4, 9, 10, 12, 13


class Claim:
    """One caller's claim: who claims, how many rollouts at most, and the claim's id.

    ``repeatable`` claims came with the caller's own claim id, so the same call may
    arrive again (a retry): it then gets back the rollouts its first arrival took.
    """

    __slots__ = ("claim_id", "limit", "repeatable", "runner_id")

    def __init__(self, runner_id: str, limit: int, claim_id: str, repeatable: bool):
        self.runner_id = runner_id
        self.limit = limit
        self.claim_id = claim_id
        self.repeatable = repeatable


class Finish:
    """One caller's finish of a rollout: its terminal status, error and output (as JSON text),
    and the attempt it ends (None: whichever is running)."""

    __slots__ = ("attempt", "error", "output", "rollout_id", "status")

    def __init__(
        self, rollout_id: str, status: RolloutStatus, error: str | None, output: str, attempt: int | None = None
    ):
        self.rollout_id = rollout_id
        self.status = status
        self.error = error
        self.output = output
        self.attempt = attempt


def _chunks(items: list[int], size: int) -> list[list[int]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class RolloutQueue:
    """The claim and finish statements of one store, written once for its SQL dialect.

    ``sql`` turns a statement written with ``?`` into the dialect's placeholders.
    """

    def __init__(
        self,
        sql: Callable[[str], str],
        columns: str,
        *,
        skip_locked: str,
        for_update: str,
    ):
        self._sql = sql
        self._columns = columns
        self._skip_locked = skip_locked
        self._for_update = for_update
        self._merged: dict[tuple[str, int], str] = {}
        self.claim_sql = sql(
            f"""UPDATE rollouts SET status = ?, attempt = attempt + 1, runner_id = ?, claim_id = ?,
                started_at = ?, heartbeat_at = ?, ended_at = NULL, error = NULL
            WHERE rollout_id IN (
                SELECT rollout_id FROM rollouts WHERE status = ? ORDER BY pk LIMIT ? {skip_locked})
            RETURNING {columns}"""
        )
        self.claimed_again_sql = sql(f"SELECT {columns} FROM rollouts WHERE claim_id = ? AND status = ?")
        self.finish_sql: dict[tuple[bool, bool], str] = {}
        for retryable in (False, True):
            if retryable:  # the retry policy, in the statement: attempts left put the rollout back in the queue
                new_status = f"CASE WHEN attempt < max_attempts THEN '{_QUEUED}' ELSE ? END"
                ended = "CASE WHEN attempt < max_attempts THEN NULL ELSE ? END"
            else:
                new_status = ended = "?"
            for named in (False, True):  # the caller named the attempt it ends
                self.finish_sql[retryable, named] = sql(
                    f"""UPDATE rollouts SET status = {new_status}, ended_at = {ended}, error = ?, output = ?,
                    claim_id = NULL
                    WHERE rollout_id = ? AND status = ?{" AND attempt = ?" if named else ""} RETURNING {columns}"""
                )

    # -- claims --------------------------------------------------------------------
    def claim(self, cur, claim: Claim, t: float) -> list[tuple]:
        """Run one claim alone; the rows of the rollouts it holds."""
        if claim.repeatable:
            cur.execute(self.claimed_again_sql, (claim.claim_id, _RUNNING))
            rows = cur.fetchall()
            if rows:
                return rows
        return self._claim_fresh(cur, claim, t)

    def _claim_fresh(self, cur, claim: Claim, t: float) -> list[tuple]:
        cur.execute(self.claim_sql, (_RUNNING, claim.runner_id, claim.claim_id, t, t, _QUEUED, claim.limit))
        return cur.fetchall()

    def claim_all(self, cur, claims: Sequence[Claim], t: float) -> list[list[tuple] | None]:
        """Run several claims together; each one's rows, or None for a claim to run alone
        (a second claim with the same id in the group, which must see the first one's rollouts)."""
        results: list[list[tuple] | None] = [None] * len(claims)
        first: dict[str, int] = {}
        for i, claim in enumerate(claims):
            first.setdefault(claim.claim_id, i)
        unique = sorted(first.values())
        again = [claims[i].claim_id for i in unique if claims[i].repeatable]
        held: dict[str, list[tuple]] = {}
        for part in _chunks(again, MERGE_MAX * 8):
            marks = ", ".join("?" for _ in part)
            cur.execute(
                self._sql(f"SELECT {self._columns} FROM rollouts WHERE status = ? AND claim_id IN ({marks})"),
                [_RUNNING, *part],
            )
            for row in cur.fetchall():
                held.setdefault(row[_CLAIM_ID], []).append(row)
        fresh = []
        for i in unique:
            rows = held.get(claims[i].claim_id)
            if rows:
                results[i] = rows
            else:
                fresh.append(i)
        for part in _chunks(fresh, MERGE_MAX):
            if len(part) == 1:
                results[part[0]] = self._claim_fresh(cur, claims[part[0]], t)  # held ones were looked up above
                continue
            values, last = [], 0
            for i in part:
                claim = claims[i]
                values += [last + 1, last + claim.limit, claim.runner_id, claim.claim_id]
                last += claim.limit
            cur.execute(self._merged_claim(len(part)), [t, t, last, *values])
            by_claim: dict[str, list[tuple]] = {}
            for row in cur.fetchall():
                by_claim.setdefault(row[_CLAIM_ID], []).append(row)
            for i in part:
                results[i] = by_claim.get(claims[i].claim_id, [])
        return results

    def _merged_claim(self, n: int) -> str:
        text = self._merged.get(("claim", n))
        if text is None:
            values = ", ".join("(CAST(? AS BIGINT), CAST(? AS BIGINT), ?, ?)" for _ in range(n))
            # The queue's first rollouts, numbered in order; claim k takes numbers column1..column2.
            text = self._merged["claim", n] = self._sql(
                f"""UPDATE rollouts SET status = '{_RUNNING}', attempt = attempt + 1, runner_id = w.column3,
                    claim_id = w.column4, started_at = ?, heartbeat_at = ?, ended_at = NULL, error = NULL
                FROM (SELECT q.pk AS queued_pk, row_number() OVER (ORDER BY q.pk) AS place FROM (
                        SELECT pk FROM rollouts WHERE status = '{_QUEUED}' ORDER BY pk LIMIT ? {self._skip_locked}) AS q
                    ) AS p
                JOIN (VALUES {values}) AS w ON p.place BETWEEN w.column1 AND w.column2
                WHERE rollouts.pk = p.queued_pk
                RETURNING {self._columns}"""
            )
        return text

    # -- finishes ------------------------------------------------------------------
    def finish(self, cur, finish: Finish, t: float) -> tuple:
        """Run one finish alone; the rollout's row afterwards."""
        status, error, rollout_id, attempt = finish.status, finish.error, finish.rollout_id, finish.attempt
        # The usual case, a running rollout, in one statement that returns the new row.
        params = (status.value, t, error, finish.output, rollout_id, _RUNNING)
        cur.execute(
            self.finish_sql[status in _RETRYABLE, attempt is not None],
            params if attempt is None else (*params, attempt),
        )
        row = cur.fetchone()
        if row is not None:
            self._end_attempts(cur, [(row, status.value, error)], t)
            return row
        cur.execute(
            self._sql(f"SELECT {self._columns} FROM rollouts WHERE rollout_id = ?{self._for_update}"), (rollout_id,)
        )
        row = cur.fetchone()
        if row is None:
            raise NotFound("rollout", rollout_id)
        current = RolloutStatus(row[_STATUS])
        if attempt is not None and (attempt != row[_ATTEMPT] or current != RolloutStatus.RUNNING):
            return self._attempt_over(cur, finish, row)
        if current == status:
            return row  # a retried finish
        # A retried finish of an attempt the retry policy already put back in the
        # queue (the first call's reply was lost): the attempt record says so.
        if (
            current == RolloutStatus.QUEUED
            and row[_ATTEMPT] > 0
            and self._ended_as(cur, rollout_id, row[_ATTEMPT]) == status.value
        ):
            return row
        if status not in ALLOWED_TRANSITIONS[current]:
            raise InvalidTransition(f"rollout {rollout_id}: cannot go from {current.value!r} to {status.value!r}")
        if current == RolloutStatus.QUEUED:  # cancelled before a runner took it: no attempt is running
            cur.execute(
                self._sql(
                    "UPDATE rollouts SET status = ?, ended_at = ?, error = ?, output = ?, claim_id = NULL"
                    " WHERE rollout_id = ?"
                ),
                (status.value, t, error, finish.output, rollout_id),
            )
        else:
            self.end_attempt(cur, row, status, error, finish.output, t)
        cur.execute(self._sql(f"SELECT {self._columns} FROM rollouts WHERE rollout_id = ?"), (rollout_id,))
        return cur.fetchone()

    def _attempt_over(self, cur, finish: Finish, row: tuple) -> tuple:
        """A finish naming an attempt that is no longer running: a repeat of the status
        it ended with is a no-op; anything else arrives too late."""
        ended = self._ended_as(cur, finish.rollout_id, finish.attempt)
        if ended == finish.status.value:
            return row
        how = f"ended {ended!r}" if ended is not None else "is not running"
        raise InvalidTransition(
            f"rollout {finish.rollout_id}: attempt {finish.attempt} {how}; the rollout is "
            f"{row[_STATUS]!r} on attempt {row[_ATTEMPT]}, so this {finish.status.value!r} changes nothing"
        )

    def _ended_as(self, cur, rollout_id: str, attempt: int) -> str | None:
        """The status an ended attempt recorded, or None if it has not ended."""
        cur.execute(
            self._sql("SELECT status FROM attempts WHERE rollout_id = ? AND attempt = ?"), (rollout_id, attempt)
        )
        ended = cur.fetchone()
        return None if ended is None else ended[0]

    def finish_all(self, cur, finishes: Sequence[Finish], t: float) -> list[tuple | None]:
        """Finish several running rollouts together; each one's row afterwards, or None for a
        finish to run alone (its rollout was not running, or another finish in the group names it)."""
        results: list[tuple | None] = [None] * len(finishes)
        first: dict[str, int] = {}
        for i, finish in enumerate(finishes):
            first.setdefault(finish.rollout_id, i)
        for part in _chunks(sorted(first.values()), MERGE_MAX):
            if len(part) == 1:
                continue
            values: list[Any] = []
            for i in part:
                f = finishes[i]
                values += [f.rollout_id, int(f.status in _RETRYABLE), f.status.value, f.error, f.output, f.attempt]
            cur.execute(self._merged_finish(len(part)), [t, *values])
            rows = {row[_ID]: row for row in cur.fetchall()}
            ended = []
            for i in part:
                f = finishes[i]
                row = results[i] = rows.get(f.rollout_id)
                if row is not None:
                    ended.append((row, f.status.value, f.error))
            if ended:
                self._end_attempts(cur, ended, t)
        return results

    def _merged_finish(self, n: int) -> str:
        text = self._merged.get(("finish", n))
        if text is None:
            values = ", ".join("(?, CAST(? AS BIGINT), ?, ?, ?, CAST(? AS BIGINT))" for _ in range(n))
            retry = "w.column2 = 1 AND attempt < max_attempts"  # the retry policy, as in finish_sql
            text = self._merged["finish", n] = self._sql(
                f"""UPDATE rollouts SET status = CASE WHEN {retry} THEN '{_QUEUED}' ELSE w.column3 END,
                    ended_at = CASE WHEN {retry} THEN NULL ELSE ? END,
                    error = w.column4, output = w.column5, claim_id = NULL
                FROM (VALUES {values}) AS w
                WHERE rollouts.rollout_id = w.column1 AND rollouts.status = '{_RUNNING}'
                    AND (w.column6 IS NULL OR rollouts.attempt = w.column6)
                RETURNING {self._columns}"""
            )
        return text

    def _end_attempts(self, cur, ended: list[tuple[tuple, str, str | None]], t: float) -> None:
        """Record attempts that end now: ``(rollout row, status, error)`` each, the row as it was
        while the attempt ran (its number, runner, start time and last heartbeat)."""
        values: list[Any] = []
        for row, status, error in ended:
            values += [row[_ID], row[_ATTEMPT], row[_RUNNER_ID], status, row[_STARTED_AT], t, error, row[_HEARTBEAT_AT]]
        n = len(ended)
        text = self._merged.get(("attempt_end", n))
        if text is None:
            marks = ", ".join("(?, ?, ?, ?, ?, ?, ?, ?)" for _ in range(n))
            # A database written by an older agl holds running attempts too: those are updated.
            text = self._merged["attempt_end", n] = self._sql(
                f"""INSERT INTO attempts
                (rollout_id, attempt, runner_id, status, started_at, ended_at, error, heartbeat_at)
                VALUES {marks} ON CONFLICT (rollout_id, attempt) DO UPDATE SET
                status = excluded.status, ended_at = excluded.ended_at, error = excluded.error,
                heartbeat_at = excluded.heartbeat_at"""
            )
        cur.execute(text, values)

    def end_attempt(
        self, cur, row: Sequence[Any], status: RolloutStatus, error: str | None, output: str, t: float
    ) -> None:
        """End the running attempt of ``row``'s rollout: requeued if the retry policy allows, else ``status``."""
        rollout_id, attempt, max_attempts = row[_ID], row[_ATTEMPT], row[_MAX_ATTEMPTS]
        retry = status in _RETRYABLE and attempt < max_attempts
        new_status = RolloutStatus.QUEUED if retry else status
        cur.execute(
            self._sql(
                "UPDATE rollouts SET status = ?, ended_at = ?, error = ?, output = ?, claim_id = NULL"
                " WHERE rollout_id = ?"
            ),
            (new_status.value, None if retry else t, error, output, rollout_id),
        )
        self._end_attempts(cur, [(row, status.value, error)], t)
