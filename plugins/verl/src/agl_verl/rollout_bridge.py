"""The bridge from one verl agent-loop call to one agl rollout: enqueue it, wait for a runner to
finish it, build its transitions; and taking back what a crashed attempt left queued."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from concurrent.futures import Executor
from functools import partial
from typing import Any

from agl.schema import Rollout, RolloutStatus, Transition

TransitionBuilder = Callable[[Any, list[Rollout]], list[Transition]]


def _default_builder(transition_config: dict[str, Any]) -> TransitionBuilder:
    from agl_trainer.transitions import TransitionConfig, build_transitions

    config = TransitionConfig(**{**transition_config, "text_only": False})

    def build(store, rollouts):
        transitions, _report = build_transitions(store, rollouts, config)
        return transitions

    return build


class RolloutBridge:
    """Enqueue one agl rollout of a task, wait for a runner to finish it, return its transitions.

    Rollouts are named ``<rollout_prefix><random>``: :func:`take_back_rollouts` finds a run's
    unfinished ones by that prefix after a crash.
    """

    def __init__(
        self,
        store,
        *,
        timeout_s: float = 600.0,
        builder: TransitionBuilder | None = None,
        transition_config: dict[str, Any] | None = None,
        rollout_prefix: str = "verl-",
        executor: Executor | None = None,
    ):
        self.store = store
        self.timeout_s = timeout_s
        self.builder = builder or _default_builder(transition_config or {})
        self.rollout_prefix = rollout_prefix
        self.executor = executor
        """Where :meth:`arun` waits (None: asyncio's default executor, at most 32 threads)."""

    def run(
        self, task_id: str, *, step: int | None = None, model_version: str | None = None, mode: str = "train"
    ) -> list[Transition]:
        """Blocking: enqueue, wait, build. A rollout that did not succeed yields no transitions."""
        (rollout,) = self.store.enqueue(
            [
                Rollout(
                    rollout_id=self.rollout_prefix + uuid.uuid4().hex[:16],
                    task_id=task_id,
                    step=step,
                    model_version=model_version,
                    timeout_s=self.timeout_s,
                    mode=mode,
                )
            ]
        )
        (done,) = self.store.wait([rollout.rollout_id], timeout_s=self.timeout_s)
        if not done.status.terminal:
            self.store.cancel([done.rollout_id])
            return []
        return self.builder(self.store, [done])

    async def arun(self, task_id: str, **kwargs) -> list[Transition]:
        """:meth:`run` in a thread of :attr:`executor`, so verl's event loop keeps serving other samples."""
        if self.executor is None:
            return await asyncio.to_thread(self.run, task_id, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self.executor, partial(self.run, task_id, **kwargs))


def take_back_rollouts(store, rollout_prefix: str) -> list[str]:
    """Cancel the queued and running rollouts named ``<rollout_prefix>...``: those an earlier
    attempt of the run enqueued and that no agent loop waits for any more (it crashed).
    verl re-issues their prompts itself when it resumes. Returns the cancelled ids."""
    pending = [RolloutStatus.QUEUED, RolloutStatus.RUNNING]
    ids = [r.rollout_id for r in store.query_rollouts(status=pending) if r.rollout_id.startswith(rollout_prefix)]
    if ids:
        store.cancel(ids)
    return ids
