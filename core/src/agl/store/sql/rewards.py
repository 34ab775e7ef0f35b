"""Rewards on a SQL store: their writes and queries, each rollout's final reward (the
``rollouts.reward`` column, which the dashboard sorts and filters by), and the bulk read of
them that building transitions makes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from agl.errors import IdConflict
from agl.schema import ROLLOUT_REWARD_ID, Reward
from agl.store.bulk import RewardColumns
from agl.store.sql.commit import GroupCommit
from agl.store.sql.dialect import final_reward_sql
from agl.store.sql.jobs import Insert
from agl.store.sql.rows import json_body

_REWARD_COLUMNS = ("reward_id", "rollout_id", "body")


class Rewards(GroupCommit):
    """Rewards (a mixin of :class:`~agl.store.sql.SqlStore`)."""

    def _rewards_op(self, rewards: Iterable[Reward]) -> Callable[[Any], Any]:
        rows = [(r.reward_id, r.rollout_id, json_body(r)) for r in rewards]
        for reward_id, rollout_id, _ in rows:
            mine = reward_id.startswith(f"rw-{rollout_id}-a")
            if reward_id.startswith("rw-") and not mine and ROLLOUT_REWARD_ID.fullmatch(reward_id):
                raise IdConflict("rewards.reward_id", reward_id)
        return Insert(self, "rewards", _REWARD_COLUMNS, rows)

    def add_rewards(self, rewards: Iterable[Reward]) -> None:
        self._write(self._rewards_op(rewards))

    def query_rewards(self, *, rollout_id=None, rollout_ids=None, production=False):
        where, params = ["1 = 1"], []
        self._filter_rollout(where, params, rollout_id, rollout_ids, production)
        for (body,) in self._paged("rewards", "body", where, params):
            yield Reward.model_validate_json(body)

    def _reward_rows(self, rollout_ids: Sequence[str]) -> RewardColumns:
        """The rewards of these rollouts, their fields extracted from the JSON by the database,
        grouped by rollout (see :meth:`~agl.store.sql.SqlStore.transition_rows`)."""
        f, d = self.dialect.json_field, self.dialect
        rows = self._read_in(
            f"SELECT rollout_id, reward_id, {f('body', ['name'])}, {f('body', ['value'], d.real)}, "
            f"{f('body', ['source'])}, {f('body', ['created_at'], d.real)} FROM rewards WHERE",
            "rollout_id",
            rollout_ids,
            " ORDER BY rollout_id, pk",
        )
        return RewardColumns.from_rows(rows)

    def _inserted(self, cur, table: str, rows: Sequence[tuple]) -> None:
        super()._inserted(cur, table, rows)
        if table == "rewards":
            self._update_final_rewards(cur, {row[1] for row in rows if row[1] is not None})

    def _update_final_rewards(self, cur, rollout_ids: set[str]) -> None:
        """Recompute ``rollouts.reward`` (the final reward, which the dashboard sorts and filters
        by) of rollouts that were given rewards: from the rewards table, so a retried write or a
        late reward leaves it right."""
        ids = sorted(rollout_ids)
        for i in range(0, len(ids), 500):
            part = ids[i : i + 500]
            cur.execute(
                self._sql(
                    f"UPDATE rollouts SET reward = {final_reward_sql(self.dialect)} "
                    f"WHERE rollout_id IN ({', '.join('?' for _ in part)})"
                ),
                part,
            )
