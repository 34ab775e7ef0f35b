"""The reward plugin: the number after ``ANSWER:`` in the agent's final reply, against the exact answer.

1.0 when the stated number is within :data:`TOLERANCE` of the answer, else 0.0. The
answers are integers (divisions in the problems are exact), so the tolerance only
forgives how a number is written (``27838.0``, ``27,838``) and float noise in a
calculator's result (``27837.999999999996``); an answer off by one is wrong. A missing marker, no number, a reply that
is not text or an output of the wrong shape all score 0; nothing here raises into the
rollout.

:class:`OperandCredit` is the same reward with partial credit for a wrong answer (the arm
``--operand-credit W``): ``W`` times how well the numbers of the agent's calculator expression
match the problem's (their F1, as multisets). A model that writes three-number expressions
for every problem earns nothing on a four-number one, so a group of such answers carries no
signal; with the credit, the answers that use more of the problem's numbers rank higher.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter

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


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def numbers_in(expression: object) -> Counter[str]:
    """The numbers written in ``expression`` (a multiset of their texts); none for what is not a string."""
    return Counter(_NUMBER.findall(expression)) if isinstance(expression, str) else Counter()


def operand_f1(expression: object, target: object) -> float:
    """The F1 of ``expression``'s numbers against ``target``'s, as multisets (0.0 when either has none)."""
    written, wanted = numbers_in(expression), numbers_in(target)
    matched = sum((written & wanted).values())
    if not matched:
        return 0.0
    precision, recall = matched / sum(written.values()), matched / sum(wanted.values())
    return 2 * precision * recall / (precision + recall)


def called_expression(output: object) -> str | None:
    """The ``expression`` of the agent's first calculator call in its output, or None."""
    calls = output.get("tool_calls") if isinstance(output, dict) else None
    if not calls or not isinstance(calls[0], dict):
        return None
    try:
        arguments = json.loads(calls[0].get("arguments") or "")
    except (TypeError, ValueError):
        return None
    expression = arguments.get("expression") if isinstance(arguments, dict) else None
    return expression if isinstance(expression, str) else None


class OperandCredit:
    """The reward plugin with partial credit: 1.0 for a right answer, else ``weight`` times the operand F1.

    ``weight`` is below 1, so a wrong answer never reaches a success (the trainer's
    ``success_threshold``, 1.0) and success figures stay the numeric match's.
    """

    def __init__(self, weight: float):
        if isinstance(weight, bool) or not 0.0 < weight < 1.0:
            raise ValueError(f"operand-credit: {weight!r} must be above 0 and below 1 (a wrong answer scores below 1)")
        self.weight = weight

    @agl.hookimpl
    def agl_reward(self, rollout):
        """Numeric match, or for a wrong answer ``weight`` times the F1 of the expression's numbers."""
        task = rollout.task.input if isinstance(rollout.task.input, dict) else {}
        right = numeric_match(final_reply(rollout.output), task.get("answer"))
        if right:
            return right
        return self.weight * operand_f1(called_expression(rollout.output), task.get("expression"))
