"""Training on recorded rollouts: what agents did under ``agl run``, in production, in other runs.

``agl train --from-store`` (the config's ``from_store`` section) does not generate rollouts:
each step takes the next ``rollouts_per_step`` ended rollouts the filter chooses (their modes,
a time window, their tasks, rewarded only), oldest first, leaving out those the run trained on
already. The trainer marks them trained in its state file in the same atomic write that
completes the step, so across a SIGKILL and a restart no rollout is trained twice and none is
skipped: the interrupted step chooses the same ones again.

Groups: rollouts of one task in one step form a GRPO group, as generated ones do. Recorded
traffic mostly has one rollout per task; those singletons share one group for the step
(:mod:`agl_trainer.baselines`), a batch-mean baseline.
"""

from __future__ import annotations

import time

from agl.schema import Rollout, RolloutStatus
from agl.store.base import Store
from agl_trainer.config import FromStoreConfig

_ENDED = [RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.TIMED_OUT]


class RecordedRollouts:
    """Chooses each step's recorded rollouts from a store."""

    def __init__(self, store: Store, config: FromStoreConfig, *, rewards_from_plugins: bool = False):
        self.store = store
        self.config = config
        self.rewards_from_plugins = rewards_from_plugins
        """Whether a reward plugin answers for every rollout (then ``rewarded_only`` keeps all)."""

    def candidates(self, trained: set[str]) -> list[Rollout]:
        """Every rollout the filter chooses that the run has not trained on, oldest first."""
        cfg = self.config
        modes = set(cfg.modes)
        tasks = set(cfg.task_ids) if cfg.task_ids is not None else None
        chosen = [
            r
            for r in self.store.query_rollouts(status=_ENDED, since=cfg.since, until=cfg.until)
            if r.mode in modes and r.rollout_id not in trained and (tasks is None or r.task_id in tasks)
        ]
        if cfg.rewarded_only and not self.rewards_from_plugins and chosen:
            rewarded = self._rewarded([r.rollout_id for r in chosen])
            chosen = [r for r in chosen if r.rollout_id in rewarded]
        return chosen

    def next_batch(self, trained: set[str]) -> list[Rollout]:
        """The step's rollouts: the oldest ``rollouts_per_step`` candidates, waiting up to ``wait_s`` for one."""
        deadline = time.monotonic() + self.config.wait_s
        while True:
            chosen = self.candidates(trained)[: self.config.rollouts_per_step]
            if chosen or time.monotonic() >= deadline:
                return chosen
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    def _rewarded(self, rollout_ids: list[str]) -> set[str]:
        """The rollouts with a final reward (``reward``) of a source :attr:`FromStoreConfig.graded_by` names."""
        sources = self.config.graded_by
        return {
            w.rollout_id
            for w in self.store.query_rewards(rollout_ids=rollout_ids)
            if w.name == "reward" and (sources is None or w.source in sources)
        }
