"""The ids of a run's rollouts, and which of them count after a resume.

A run's rollouts are ``<run>-s<step>-b<task>-r<k>`` (training; ``<run>-s<step>-g<n>-b<task>-r<k>``
for a step's n-th extra generation batch under ``filter_groups``) and ``<run>-<tag>-<i>``
(evaluation, scoring). A resumed run reruns its interrupted step whole under new ids,
``<run>-resume<n>-...`` for the n-th resume, so the rerun meets none of the ids the stopped
process made (:meth:`agl_trainer.trainer.Trainer.fit`). The stopped process's rollouts of that
step stay in the store, cancelled or ended, and are not trained on: for each step, the
rollouts of the latest process that ran it are the ones that count (:func:`latest_by_step`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from agl.schema import Rollout


def rollout_prefix(state: dict[str, Any]) -> str:
    """What the ids of the rollouts this process of the run makes begin with (``state``: the trainer's state)."""
    resumes = state.get("resumes", 0)
    return state["run_id"] if not resumes else f"{state['run_id']}-resume{resumes}"


def generation(rollout_id: str, run_id: str) -> int | None:
    """Which process of ``run_id`` made the rollout: 0 the first, n the n-th resume; None: not the run's."""
    if not rollout_id.startswith(run_id + "-"):
        return None
    match = re.match(r"resume(\d+)-", rollout_id[len(run_id) + 1 :])
    return int(match.group(1)) if match else 0


def latest_by_step(rollouts: Iterable[Rollout], run_id: str) -> list[Rollout]:
    """The run's rollouts that count: for each mode and step, those of the latest process that ran it."""
    runs = [(r, generation(r.rollout_id, run_id)) for r in rollouts]
    latest: dict[tuple[str, int | None], int] = {}
    for r, gen in runs:
        if gen is not None:
            key = (r.mode, r.step)
            latest[key] = max(latest.get(key, gen), gen)
    return [r for r, gen in runs if gen is not None and gen == latest[(r.mode, r.step)]]
