"""The reward plugin: token F1 of the agent's final answer against the gold answer.

Answers are normalised as in SQuAD's evaluation (lower case, no punctuation, no
articles ``a``/``an``/``the``, single spaces) and compared as bags of words: F1 is
the harmonic mean of the word precision and recall, so "Taldor city" for "Taldor"
earns 0.67. Exact match (1 when the normalised strings are equal) is reported
beside it. A missing, empty or non-text answer earns 0; nothing here raises.
"""

from __future__ import annotations

import re
import string
from collections import Counter

import agl

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    """``text`` lower-cased, without punctuation or articles, with single spaces."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(predicted: object, gold: str) -> float:
    """Word-overlap F1 of ``predicted`` against ``gold`` (0.0 for a missing or non-text prediction)."""
    if not isinstance(predicted, str) or not isinstance(gold, str):
        return 0.0
    got, want = normalize(predicted).split(), normalize(gold).split()
    if not got or not want:
        return float(got == want and bool(want))
    common = sum((Counter(got) & Counter(want)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(got), common / len(want)
    return 2 * precision * recall / (precision + recall)


def exact_match(predicted: object, gold: str) -> float:
    """1.0 when the normalised answer equals the normalised gold answer, else 0.0."""
    if not isinstance(predicted, str) or not isinstance(gold, str):
        return 0.0
    return float(bool(normalize(gold)) and normalize(predicted) == normalize(gold))


def predicted_answer(output: object) -> str | None:
    """The final answer in the agent's output (a dict from agent.py; a bare string is taken as the answer)."""
    if isinstance(output, dict):
        answer = output.get("answer")
        return answer if isinstance(answer, str) else None
    return output if isinstance(output, str) else None


@agl.hookimpl
def agl_reward(rollout):
    """Token F1 of the agent's final answer against the task's gold answer."""
    task = getattr(getattr(rollout, "task", None), "input", None)
    gold = task.get("answer") if isinstance(task, dict) else None
    return token_f1(predicted_answer(getattr(rollout, "output", None)), gold)
