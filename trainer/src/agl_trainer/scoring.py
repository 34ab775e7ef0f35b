"""Scoring candidate resources for a backend that changes prompts instead of weights.

A :class:`Scorer` is the trainer's :attr:`agl_trainer.backend.Backend.score`: it runs the
given tasks as mode ``val`` rollouts (never trained on, sampled at ``val_temperature``, each
task with the seed the evaluation gives it) under the candidate resources, waits for them with
the trainer's own loop, and returns each rollout's final reward as an evaluation reads it (a
failed or unrewarded rollout scores 0).

The rollout ids are ``<run>-score<step>-<resources version>-<i>``: the step in progress and the
candidate's version (which names its content), so a run resumed after a crash enqueues the same
ids again (a no-op) and reads the rewards of the rollouts that ended before it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agl.schema import Task

if TYPE_CHECKING:
    from agl_trainer.trainer import Trainer


class Scorer:
    """``score(tasks, resources_version, resources) -> [final reward, ...]`` for one trainer's run."""

    def __init__(self, trainer: Trainer, state: dict[str, Any]):
        self.trainer = trainer
        self.state = state  # the trainer's own: its run id, and the step in progress (completed + 1)

    def __call__(self, tasks: list[Task], resources_version: str, resources: dict[str, Any]) -> list[float]:
        step = self.state["completed_step"] + 1
        tag = f"score{step}-{resources_version}"
        fields = {"resources": dict(resources), "resources_version": resources_version}
        rollouts = self.trainer._val_rollouts(tag, list(tasks), step, self.state, **fields)
        ended = self.trainer._run_rollouts(rollouts, f"score {resources_version}")
        finals = self.trainer._val_finals(ended)
        return [float(finals.get(r.rollout_id) or 0.0) for r in ended]


__all__ = ["Scorer"]
