"""The reward plugin, registered the way a user registers one (see train.py)."""

from __future__ import annotations

import agl


@agl.hookimpl
def agl_reward(rollout, spans, llm_calls, rewards):
    """1 when the answer is the first digit of the task, else 0."""
    answer = (rollout.output or "").strip()
    return 1.0 if answer == rollout.task.input["answer"] else 0.0
