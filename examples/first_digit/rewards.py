"""The reward plugin, registered the way a user registers one (see train.py)."""

from __future__ import annotations

import agl


@agl.hookimpl
def agl_reward(rollout, spans, llm_calls, rewards):
    """1 when the answer begins with the task's first digit, else 0.

    The tiny preset answers one token, so there this is an exact match. SmolLM2 likes to
    talk ("The first digit of..."): it earns the reward only by leading with the digit.
    """
    answer = (rollout.output or "").strip()
    return 1.0 if answer[:1] == rollout.task.input["answer"] else 0.0
