"""The task: read a short list of digits and answer with the first one.

Honest for a tiny model trained from scratch: the answer is in the prompt, but a
constant or random answer is right one time in ten, so only reading the prompt
scores well.
"""

from __future__ import annotations

import random


def make_tasks(n: int, *, seed: int, length: int = 4) -> list[dict]:
    """``n`` tasks ``{"digits": "7 3 9 1", "answer": "7"}``, reproducible from ``seed``."""
    rng = random.Random(seed)
    tasks = []
    for _ in range(n):
        digits = [str(rng.randrange(10)) for _ in range(length)]
        tasks.append({"digits": " ".join(digits), "answer": digits[0]})
    return tasks


def corpus() -> list[str]:
    """Text the tiny model's tokenizer is trained on: the prompts it will see."""
    from agent import SYSTEM_PROMPT, USER_PROMPT

    return [SYSTEM_PROMPT, USER_PROMPT.format(digits="0 1 2 3 4 5 6 7 8 9")]
