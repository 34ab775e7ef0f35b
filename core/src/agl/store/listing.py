"""What the dashboard reads of a store: pages of rollouts, sorted and filtered; runs; span counts.

The query and result types of :meth:`agl.store.base.Store.list_rollouts`, :meth:`~agl.store.base.Store.runs`
and :meth:`~agl.store.base.Store.latest_step_records`, and their default implementations
(:class:`ListingReads`, which :class:`~agl.store.base.Store` inherits) through the store's public
queries, which read every matching rollout (a SQL store answers in one indexed
statement instead: :mod:`agl.store.sql.dashboard`).

A rollout's reward is its final reward: its returned ``reward`` (source ``return``) if it has one,
else its last ``reward`` (the precedence of :func:`agl_trainer.transitions.rewards.final_reward`,
reward plugins aside); its agent is the first agent name its spans carry.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from agl.schema import Reward, Rollout

ROLLOUT_SORTS = (
    "created",
    "rollout",
    "task",
    "status",
    "mode",
    "step",
    "model",
    "attempt",
    "duration",
    "reward",
    "agent",
    "error",
)
"""What :class:`RolloutListQuery` can sort by (``created``: the order rollouts were enqueued in)."""


@dataclass(frozen=True)
class RolloutListQuery:
    """One page of rollouts: each filter None (or empty) matches every rollout."""

    task: str | None = None
    status: tuple[str, ...] = ()
    """Any of these statuses."""
    mode: str | None = None
    agent: str | None = None
    """Rollouts with a span of this agent."""
    model: str | None = None
    step: int | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    duration_min: float | None = None
    duration_max: float | None = None
    error: str | None = None
    """Text the error contains (``%`` and ``_`` ignored); ``*`` for any error."""
    sort: str = "created"
    """One of :data:`ROLLOUT_SORTS`; ties go by creation, in the same direction."""
    desc: bool = True
    offset: int = 0
    limit: int = 50

    def __post_init__(self) -> None:
        if self.sort not in ROLLOUT_SORTS:
            raise ValueError(f"sort: cannot sort by {self.sort!r} (columns: {', '.join(ROLLOUT_SORTS)})")
        if self.offset < 0:
            raise ValueError(f"offset: must be at least 0, got {self.offset}")
        if self.limit < 1:
            raise ValueError(f"limit: must be at least 1, got {self.limit}")


@dataclass
class RolloutRow:
    """One line of a rollout list."""

    rollout_id: str
    task_id: str
    status: str
    mode: str
    step: int | None
    model_version: str | None
    attempt: int
    created_at: float
    started_at: float | None
    ended_at: float | None
    error: str | None
    reward: float | None
    agent: str | None

    @property
    def duration_s(self) -> float | None:
        """Ended minus started, None while either is missing."""
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at


@dataclass
class RolloutPage:
    """A page of rollouts and how many match the query in all."""

    rows: list[RolloutRow]
    total: int


@dataclass(frozen=True)
class RunSummary:
    """A run with step records: how many, and when the last was stored (None where the store does not say)."""

    run_id: str
    records: int
    last_at: float | None


def final_reward(rewards: Iterable[Reward]) -> float | None:
    """The final reward of a rollout's rewards (in the order stored): the last returned ``reward``,
    else the last ``reward``; None without one."""
    returned = last = None
    for r in rewards:
        if r.name == "reward":
            last = r.value
            if r.source == "return":
                returned = r.value
    return returned if returned is not None else last


def _kept(r: Rollout, q: RolloutListQuery) -> bool:
    """Whether a rollout passes the query's filters on its own fields."""
    if q.status and r.status.value not in q.status:
        return False
    if (q.mode is not None and r.mode != q.mode) or (q.model is not None and r.model_version != q.model):
        return False
    if q.error == "*":
        return r.error is not None
    if q.error is not None:
        needle = q.error.replace("%", "").replace("_", "").lower()
        return r.error is not None and needle in r.error.lower()
    return True


def _in_range(value: float | None, low: float | None, high: float | None) -> bool:
    if low is None and high is None:
        return True
    return value is not None and (low is None or value >= low) and (high is None or value <= high)


def _row(r: Rollout, reward: float | None, agent: str | None) -> RolloutRow:
    return RolloutRow(
        r.rollout_id,
        r.task_id,
        r.status.value,
        r.mode,
        r.step,
        r.model_version,
        r.attempt,
        r.created_at,
        r.started_at,
        r.ended_at,
        r.error,
        reward,
        agent,
    )


def _sort_key(value: Any) -> tuple[bool, Any]:
    """A value to sort by, a missing one before any other (as SQLite orders NULL)."""
    return (value is not None, value)


_SORT_FIELDS = {
    "created": lambda row: None,  # creation order: the tie-break alone
    "rollout": lambda row: row.rollout_id,
    "task": lambda row: row.task_id,
    "status": lambda row: row.status,
    "mode": lambda row: row.mode,
    "step": lambda row: row.step,
    "model": lambda row: row.model_version,
    "attempt": lambda row: row.attempt,
    "duration": lambda row: row.duration_s,
    "reward": lambda row: row.reward,
    "agent": lambda row: row.agent,
    "error": lambda row: row.error,
}


class ListingReads:
    """The dashboard's reads of :class:`~agl.store.base.Store`, by default through its queries (a
    mixin of the interface: ``self`` is the store)."""

    def list_rollouts(self, query: RolloutListQuery) -> RolloutPage:
        """One page of rollouts (:class:`RolloutListQuery`) with their final reward and first agent, and
        how many match in all. The default reads every matching rollout, its rewards and its spans
        through the queries; a SQL store reads one page in one statement."""
        rollouts = [r for r in self.query_rollouts(task_id=query.task, step=query.step) if _kept(r, query)]
        ids = [r.rollout_id for r in rollouts]
        rewards: dict[str, list[Reward]] = {}
        for w in self.query_rewards(rollout_ids=ids):
            rewards.setdefault(w.rollout_id or "", []).append(w)
        first_agent: dict[str, str] = {}
        agents: dict[str, set[str]] = {}
        for s in self.query_spans(rollout_ids=ids):
            name = s.attributes.get("gen_ai.agent.name")
            if name is not None and s.rollout_id is not None:
                text = name if isinstance(name, str) else str(name)
                first_agent.setdefault(s.rollout_id, text)
                agents.setdefault(s.rollout_id, set()).add(text)
        rows = [_row(r, final_reward(rewards.get(r.rollout_id, ())), first_agent.get(r.rollout_id)) for r in rollouts]
        rows = [
            (i, row)
            for i, row in enumerate(rows)
            if _in_range(row.reward, query.reward_min, query.reward_max)
            and _in_range(row.duration_s, query.duration_min, query.duration_max)
            and (query.agent is None or query.agent in agents.get(row.rollout_id, ()))
        ]
        rows.sort(key=lambda item: (_sort_key(_SORT_FIELDS[query.sort](item[1])), item[0]), reverse=query.desc)
        page = [row for _, row in rows[query.offset : query.offset + query.limit]]
        return RolloutPage(page, len(rows))

    def runs(self) -> list[RunSummary]:
        """Every run with step records, newest first: how many records each has and when the last came.
        The default orders runs by their last record in ``step_records`` (which carry no time:
        ``last_at`` is None)."""
        counts: dict[str, int] = {}
        last: dict[str, int] = {}
        for i, record in enumerate(self.step_records()):
            run_id = record["run_id"]
            counts[run_id] = counts.get(run_id, 0) + 1
            last[run_id] = i
        order = sorted(counts, key=lambda run_id: last[run_id], reverse=True)
        return [RunSummary(run_id, counts[run_id], None) for run_id in order]

    def latest_step_records(self, kind: str) -> dict[str, dict[str, Any]]:
        """Each run's last stored step record of this ``kind`` (as ``step_records`` gives it), by run id."""
        return {r["run_id"]: r for r in self.step_records() if r.get("kind", "train") == kind}
