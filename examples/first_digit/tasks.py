"""The task: read a short list of digits and answer with the first one.

Honest for a tiny model trained from scratch: the answer is in the prompt, but a
constant or random answer is right one time in ten, so only reading the prompt
scores well.
"""

from __future__ import annotations

import random


def make_tasks(n: int, *, seed: int, length: int = 4, exclude: list[dict] = ()) -> list[dict]:
    """``n`` distinct tasks ``{"digits": "7 3 9 1", "answer": "7"}``, reproducible from ``seed``,
    none of them one of ``exclude``."""
    taken = {t["digits"] for t in exclude}
    if n > 10**length - len(taken):
        raise ValueError(f"n: only {10**length - len(taken)} distinct tasks of {length} digits are left, not {n}")
    rng = random.Random(seed)
    tasks = []
    while len(tasks) < n:
        digits = " ".join(str(rng.randrange(10)) for _ in range(length))
        if digits not in taken:
            taken.add(digits)
            tasks.append({"digits": digits, "answer": digits[0]})
    return tasks


def corpus() -> list[str]:
    """Text the tiny model's tokenizer is trained on: the prompts it will see."""
    from .agent import SYSTEM_PROMPT, USER_PROMPT

    return [SYSTEM_PROMPT, USER_PROMPT.format(digits="0 1 2 3 4 5 6 7 8 9")]
