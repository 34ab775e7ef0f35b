"""The data: arithmetic word problems, generated from a fixed seed, with exact answers.

Each problem is a short story in 2 to 4 operations on numbers from 3 to 4 digits (and
small multipliers and divisors), so that the answer is out of reach of mental
arithmetic for a small model but one calculator expression away::

    A shop has 4812 apples. It gives away 1397 apples. It receives 23 crates of 144
    apples each. How many apples does it have now?       -> 4812 - 1397 + 23 * 144 = 6727

Every step is a template that turns the running quantity into a new one; divisions
are chosen to be exact, so every answer is an integer. Splits are disjoint by
construction: every problem's ``(story, numbers)`` is unique across the three splits,
and ``python -m examples.calc_agent.problems`` (from the repository root) writes
``data/train.jsonl``, ``data/val.jsonl`` and ``data/test.jsonl`` again, identically.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "val", "test")
SIZES = {"train": 400, "val": 60, "test": 60}
"""Problems per split."""
SEED = 12
DATA_DIR = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class Story:
    """The things a problem counts and how it opens."""

    owner: str
    item: str
    container: str
    people: str


STORIES = (
    Story("A shop", "apples", "crates", "customers"),
    Story("A library", "books", "boxes", "readers"),
    Story("A farm", "eggs", "trays", "buyers"),
    Story("A warehouse", "bolts", "bags", "workers"),
    Story("A school", "pencils", "packs", "classes"),
    Story("A bakery", "rolls", "baskets", "cafes"),
    Story("A factory", "bottles", "cases", "trucks"),
    Story("A museum", "tickets", "bundles", "guides"),
)


@dataclass(frozen=True)
class Step:
    """One operation: its sentence, its expression fragment and its new value."""

    sentence: str
    expression: str
    """What the step appends to the expression; a leading ``)`` wraps what came before in parentheses."""
    value: int
    operations: int = 1


def _sell(rng: random.Random, story: Story, value: int) -> Step | None:
    n = rng.randint(101, max(102, value - 100)) if value > 300 else None
    if n is None:
        return None
    return Step(f"It gives away {n} {story.item}.", f" - {n}", value - n)


def _receive(rng: random.Random, story: Story, value: int) -> Step | None:
    n = rng.randint(1001, 9999)
    return Step(f"It gets {n} more {story.item}.", f" + {n}", value + n)


def _crates(rng: random.Random, story: Story, value: int) -> Step | None:
    k, size = rng.randint(12, 89), rng.randint(24, 365)
    sentence = f"It receives {k} {story.container} of {size} {story.item} each."
    return Step(sentence, f" + {k} * {size}", value + k * size, operations=2)


def _split(rng: random.Random, story: Story, value: int) -> Step | None:
    divisors = [d for d in range(3, 40) if value % d == 0 and value // d > 1]
    if not divisors:
        return None
    d = rng.choice(divisors)
    return Step(f"It splits them equally among {d} {story.people} and keeps one share.", f") / {d}", value // d)


def _scale(rng: random.Random, story: Story, value: int) -> Step | None:
    k = rng.randint(3, 29)
    return Step(f"Then the number of {story.item} is multiplied by {k}.", f") * {k}", value * k)


STEPS: tuple[Callable[[random.Random, Story, int], Step | None], ...] = (_sell, _receive, _crates, _split, _scale)
QUESTION = "How many {item} does it have now?"
MAX_OPERATIONS = 4
MAX_VALUE = 10_000_000
"""No running quantity grows past this (the calculator would not mind; the story would)."""


def make_problem(rng: random.Random) -> dict:
    """One problem: its text, its expression (as a calculator would take it) and its answer."""
    story = rng.choice(STORIES)
    value = rng.randint(1000, 9999)
    sentences = [f"{story.owner} has {value} {story.item}."]
    expression = str(value)
    n_ops = rng.randint(2, 4)
    ops = 0
    while ops < n_ops:
        step = rng.choice(STEPS)(rng, story, value)
        if step is None or step.value <= 0 or step.value > MAX_VALUE or ops + step.operations > MAX_OPERATIONS:
            continue
        if step.expression.startswith(")"):
            wrapped = f"({expression})" if " " in expression else expression
            expression = wrapped + step.expression[1:]
        else:
            expression += step.expression
        value = step.value
        sentences.append(step.sentence)
        ops += step.operations
    sentences.append(QUESTION.format(item=story.item))
    return {"question": " ".join(sentences), "expression": expression, "answer": value, "operations": ops}


def generate(seed: int = SEED, sizes: dict[str, int] | None = None) -> dict[str, list[dict]]:
    """The splits: ``{split: [{"task_id", "input": {question, expression, answer, operations}}]}``.

    One stream of problems is drawn from ``seed``; a problem whose question was drawn
    before is skipped, so no question is in two splits.
    """
    sizes = sizes or SIZES
    rng = random.Random(seed)
    seen: set[str] = set()
    out: dict[str, list[dict]] = {}
    for split in SPLITS:
        tasks: list[dict] = []
        while len(tasks) < sizes[split]:
            problem = make_problem(rng)
            if problem["question"] in seen:
                continue
            seen.add(problem["question"])
            tasks.append({"task_id": f"calc-{split}-{len(tasks):03d}", "input": problem})
        out[split] = tasks
    return out


def write_jsonl(splits: dict[str, list[dict]], out: Path) -> list[Path]:
    """Write ``<split>.jsonl`` files into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, tasks in splits.items():
        path = out / f"{split}.jsonl"
        path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
        paths.append(path)
    return paths


def of_operations(tasks: list[dict], operations: tuple[int, ...]) -> list[dict]:
    """The tasks of one of these numbers of operations, in their order."""
    unknown = set(operations) - set(range(2, MAX_OPERATIONS + 1))
    if unknown:
        raise ValueError(f"operations: {sorted(unknown)} not among 2 to {MAX_OPERATIONS}")
    return [t for t in tasks if t["input"]["operations"] in operations]


def load_split(split: str, data_dir: Path | None = None) -> list[dict]:
    """The tasks of one split from ``data_dir`` (default: this example's ``data/``)."""
    path = (data_dir or DATA_DIR) / f"{split}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    """Generate the splits and write them as JSONL."""
    parser = argparse.ArgumentParser(description="Generate the calculator word problems.")
    parser.add_argument("--out", type=Path, default=DATA_DIR)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    splits = generate(args.seed)
    # the training tasks train.py uses by default, as a file for `agl train --tasks`
    splits["train-2op"] = of_operations(splits["train"], (2,))
    for path in write_jsonl(splits, args.out):
        print(path)
    for split, tasks in splits.items():
        ops = [t["input"]["operations"] for t in tasks]
        print(f"{split}: {len(tasks)} problems, operations {dict(sorted((n, ops.count(n)) for n in set(ops)))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
