"""The algorithm-backend seam.

A backend learns from transitions. agl-verl provides ``verl`` (modes ``local``
and ``distributed``); others plug in through the ``agl_register_backends`` hook. The
trainer drives it:

1. :meth:`Backend.setup` once, with the engine whose weights it updates and a
   :class:`BackendContext`: what the run tells the backend (its policy, the workdir, the
   run's resources, a way to score candidates, the version its weights are);
2. each step, :meth:`Backend.train_step` with that step's transitions
   (credit already assigned, grouped by ``task_id``), then
   :meth:`Backend.publish` to make the new weights the engine's next version;
3. :meth:`Backend.save_checkpoint` / :meth:`Backend.load_checkpoint` for resume.

The trainer sets nothing on a backend: all it tells one comes in the context, and what
changes from step to step (:attr:`BackendContext.current_version`) is read from it when needed.

A backend may change the agent's resources (its prompts, its few-shot examples) instead of
weights, as agl-apo's ``apo`` does: :meth:`Backend.resources` names the resources the next
rollouts run with, ``needs_token_ids = False`` has the trainer hand it text-only transitions
too (calls of a hosted model), and :attr:`BackendContext.score` runs candidate resources on tasks.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agl.schema import ModelVersion, Task, Transition
from agl_trainer.engine import Engine

Score = Callable[[list[Task], str, dict[str, Any]], list[float]]
"""``score(tasks, resources_version, resources) -> [final reward, ...]``, in the order of the tasks."""


def _version_unknown() -> str | None:
    return None


@dataclass(frozen=True)
class BackendContext:
    """What the trainer tells a backend, once, at :meth:`Backend.setup`.

    A backend used outside a trainer (a script, a benchmark) gets :data:`STANDALONE`, where
    every field is empty.
    """

    policy: str | None = None
    """The engine policy the backend trains (``ModelVersion.policy`` of what it publishes) in a
    run of several policies, each with its own backend; None: the engine's default weights. A
    backend of a named policy must name its versions apart from other policies'."""

    workdir: Path | None = None
    """The run's working directory, for records of the backend's own."""

    initial_resources: tuple[str, dict[str, Any]] | None = None
    """The run's resources as configured (``TrainerConfig.resources``), version ``r0``; None: the
    run declares none."""

    score: Score | None = None
    """Runs tasks under candidate resources (mode ``val`` rollouts, not trained on) and returns each
    rollout's final reward, in the order of the tasks; None outside a trainer."""

    score_tasks: Sequence[Task] = ()
    """The tasks :attr:`score` may run: the run's val split (its train split when it has none)."""

    total_steps: int | None = None
    """The run's training steps (``TrainerConfig.steps``), for a schedule over them (a learning rate's);
    None: not known."""

    version_now: Callable[[], str | None] = _version_unknown
    """Called by :attr:`current_version`; the trainer gives one that reads the policy's version."""

    @property
    def current_version(self) -> str | None:
        """The model version of the weights the backend holds now (the trainer's record of its
        policy, changed by each publish). A transition of another version was sampled off-policy
        (its rollout ran ahead of an update, or it was recorded outside this run). None: not
        known, and every transition counts as on-policy."""
        return self.version_now()


STANDALONE = BackendContext()
"""The context of a backend outside a trainer: no policy, workdir, resources, scorer or version."""


class Backend(abc.ABC):
    """Updates the policy from transitions."""

    #: The temperature the backend takes the training rollouts to be sampled at (it scales
    #: its logits by it), or None when it assumes none. The trainer refuses a run whose
    #: ``rollout.resources["temperature"]``, what the agents are told to sample at, differs.
    sampling_temperature: float | None = None

    #: Whether the backend learns from engine token ids. True: the trainer hands it only the
    #: transitions that have them. False: every transition, text-only ones (a hosted model's
    #: calls) too, with their messages and response text filled in.
    needs_token_ids: bool = True

    #: Whether the backend's advantage estimator takes each task group's mean reward as the
    #: baseline (GRPO, RLOO, ...). True: the trainer hands it no group of one rollout, which would
    #: have none (:mod:`agl_trainer.baselines`).
    group_baseline: bool = False

    #: What the trainer told the backend at :meth:`setup` (:data:`STANDALONE` until then); a
    #: backend's :meth:`setup` keeps the context it is given here.
    context: BackendContext = STANDALONE

    @abc.abstractmethod
    def setup(self, engine: Engine | None, context: BackendContext = STANDALONE) -> None:
        """Prepare the model and optimizer; remember the engine to publish to, and keep ``context``
        as :attr:`context`."""

    @abc.abstractmethod
    def train_step(self, transitions: list[Transition], step: int) -> dict[str, float]:
        """One update from these transitions; returns metrics (loss, kl, entropy, …)."""

    @abc.abstractmethod
    def publish(self, step: int) -> ModelVersion:
        """Write the current weights where the engine can load them and have it serve them."""

    @abc.abstractmethod
    def save_checkpoint(self, directory: Path) -> None:
        """Save everything needed to resume (weights, optimizer, RNG)."""

    @abc.abstractmethod
    def load_checkpoint(self, directory: Path) -> None:
        """Restore what :meth:`save_checkpoint` saved."""

    def resources(self) -> tuple[str, dict[str, Any]] | None:
        """The version and values of the resources the next rollouts run with; None (the
        default, a backend that trains weights): the run's configured ones."""
        return None

    def close(self) -> None:
        """Release the model and any workers."""
