"""verl's V1 task runner with agl's per-rollout advantages (:mod:`agl_verl.advantages`).

verl's ``run_ppo(config, task_runner_class)`` starts the task runner as a Ray actor and runs
its ``run(config)``, where verl's trainer lives. :class:`AglTaskRunner` is verl's own
``TaskRunnerV1`` (its plain class, unchanged) that first installs
:func:`agl_verl.advantages.rollout_advantages` in that process.
"""

from __future__ import annotations

import ray
from omegaconf import DictConfig


def _verl_task_runner() -> type:
    """The class ``verl.trainer.main_ppo.TaskRunnerV1`` wraps as a Ray actor."""
    from verl.trainer.main_ppo import TaskRunnerV1

    return TaskRunnerV1.__ray_metadata__.modified_class


@ray.remote
class AglTaskRunner:
    """Runs verl's ``TaskRunnerV1.run`` after installing agl's advantage step."""

    def run(self, config: DictConfig) -> None:
        from agl_verl.advantages import install

        install()
        _verl_task_runner()().run(config)
