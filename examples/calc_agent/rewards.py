"""The reward plugin: the number after ``ANSWER:`` in the agent's final reply, against the exact answer.

1.0 when the stated number is within :data:`TOLERANCE` of the answer, else 0.0. The
answers are integers (divisions in the problems are exact), so the tolerance only
forgives how a number is written (``27838.0``, ``27,838``) and float noise in a
calculator's result (``27837.999999999996``); an answer off by one is wrong. A missing marker, no number, a reply that
is not text or an output of the wrong shape all score 0; nothing here raises into the
rollout.
"""

from __future__ import annotations

import math

import agl

from .prompts import parse_answer

TOLERANCE = 0.01
"""Absolute tolerance of a stated answer."""


def numeric_match(reply: object, answer: object) -> float:
    """1.0 when ``reply``'s ``ANSWER:`` number is within tolerance of ``answer``, else 0.0."""
    stated = parse_answer(reply)
    if stated is None or isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return 0.0
    return 1.0 if math.isclose(stated, answer, rel_tol=0.0, abs_tol=TOLERANCE) else 0.0


def final_reply(output: object) -> object:
    """The agent's final reply in its output (the agent returns a dict; a bare string is taken as the reply)."""
    if isinstance(output, dict):
        return output.get("answer")
    return output


@agl.hookimpl
def agl_reward(rollout):
    """Numeric match of the agent's stated answer against the task's answer."""
    task = rollout.task.input if isinstance(rollout.task.input, dict) else {}
    return numeric_match(final_reply(rollout.output), task.get("answer"))
