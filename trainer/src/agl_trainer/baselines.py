"""Every group that reaches the advantage estimator has a baseline.

The transitions of one task's rollouts in a step form a group, and verl's group estimators
(GRPO, RLOO, ...) take each group's mean reward as the baseline. A group of one rollout has
none: GRPO would give it mean 0 and standard deviation 1, so its advantage would be its raw
reward. So before the update:

- recorded traffic (``from_store``), which mostly has one rollout per task, puts the step's
  singletons in one group of their own (:data:`STEP_GROUP`): their baseline is the mean of
  the step's singleton rewards;
- for a backend whose estimator takes group baselines (:attr:`Backend.group_baseline`), a
  singleton left alone (the step's only one, or any in a generated step, where the rest of its
  task's rollouts ended without a transition) is left out: with a baseline of its own reward
  its advantage would be 0.

Both are counted in the build report (``singletons_folded``, ``singletons_left_out``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from agl.schema import Transition
from agl_trainer.transitions.config import BuildReport

STEP_GROUP = "agl-step-singletons"
"""The group key of the step's recorded rollouts that are the only one of their task."""


def with_baselines(
    transitions: Sequence[Transition], report: BuildReport, *, fold: bool, leave_out: bool
) -> list[Transition]:
    """``transitions`` with their groups of one rollout folded into :data:`STEP_GROUP` (``fold``, when
    there are two or more), and those left alone left out (``leave_out``); counted in ``report``."""
    rollouts_of: dict[str, set[str]] = defaultdict(set)
    for t in transitions:
        rollouts_of[t.task_id].add(t.rollout_id)
    alone = {task for task, rollouts in rollouts_of.items() if len(rollouts) == 1}
    if fold and len(alone) >= 2:
        report.singletons_folded += len(alone)
        return [t.model_copy(update={"task_id": STEP_GROUP}) if t.task_id in alone else t for t in transitions]
    if not leave_out or not alone:
        return list(transitions)
    report.singletons_left_out += len(alone)
    return [t for t in transitions if t.task_id not in alone]
