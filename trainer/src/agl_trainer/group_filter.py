"""Dynamic sampling: a step trains only on groups with a reward signal (verl's DAPO ``filter_groups``).

A group is one task's ``n_rollouts`` rollouts in one generation batch of a step. GRPO-like
estimators give every rollout of a group whose rewards are all the same an advantage of 0, so
such a group spends its rollouts and teaches nothing. With ``filter_groups.enable`` the trainer
runs a step as verl's DAPO recipe does:

1. run a generation batch: the next ``batch_size`` tasks of the seeded shuffle, ``n_rollouts`` each;
2. keep the groups whose metric is not the same for all their rollouts (verl: ``std > 0``);
3. while fewer than ``batch_size`` groups are kept, run another batch of new tasks, at most
   ``max_gen_batches`` in all (0: no limit; past it the step stops with :class:`TooFewGroups`,
   as verl raises);
4. train on the first ``batch_size`` kept groups; the rest are counted (``groups_surplus``).

The metric (``reward``) is each rollout's final reward as its transitions carry it; a rollout
that made no transition takes no part (it adds nothing to the group the estimator sees), so a
group with fewer than two rollouts with transitions has no signal and is dropped. verl also
keeps a group of one response (``rollout.n`` 1); agl refuses ``filter_groups`` with
``n_rollouts`` 1 instead (:class:`~agl_trainer.config.FilterGroupsConfig`), and with several
trained policies: a group kept for its rewards' spread may carry none of it in one policy's own
calls. A kept group of a task already kept in the step (a small dataset, its shuffle wrapping
around) is not trained either (``groups_duplicate``): the backends group transitions by task,
and the two would merge.
Dropped groups' rollouts stay in the store, untrained.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agl.schema import Transition


class TooFewGroups(RuntimeError):
    """``max_gen_batches`` generation batches kept fewer than ``batch_size`` groups with a signal."""


@dataclass(frozen=True)
class Group:
    """One task's rollouts in one generation batch of a step."""

    gen: int
    """The generation batch (0 the step's first)."""
    task_id: str
    rollout_ids: tuple[str, ...]


def has_signal(values: Sequence[float]) -> bool:
    """verl's test, ``std(values) > 0``, computed exactly: two or more values, not all the same."""
    return len(values) > 1 and len(set(values)) > 1


def group_metric(group: Group, finals: Mapping[str, float], with_transitions: set[str]) -> list[float]:
    """The final rewards of the group's rollouts that made at least one transition."""
    return [finals[r] for r in group.rollout_ids if r in with_transitions and r in finals]


@dataclass
class GroupFilter:
    """A step's groups, generation batch by generation batch, until ``wanted`` with a signal are kept."""

    wanted: int
    """How many groups the step trains on (``batch_size``)."""
    kept: list[Group] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    """The kept groups' transitions, in the order their groups were kept."""
    dropped: int = 0
    surplus: int = 0
    duplicate: int = 0
    gen_batches: int = 0

    @property
    def short(self) -> bool:
        """Whether fewer than ``wanted`` groups are kept so far."""
        return len(self.kept) < self.wanted

    def add(self, groups: Sequence[Group], built: Sequence[Transition], finals: Mapping[str, float]) -> None:
        """Sort one generation batch's groups (``built``: its transitions; ``finals``: final rewards by rollout)."""
        self.gen_batches += 1
        by_rollout: dict[str, list[Transition]] = {}
        for t in built:
            by_rollout.setdefault(t.rollout_id, []).append(t)
        kept_tasks = {g.task_id for g in self.kept}
        for group in groups:
            if not has_signal(group_metric(group, finals, set(by_rollout))):
                self.dropped += 1
            elif not self.short:
                self.surplus += 1
            elif group.task_id in kept_tasks:
                self.duplicate += 1
            else:
                self.kept.append(group)
                kept_tasks.add(group.task_id)
                self.transitions += [t for r in group.rollout_ids for t in by_rollout.get(r, [])]

    def metrics(self) -> dict[str, float]:
        """The step's ``filter_groups/*`` metrics."""
        return {
            "filter_groups/gen_batches": float(self.gen_batches),
            "filter_groups/groups_kept": float(len(self.kept)),
            "filter_groups/groups_dropped": float(self.dropped),
            "filter_groups/groups_surplus": float(self.surplus),
            "filter_groups/groups_duplicate": float(self.duplicate),
        }


__all__ = ["Group", "GroupFilter", "TooFewGroups", "group_metric", "has_signal"]
