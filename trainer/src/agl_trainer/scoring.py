"""Scoring candidate resources for a backend that changes prompts instead of weights.

A :class:`Scorer` is the trainer's :attr:`agl_trainer.backend.BackendContext.score`: it runs the
given tasks as mode ``val`` rollouts (never trained on, sampled at ``val_temperature``, each
task with the seed the evaluation gives it) under the candidate resources, waits for them with
the trainer's own loop, and returns each rollout's final reward as an evaluation reads it (a
failed or unrewarded rollout scores 0).

The rollout ids are ``<run>-score<step>-<resources version>-<i>``: the step in progress and the
candidate's version (which names its content), so a run resumed after a crash enqueues the same
ids again (a no-op) and reads the rewards of the rollouts that ended before it.
"""

from __future__ import annotations

from typing import Any, Protocol

from agl.schema import Rollout, Task


class EvaluationRuns(Protocol):
    """What a :class:`Scorer` needs of the trainer: its evaluation's rollouts, run and read."""

    def val_rollouts(
        self, tag: str, tasks: list[Task], step: int, state: dict[str, Any], **fields: Any
    ) -> list[Rollout]:
        """Mode ``val`` rollouts ``<run>-<tag>-<i>`` of ``tasks``, never trained on."""

    def run_rollouts(self, rollouts: list[Rollout], label: str) -> list[Rollout]:
        """Enqueue ``rollouts`` and wait until each has ended."""

    def val_finals(self, ended: list[Rollout]) -> dict[str, float]:
        """Each ended val rollout's final reward as an evaluation reads it."""


class Scorer:
    """``score(tasks, resources_version, resources) -> [final reward, ...]`` for one trainer's run."""

    def __init__(self, trainer: EvaluationRuns, state: dict[str, Any]):
        self.trainer = trainer
        self.state = state  # the trainer's own: its run id, and the step in progress (completed + 1)

    def __call__(self, tasks: list[Task], resources_version: str, resources: dict[str, Any]) -> list[float]:
        step = self.state["completed_step"] + 1
        tag = f"score{step}-{resources_version}"
        fields = {"resources": dict(resources), "resources_version": resources_version}
        rollouts = self.trainer.val_rollouts(tag, list(tasks), step, self.state, **fields)
        ended = self.trainer.run_rollouts(rollouts, f"score {resources_version}")
        finals = self.trainer.val_finals(ended)
        return [float(finals.get(r.rollout_id) or 0.0) for r in ended]


__all__ = ["Scorer"]
