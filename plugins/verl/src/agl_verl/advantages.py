"""Advantages per rollout in verl's V1 trainer, for every estimator: agl's ``broadcast`` credit.

An agl rollout reaches verl as several samples, one per LLM call (keys
``{uid}_{session}_{index}``, see :mod:`agl_verl.distributed`). verl 0.9's V1 trainer
(``compute_advantage_for_multi_trajectories``) counts a rollout once only for GRPO: it takes
each session's final output, computes GRPO over those, and gives every output of the session
its final output's advantage. For any other estimator it hands all outputs to
``compute_advantage`` as independent samples, so a rollout with more calls weighs more in its
group's baseline (RLOO over a 2-call and a 1-call rollout gives 0.5, 0.5 and -1 where the
two rollouts' own advantages are 1 and -1).

:func:`rollout_advantages` does for every estimator what verl does for GRPO: verl's own
``compute_advantage`` on one sample per rollout (its final output), then that advantage
broadcast over every output's response tokens. :func:`install` puts it where verl's trainer
looks for it; ``agl train`` does that in verl's task-runner process
(:class:`agl_verl.task_runner.AglTaskRunner`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from verl.protocol import DataProto

TRAINER_MODULE = "verl.trainer.ppo.v1.trainer_base"
"""Where verl's V1 trainer looks up ``compute_advantage_for_multi_trajectories``."""


def session_of(key: str) -> tuple[str, int]:
    """``({uid}_{session}, index)`` of a TransferQueue key ``{uid}_{session}_{index}``."""
    parts = key.rsplit("_", 2)
    if len(parts) != 3 or not parts[2].isdigit():
        raise ValueError(f"unexpected sample key {key!r}: verl writes {{uid}}_{{session}}_{{index}}")
    return f"{parts[0]}_{parts[1]}", int(parts[2])


def final_rows(batch_keys: Sequence[str]) -> tuple[list[int], list[int]]:
    """The row of each session's final output, and for every row the position of its session in that list."""
    last: dict[str, tuple[int, int]] = {}
    sessions = []
    for row, key in enumerate(batch_keys):
        session, index = session_of(key)
        sessions.append(session)
        if session not in last or last[session][0] < index:
            last[session] = (index, row)
    order = {session: i for i, session in enumerate(last)}
    return [row for _, row in last.values()], [order[s] for s in sessions]


def rollout_advantages(
    data: DataProto,
    batch_keys: Sequence[str],
    adv_estimator: Any,
    gamma: float = 1.0,
    lam: float = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> DataProto:
    """verl's ``compute_advantage`` over each rollout's final output, broadcast to all its outputs.

    Same signature as verl's ``compute_advantage_for_multi_trajectories``; the same result for
    GRPO, and the rollout-level result for every other outcome-reward estimator.
    """
    from verl.trainer.ppo.ray_trainer import compute_advantage

    finals, session_of_row = final_rows(batch_keys)
    final = compute_advantage(
        data.select_idxs(finals),
        adv_estimator=adv_estimator,
        gamma=gamma,
        lam=lam,
        num_repeat=num_repeat,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        config=config,
    )
    first_token = final.batch["response_mask"].argmax(dim=1)
    per_rollout = final.batch["advantages"][torch.arange(len(final)), first_token]
    advantages = per_rollout[session_of_row].unsqueeze(-1) * data.batch["response_mask"]
    data.batch["advantages"] = advantages
    data.batch["returns"] = advantages
    return data


def install() -> None:
    """Make verl's V1 trainer (in this process) compute advantages with :func:`rollout_advantages`."""
    import importlib

    trainer = importlib.import_module(TRAINER_MODULE)
    if not hasattr(trainer, "compute_advantage_for_multi_trajectories"):
        raise RuntimeError(f"{TRAINER_MODULE} has no compute_advantage_for_multi_trajectories: not verl 0.9's V1")
    trainer.compute_advantage_for_multi_trajectories = rollout_advantages
